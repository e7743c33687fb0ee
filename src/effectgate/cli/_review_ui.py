"""Interactive review in a terminal: rich panels and approve / edit / reject / respond prompts.

Used only when stdin is a TTY and neither ``--approve`` nor ``--decisions``
is given. A review request is shown with the model's stated reason (the text
of the AI message that proposed its calls: untrusted, escaped, cut to
``REASON_CHARS``), then each call as a panel (tool, effect kind, operation id,
short intent hash, arguments, the tool's preview with diffs highlighted,
warnings), answered in order; ``quit`` (or Ctrl-D) leaves the whole request
pending, so the thread waits and nothing runs.

``edit`` opens ``$VISUAL`` or ``$EDITOR`` on the arguments as indented JSON
(as ``git commit`` does); without either, a multi-line prompt reads them up to
a line holding only ``.`` (or end of input). The result is checked with the
tool's own schema, the normalized arguments are shown as a diff against the
shown ones with the tool's new preview, and the reviewer confirms. Invalid
JSON or a schema refusal keeps what was typed: the editor opens again on it
with the error as ``#`` comment lines on top (the prompt shows the error and
offers the text again), so nothing typed is lost.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from effectgate.answers import decision_allowed, flag_text, flags_of
from effectgate.cli._render import dumps, short_hash, terminal_safe
from effectgate.errors import ToolCallError

if TYPE_CHECKING:
    from langchain_core.messages import AnyMessage

    from effectgate.graph import Agent

__all__ = [
    "REASON_CHARS",
    "ReadLine",
    "ReviewContext",
    "TerminalReviewer",
    "action_panel",
    "read_line",
    "review_context",
    "stated_reason",
]

REASON_CHARS = 2000
"""Characters of the model's stated reason shown at a review; the rest is cut and counted."""
REASON_LINES = 30
"""Lines of the model's stated reason shown at a review."""

Check = Callable[[str, Mapping[str, Any], str | None], tuple[dict[str, Any], str]]
"""``check(tool, args, operation_id) -> (normalized args, preview)``.

Raises ``ToolCallError`` when the tool's schema refuses the arguments.
"""

ReadLine = Callable[[str, str], str]
"""``read(prompt, prefill) -> line``; raises ``EOFError`` at end of input."""

_SHORTCUTS = {
    "a": "approve",
    "e": "edit",
    "r": "reject",
    "q": "quit",
    "s": "succeeded",
    "f": "failed",
    "k": "skip",
    "y": "yes",
    "c": "cancel",
}

_COMMENT = "#"


@dataclass(frozen=True, slots=True)
class ReviewContext:
    """What the terminal shows and checks beside a review request, read from the thread.

    Attributes:
        reason: the text of the AI message that proposed the calls (untrusted;
            escaped and cut when shown); ``None`` when the thread has none.
        check: validates edited arguments with the tool's schema and renders
            its preview; ``None`` when the tools are unknown (the graph still
            validates the answer).
    """

    reason: str | None = None
    check: Check | None = None


def stated_reason(messages: list[AnyMessage], tool_call_ids: set[str]) -> str | None:
    """Return the text of the latest AI message that proposed any of ``tool_call_ids``.

    Args:
        messages: the thread's history.
        tool_call_ids: the ids of the calls under review.

    Returns:
        The message's text (may be empty: the model gave no reason), or
        ``None`` when no message proposed those calls.
    """
    for message in reversed(messages):
        calls = getattr(message, "tool_calls", None) or []
        if any(call.get("id") in tool_call_ids for call in calls):
            text = getattr(message, "text", "")
            return text if isinstance(text, str) else str(message.content)
    return None


def review_context(agent: Agent, request: Mapping[str, Any]) -> ReviewContext:
    """Build the ``ReviewContext`` of a review request from the agent's thread and tools.

    Args:
        agent: the agent the thread runs on (its history and ``ToolSpec``s).
        request: the review interrupt's value.

    Returns:
        The stated reason and a schema check for edited arguments.
    """
    ids = {str(a.get("tool_call_id")) for a in request.get("action_requests", [])}
    thread_id = request.get("thread_id")
    reason = stated_reason(agent.messages(str(thread_id)), ids) if thread_id else None
    specs = agent.parts.specs

    def check(
        tool: str, args: Mapping[str, Any], operation_id: str | None
    ) -> tuple[dict[str, Any], str]:
        spec = specs.get(tool)
        if spec is None:
            raise ToolCallError(f"tool {tool!r} is not one of this agent's tools", tool=tool)
        parsed = spec.normalize(args)
        return spec.args_dict(parsed), spec.render_preview(parsed, operation_id=operation_id)

    return ReviewContext(reason=reason, check=check)


