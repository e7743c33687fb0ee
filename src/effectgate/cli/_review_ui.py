"""Interactive review in a terminal: rich panels and approve / edit / reject prompts.

Used only when stdin is a TTY and neither ``--approve`` nor ``--decisions``
is given. Each call of a review request is shown as a panel (tool, effect
kind, operation id, short intent hash, arguments, the tool's preview with
diffs highlighted, warnings) and answered in order; ``quit`` (or Ctrl-D)
leaves the whole request pending, so the thread waits and nothing runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from effectgate.cli._render import dumps, short_hash, terminal_safe

__all__ = ["ReadLine", "TerminalReviewer", "action_panel", "read_line"]

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
}


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

    def review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Ask for a decision on every call of ``request``; ``None`` if the person quits.

        Ctrl-C (or SIGTERM) at a prompt leaves the request pending: nothing
        runs, and the command ends as any signal ends it (exit 5).
        """
        try:
            return self._review(request)
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

    def _review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        actions = list(request.get("action_requests", []))
        configs = list(request.get("review_configs", []))
        self.console.rule(f"review: {len(actions)} side-effecting call(s)")
        if request.get("error"):
            self.console.print(f"[red]previous answer refused:[/] {escape(str(request['error']))}")
        decisions: list[dict[str, Any]] = []
        for index, (action, config) in enumerate(zip(actions, configs, strict=True), start=1):
            self.console.print(action_panel(action, index, len(actions)))
            decision = self._decide(action, list(config.get("allowed_decisions", [])))
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

    def _decide(self, action: Mapping[str, Any], allowed: list[str]) -> dict[str, Any] | None:
        call_id = action["tool_call_id"]
        choice = self._choose("decision", [*allowed, "quit"])
        if choice in (None, "quit"):
            return None
        if choice == "approve":
            return {"type": "approve", "tool_call_id": call_id}
        if choice == "reject":
            reason = self._ask("reason (told to the model)", f"rejected by {self.reviewer}")
            return {"type": "reject", "tool_call_id": call_id, "message": reason}
        args = self._edit_args(dict(action.get("args", {})))
        if args is None:
            return None
        return {
            "type": "edit",
            "tool_call_id": call_id,
            "edited_action": {"name": action["name"], "args": args},
        }

    def _edit_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        text = dumps(args)  # the prefill is echoed by readline: no raw controls
        while True:
            self.console.print("[bold]edit the arguments[/] (JSON object; empty line cancels)")
            try:
                line = self.read("args> ", text)
            except EOFError:
                return None
            if not line.strip():
                return None
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                self.console.print(f"[red]not JSON:[/] {escape(str(exc))}")
                text = line
                continue
            if isinstance(value, dict):
                return value
            self.console.print("[red]the arguments must be a JSON object[/]")
            text = line

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