def _reason_panel(reason: str | None) -> Panel:
    if not reason or not reason.strip():
        body = Text("(the model gave no reason with these calls)", style="dim")
    else:
        text = reason.strip()
        lines = text.splitlines()
        cut = ""
        if len(lines) > REASON_LINES:
            text = "\n".join(lines[:REASON_LINES])
        if len(text) > REASON_CHARS:
            text = text[:REASON_CHARS]
        if len(text) < len(reason.strip()):
            cut = f"\n… ({len(reason.strip()) - len(text)} more characters not shown)"
        body = Text(terminal_safe(text + cut))
    return Panel(
        body,
        title="the model's stated reason (untrusted text from the model)",
        title_align="left",
        border_style="dim",
    )


def _strip_comments(text: str) -> str:
    # A JSON string cannot hold a raw newline, so a line that starts with '#'
    # is never part of a value: it is one of our comment lines, or the user's.
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(_COMMENT))


def _args_diff(shown: Mapping[str, Any], edited: Mapping[str, Any]) -> str:
    before = json.dumps(shown, indent=2, ensure_ascii=False, sort_keys=True).splitlines()
    after = json.dumps(edited, indent=2, ensure_ascii=False, sort_keys=True).splitlines()
    return "\n".join(
        difflib.unified_diff(before, after, "shown arguments", "edited arguments", lineterm="")
    )


def editor_command() -> list[str] | None:
    """Return the reviewer's editor from ``$VISUAL`` or ``$EDITOR``, split as a shell would.

    Returns:
        The command's words, or ``None`` when neither is set (or it is blank).
    """
    for name in ("VISUAL", "EDITOR"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                words = shlex.split(value)
            except ValueError:
                return [value]
            return words or None
    return None


def read_line(prompt: str, prefill: str = "") -> str:
    """Read one line from the terminal, with ``prefill`` already typed (GNU readline).

    Args:
        prompt: plain text shown before the cursor.
        prefill: editable text placed on the line; empty for none.

    Returns:
        The line without its newline.

    Raises:
        EOFError: end of input (Ctrl-D).
    """
    try:
        import readline
    except ImportError:  # pragma: no cover - platforms without GNU readline
        return input(prompt) or prefill

    readline.set_startup_hook(lambda: readline.insert_text(prefill) if prefill else None)
    try:
        return input(prompt)
    finally:
        readline.set_startup_hook(None)


def _preview(text: str) -> RenderableType:
    # Escape before rich sees it: rich drops CR and BEL from Text, which would
    # hide them; the console escapes the rest again on output (a no-op then).
    text = terminal_safe(text)
    looks_like_diff = text.startswith(("---", "diff ")) or "\n@@ " in text
    if looks_like_diff:
        return Syntax(text, "diff", theme="ansi_dark", word_wrap=True)
    return Text(text)


_SPELLED_OUT = ("possible_duplicate_of", "unreadable_same_intent", "compacted_operation")
"""Review flags ``_warnings`` words at length itself; the rest come from ``flag_text``."""


def _warnings(action: Mapping[str, Any]) -> list[Text]:
    out: list[Text] = []
    if action.get("effect_kind") == "unsafe":
        out.append(
            Text(
                "UNSAFE: cannot be retried or looked up; if its outcome is lost, a "
                "human must reconcile it",
                style="bold red",
            )
        )
    if action.get("possible_duplicate_of"):
        compacted_dup = action.get("possible_duplicate_compacted")
        since = f" ({compacted_dup.get('message')})" if isinstance(compacted_dup, Mapping) else ""
        out.append(
            Text(
                terminal_safe(f"possible duplicate of {action['possible_duplicate_of']}, which ")
                + "already succeeded with the same arguments"
                + terminal_safe(since),
                style="bold yellow",
            )
        )
    unreadable = action.get("unreadable_same_intent")
    if isinstance(unreadable, list) and unreadable:
        rows = "; ".join(
            f"{d.get('operation_id')} (thread {d.get('thread_id')}): {d.get('reason')}"
            for d in unreadable
            if isinstance(d, Mapping)
        )
        out.append(
            Text(
                "UNREADABLE LEDGER ROW of the same intent: "
                + terminal_safe(rows)
                + "; whether this already ran cannot be checked",
                style="bold red",
            )
        )
    compacted = action.get("compacted_operation")
    if isinstance(compacted, Mapping):
        out.append(
            Text(
                "COMPACTED: "
                + terminal_safe(str(compacted.get("message")))
                + "; the ledger no longer holds its outcome, approving runs it again with "
                "the same idempotency key",
                style="bold yellow",
            )
        )
    for flag in flags_of(action):
        if flag not in _SPELLED_OUT:
            # Every other review flag (a repeat of a rejected call, a call an
            # edit replaced, any flag added later) in its one wording.
            out.append(
                Text(
                    terminal_safe(f"{flag.upper().replace('_', ' ')}: this call is ")
                    + terminal_safe(flag_text(action, flag))
                    + "; a blanket --approve never approves it, you decide",
                    style="bold yellow",
                )
            )
    conflict = action.get("conflict")
    if conflict:
        out.append(
            Text(
                terminal_safe(
                    f"CONFLICT: operation {conflict.get('operation_id')} is already bound "
                    f"to other arguments (state {conflict.get('stored_state')}): "
                    f"{json.dumps(conflict.get('stored_args'))}"
                ),
                style="bold red",
            )
        )
    return out


def action_panel(action: Mapping[str, Any], index: int, total: int) -> Panel:
    """Render one action request of a review interrupt.

    Args:
        action: an ``ActionRequest`` payload.
        index: 1-based position in the request.
        total: number of calls in the request.

    Returns:
        A panel with identity, arguments, preview and warnings.
    """
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    ttl = action.get("approval_ttl_s")
    rows = [
        ("effect kind", str(action.get("effect_kind"))),
        ("operation", str(action.get("operation_id"))),
        ("intent", short_hash(str(action.get("intent_hash", "")))),
        ("tool call", str(action.get("tool_call_id"))),
        ("approval valid", "until used" if ttl is None else f"{ttl:.0f} s"),
    ]
    for key, value in rows:
        grid.add_row(key, Text(terminal_safe(value)))
    args = Syntax(
        json.dumps(action.get("args", {}), indent=2, ensure_ascii=False),
        "json",
        theme="ansi_dark",
        word_wrap=True,
    )
    parts: list[RenderableType] = [grid, Text("arguments", style="bold"), args]
    if action.get("preview"):
        parts += [Text("preview", style="bold"), _preview(str(action["preview"]))]
    parts += _warnings(action)
    title = escape(f"[{index}/{total}] {action.get('name')}")
    return Panel(Group(*parts), title=title, title_align="left", border_style="cyan")


class TerminalReviewer:
    """Ask a person at the terminal, one call at a time.

    Args:
        console: where panels and questions go.
        reviewer: recorded on approvals.
        read: line reader (tests inject one); default ``read_line``.
    """

    interactive = True
    strict = False

    def __init__(self, console: Console, *, reviewer: str, read: ReadLine = read_line) -> None:
        self.console = console
        self.reviewer = reviewer
        self.read = read

    def review(
        self, request: Mapping[str, Any], context: ReviewContext | None = None
    ) -> dict[str, Any] | None:
        """Ask for a decision on every call of ``request``; ``None`` if the person quits.

        Args:
            request: the review interrupt's value.
            context: the model's stated reason and the tools' schema check
                (``review_context``); without it the reason is not shown and
                edited arguments are checked only as JSON objects.

        Returns:
            The answer (``decisions`` in call order, ``reviewer``), or ``None``.

        Ctrl-C (or SIGTERM) at a prompt leaves the request pending: nothing
        runs, and the command ends as any signal ends it (exit 5).
        """
        try:
            return self._review(request, context or ReviewContext())
        except KeyboardInterrupt:
            self.console.print("\n[yellow]review left pending; nothing runs[/]")
            return None

    def verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Ask for a reconciliation verdict; ``None`` if the person skips (or hits Ctrl-C)."""
        try:
            return self._verdict(request)
        except KeyboardInterrupt:
            self.console.print("\n[yellow]reconciliation left pending[/]")
            return None

    def _review(self, request: Mapping[str, Any], context: ReviewContext) -> dict[str, Any] | None:
        actions = list(request.get("action_requests", []))
        configs = list(request.get("review_configs", []))
        self.console.rule(f"review: {len(actions)} side-effecting call(s)")
        if request.get("error"):
            self.console.print(f"[red]previous answer refused:[/] {escape(str(request['error']))}")
        self.console.print(_reason_panel(context.reason))
        decisions: list[dict[str, Any]] = []
        for index, (action, config) in enumerate(zip(actions, configs, strict=True), start=1):
            self.console.print(action_panel(action, index, len(actions)))
            allowed = list(config.get("allowed_decisions", []))
            if decision_allowed("respond", allowed) and "respond" not in allowed:
                allowed.append("respond")  # HITL's respond: a reject with the person's answer
            decision = self._decide(action, allowed, context)
            if decision is None:
                self.console.print("[yellow]review left pending; nothing runs[/]")
                return None
            decisions.append(decision)
        return {"decisions": decisions, "reviewer": self.reviewer}

    def _verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        self.console.print(_reconciliation_panel(request))
        allowed = [*request.get("allowed_verdicts", ["succeeded", "failed", "retry"]), "skip"]
        choice = self._choose("verdict", allowed)
        if choice in (None, "skip"):
            return None
        if choice == "succeeded":
            reference = self._ask("reference you checked (ticket id, Message-ID...)", "")
            if not reference:
                return None
            return {
                "verdict": "succeeded",
                "reference": reference,
                "evidence": self._ask("evidence", ""),
                "reviewer": self.reviewer,
            }
        if choice == "failed":
            return {
                "verdict": "failed",
                "evidence": self._ask("evidence", ""),
                "reviewer": self.reviewer,
            }
        sure = self._ask("a retry may duplicate the effect; type 'yes' to retry", "")
        if sure.strip().lower() != "yes":
            return None
        return {"verdict": "retry", "acknowledge_duplicate_risk": True, "reviewer": self.reviewer}

    def _decide(
        self, action: Mapping[str, Any], allowed: list[str], context: ReviewContext
    ) -> dict[str, Any] | None:
        call_id = action["tool_call_id"]
        while True:
            choice = self._choose("decision", [*allowed, "quit"])
            if choice in (None, "quit"):
                return None
            if choice == "approve":
                return {"type": "approve", "tool_call_id": call_id}
            if choice == "reject":
                reason = self._ask("reason (told to the model)", f"rejected by {self.reviewer}")
                return {"type": "reject", "tool_call_id": call_id, "message": reason}
            if choice == "respond":
                answer = self._ask(
                    "your answer to the model, in the tool's place (nothing runs)", ""
                )
                if answer:
                    return {"type": "respond", "tool_call_id": call_id, "message": answer}
                self.console.print("[yellow]no answer given; choose again[/]")
                continue
            args = self._edit_args(action, context)
            if args is not None:
                return {
                    "type": "edit",
                    "tool_call_id": call_id,
                    "edited_action": {"name": action["name"], "args": args},
                }
            self.console.print("[yellow]edit cancelled; choose again[/]")

    def _edit_args(
        self, action: Mapping[str, Any], context: ReviewContext
    ) -> dict[str, Any] | None:
        """Edit, check and confirm new arguments; ``None`` if the edit is cancelled."""
        shown = dict(action.get("args", {}))
        text = dumps(shown, indent=2)
        error: str | None = None
        while True:
            typed = self._compose(text, error)
            if typed is None or not _strip_comments(typed).strip():
                return None
            text, error = _strip_comments(typed), None
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                error = f"not JSON: {exc}"
                continue
            if not isinstance(value, dict):
                error = "the arguments must be a JSON object"
                continue
            args: dict[str, Any] = value
            preview = None
            if context.check is not None:
                try:
                    args, preview = context.check(
                        str(action["name"]), args, action.get("operation_id")
                    )
                except ToolCallError as exc:
                    error = f"refused by the tool's schema: {exc}"
                    continue
            diff = _args_diff(shown, args)
            self.console.print(Text("edited arguments, against the shown ones", style="bold"))
            self.console.print(_preview(diff) if diff else Text("(no change)"))
            if preview:
                self.console.print(Text("new preview", style="bold"))
                self.console.print(_preview(preview))
            confirm = self._choose("use these arguments", ["yes", "edit", "cancel"])
            if confirm == "yes":
                return args
            if confirm in (None, "cancel"):
                return None
            text = dumps(args, indent=2)

    def _compose(self, text: str, error: str | None) -> str | None:
        """Let the person write arguments: their editor, or the multi-line prompt."""
        command = editor_command()
        if command is not None:
            if error:
                self.console.print(
                    f"[red]{escape(error)}[/] [dim](the editor opens again on your text)[/]"
                )
            written = self._in_editor(command, text, error)
            if written is not None:
                return written
            # the editor could not run: the prompt takes over, with the text kept
        if error:
            self.console.print(f"[red]{escape(error)}[/] [dim](your text is kept below)[/]")
        return self._multiline(text)

    def _in_editor(self, command: list[str], text: str, error: str | None) -> str | None:
        header = [
            "# Edit the arguments (a JSON object). Lines starting with # are ignored.",
            "# Save and quit to continue; an empty file cancels the edit.",
        ]
        if error:
            header += [f"# {line}" for line in terminal_safe(error).splitlines()]
        fd, name = tempfile.mkstemp(prefix="effectgate-args-", suffix=".json")
        path = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("\n".join([*header, text]) + "\n")
            try:
                code = subprocess.call([*command, str(path)])
            except OSError as exc:
                self.console.print(
                    f"[red]cannot run the editor {escape(shlex.join(command))}: "
                    f"{escape(exc.strerror or str(exc))}[/]; using the prompt"
                )
                return None
            written = path.read_text(encoding="utf-8", errors="replace")
        finally:
            path.unlink(missing_ok=True)
        if code != 0:
            self.console.print(f"[yellow]the editor exited with status {code}; edit cancelled[/]")
            return ""
        return written

    def _multiline(self, text: str) -> str | None:
        self.console.print(
            "[bold]edit the arguments[/] (a JSON object over one or more lines; end with a "
            "line holding only '.' or Ctrl-D; an empty entry cancels the edit)"
        )
        # JSON strings hold no raw newline, so the text on one line means the same.
        first = " ".join(line.strip() for line in text.splitlines())
        lines: list[str] = []
        prompt, prefill = "args> ", dumps(json.loads(first)) if _is_json(first) else first
        while True:
            try:
                line = self.read(prompt, prefill)
            except EOFError:
                break
            if line.strip() == ".":
                break
            lines.append(line)
            prompt, prefill = "...> ", ""
        return "\n".join(lines)

    def _choose(self, what: str, choices: list[str]) -> str | None:
        keys = "/".join(choices)
        while True:
            self.console.print(f"[bold]{what}[/] " + escape(f"[{keys}]"))
            try:
                line = self.read("> ", "").strip().lower()
            except EOFError:
                return None
            choice = _SHORTCUTS.get(line, line)
            if choice in choices:
                return choice
            self.console.print(f"[red]please answer one of: {escape(keys)}[/]")

    def _ask(self, question: str, default: str) -> str:
        shown = f" [dim](default: {escape(default)})[/]" if default else ""
        self.console.print(f"[bold]{escape(question)}[/]{shown}")
        try:
            line = self.read("> ", "")
        except EOFError:
            return default
        return line.strip() or default


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _reconciliation_panel(request: Mapping[str, Any]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for key in ("tool", "operation_id", "attempt"):
        grid.add_row(key.replace("_id", ""), Text(terminal_safe(str(request.get(key)))))
    evidence = Syntax(
        json.dumps(request.get("evidence", {}), indent=2, default=str),
        "json",
        theme="ansi_dark",
        word_wrap=True,
    )
    parts: list[RenderableType] = [grid, Text("evidence", style="bold"), evidence]
    if request.get("error"):
        refused = terminal_safe(f"previous answer refused: {request['error']}")
        parts.append(Text(refused, style="red"))
    return Panel(
        Group(*parts),
        title="outcome unknown: did it happen?",
        title_align="left",
        border_style="red",
    )
