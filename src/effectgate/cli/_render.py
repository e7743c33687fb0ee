"""Turn runs, operations and events into JSON objects and rich tables.

JSON shapes are the CLI's machine interface (``--json``): keys only get
added, never renamed. Rich output is for people and may change.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from effectgate.graph import PendingInterrupt, RunResult
    from effectgate.ledger import Event, LedgerMetrics, Operation, ThreadRecord

__all__ = [
    "STATE_STYLES",
    "SafeConsole",
    "dumps",
    "event_json",
    "events_table",
    "interrupt_json",
    "jsonable",
    "metrics_table",
    "not_taken_effect",
    "operation_json",
    "print_line",
    "print_operation",
    "operations_table",
    "print_table",
    "print_listing",
    "pending_text",
    "print_summary",
    "status_line",
    "result_json",
    "short_hash",
    "state_counts",
    "terminal_safe",
    "tool_line",
    "thread_json",
    "threads_table",
]

STATE_STYLES: Mapping[str, str] = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    "REJECTED": "magenta",
    "IN_FLIGHT": "yellow",
    "UNKNOWN": "bold yellow",
    "NEEDS_RECONCILIATION": "bold red",
    "RETRY_WAIT": "yellow",
    "APPROVED": "cyan",
    "PROPOSED": "cyan",
}
"""Rich style per operation state."""

_STATUS_TEXT: Mapping[str, str] = {
    "done": "[green]done[/]",
    "waiting_review": "[yellow]waiting for review[/]",
    "waiting_reconciliation": "[bold red]waiting for reconciliation[/]",
    "incomplete": "[yellow]incomplete (stopped early; resume to continue)[/]",
    "not_started": "[yellow]not started (resume to start it)[/]",
}


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


_UNSAFE_FORMAT = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Bidirectional marks, embeddings, overrides and isolates ("Trojan Source", CVE-2021-42574)."""


def _unsafe(char: str) -> bool:
    if char in "\n\t":
        return False
    return (
        unicodedata.category(char) in ("Cc", "Zl", "Zp")  # C0, DEL, C1, U+2028, U+2029
        or char in _UNSAFE_FORMAT
    )


_UNSAFE_CHARS = "".join(chr(c) for c in range(0x2070) if _unsafe(chr(c)))
_UNSAFE_RE = re.compile(f"[{re.escape(_UNSAFE_CHARS)}]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    r"""Make every character that could steer a terminal visible, as ``\x1b`` or ``\u2028``.

    The one escaping function of the CLI: every console of ``Output`` runs the
    text it prints through it (see ``SafeConsole``), and ``dumps`` does the same
    for the characters JSON leaves raw. Model output, tool output, file names,
    thread ids and stored errors are untrusted: an ESC sequence in a command
    could erase the line the reviewer is reading and draw a harmless one in its
    place, and OSC 52 writes the clipboard. Escaped: C0 controls but newline
    and tab (ESC, CR, backspace, BEL...), DEL, C1 controls (U+0080-U+009F, the
    8-bit CSI among them), the line and paragraph separators U+2028/U+2029,
    and bidirectional overrides and isolates.

    Args:
        text: any text.

    Returns:
        The text with those characters replaced by their escape spelling; the
        same text when there were none.
    """
    return _UNSAFE_RE.sub(_visible, text)


class SafeConsole(Console):
    """A rich ``Console`` that escapes control characters in everything it prints.

    The escaping is applied to the text segments of the final render, after
    markup and layout, so it holds for strings, ``Text``, tables, panels and
    ``Syntax`` alike, whoever built them; rich's own style and cursor
    sequences (control segments, and the styles applied afterwards) pass
    untouched. Emoji codes are off: ``prod:fire:db`` stays ``prod:fire:db``.
    """

    def __init__(self, **kwargs: Any) -> None:
        """Build the console; ``emoji`` is off unless asked for (kwargs go to ``Console``)."""
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """Escape before rich parses a string: rich would silently drop CR, BS, VT, FF, BEL."""
        return super().render_str(terminal_safe(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        safe = (
            segment if segment.control else Segment(terminal_safe(segment.text), segment.style)
            for segment in buffer
        )
        return super()._render_buffer(safe)


_LINE_CHARS = 200
_VALUE_CHARS = 48


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_line(content: str) -> str:
    """Summarise a tool message's JSON content in one readable line, for progress output.

    ``{"status": "succeeded", "attempt": 1, "result": {"path": "a.md", "bytes": 12}}``
    becomes ``succeeded, attempt 1: path=a.md bytes=12``: the status first, then
    the reference, then each result field cut to a few dozen characters, so a
    long file content or mail body does not hide what happened.

    Args:
        content: the message content (JSON from the graph, or any text).

    Returns:
        One line of at most 200 characters (not yet escaped for the terminal).
    """
    try:
        payload = json.loads(content)
    except ValueError:
        return _short(content, _LINE_CHARS)
    if not isinstance(payload, dict):
        return _short(payload, _LINE_CHARS)
    head = [str(payload.get("status", "?"))]
    if payload.get("attempt"):
        head.append(f"attempt {payload['attempt']}")
    if payload.get("reference"):
        head.append(str(payload["reference"]))
    if payload.get("reused"):
        head.append("result reused")
    result = payload.get("result")
    if isinstance(result, dict):
        detail = " ".join(f"{k}={_short(v, _VALUE_CHARS)}" for k, v in result.items())
    elif result is not None:
        detail = _short(result, _VALUE_CHARS * 2)
    else:
        detail = str(payload.get("message") or payload.get("error") or "")
    line = ", ".join(head) + (f": {detail}" if detail else "")
    return _short(line, _LINE_CHARS)


_FIELD_CHARS = 2000
"""How much of one stored field a table cell or panel row shows (a huge string is cut)."""


def field_text(
    value: Any, *, expect: type | tuple[type, ...] = str, limit: int = _FIELD_CHARS
) -> str:
    """One stored field as text for a person; a field of an unexpected shape never raises.

    A receipt's reference, a verdict's evidence or an approval's message
    stored with a bad shape (an integer, a list: written by hand or by an
    older version) is shown as ``unreadable (int: 123)`` in one line; a huge
    string is cut to ``limit`` characters.

    Args:
        value: the stored value.
        expect: the type(s) the field should have.
        limit: characters shown at most.

    Returns:
        The text; ``""`` for ``None``.
    """
    if value is None:
        return ""
    if not isinstance(value, expect):
        shown = _short(value, 80) if _jsonable_ok(value) else _short(repr(value), 80)
        return f"unreadable ({type(value).__name__}: {shown})"
    text = value if isinstance(value, str) else dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _detail_text(detail: Mapping[str, Any]) -> str:
    """An event's detail in one line; one the codec could not read says so."""
    if not detail:
        return ""
    if set(detail) == {"unreadable"}:
        return f"unreadable ({field_text(detail['unreadable'], limit=200)})"
    return field_text(dict(detail), expect=dict)


def _jsonable_ok(value: Any) -> bool:
    try:
        json.dumps(value, default=str)
    except (TypeError, ValueError):
        return False
    return True


def _plain(text: str) -> Text:
    """A ``Text`` of untrusted text, escaped first (rich would drop CR and BEL silently)."""
    return Text(terminal_safe(text))


def jsonable(value: Any) -> Any:
    """Return ``value`` as plain JSON data (datetimes as ISO 8601, enums as values)."""
    return json.loads(json.dumps(value, default=_default))


def dumps(value: Any, *, indent: int | None = None) -> str:
    r"""Serialise ``value`` as JSON, the way ``--json`` prints it (one line unless ``indent``).

    Characters that could steer a terminal or an editor's display (see
    ``terminal_safe``) are written as ``\uXXXX`` escapes: the same value, visibly.
    """
    text = json.dumps(value, default=_default, ensure_ascii=False, sort_keys=False, indent=indent)
    # JSON escapes C0 itself; these may only occur inside strings, where
    # \\uXXXX means the same character, so the object is unchanged.
    return _UNSAFE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def short_hash(intent_hash: str) -> str:
    """Return the first 12 hex digits of an intent hash (enough to tell two apart)."""
    return intent_hash[:12]


def operation_json(op: Operation) -> dict[str, Any]:
    """Describe one operation as JSON (``id, tool, state, attempt, reference`` first)."""
    receipt = op.receipt
    return {
        "id": op.operation_id,
        "tool": op.tool,
        "state": op.state.value,
        "attempt": op.attempt,
        "reference": (
            None
            if receipt is None or receipt.reference is None
            else receipt.reference
            if isinstance(receipt.reference, str)
            else field_text(receipt.reference)
        ),
        "thread_id": op.thread_id,
        "tool_call_id": op.tool_call_id,
        "intent_hash": op.intent_hash,
        "args": jsonable(op.args),
        "result": jsonable(receipt.result) if receipt is not None else None,
        "receipt_source": receipt.source if receipt is not None else None,
        "error": op.error,
        "max_attempts": op.budget.max_attempts,
        "recoveries": op.recoveries,
        "attempts_allowed": op.attempts_allowed,
        "next_attempt_at": jsonable(op.next_attempt_at),
        "created_at": op.created_at.isoformat(),
        "updated_at": op.updated_at.isoformat(),
    }


def event_json(event: Event) -> dict[str, Any]:
    """Describe one ledger event as JSON."""
    return {
        "seq": event.seq,
        "operation_id": event.operation_id,
        "kind": event.kind.value,
        "src": event.src.value if event.src is not None else None,
        "dst": event.dst.value if event.dst is not None else None,
        "attempt": event.attempt,
        "at": event.at.isoformat(),
        "detail": jsonable(event.detail),
    }


def thread_json(record: ThreadRecord, status: str | None = None) -> dict[str, Any]:
    """Describe one thread record (and its status, when known) as JSON."""
    return {
        "thread_id": record.thread_id,
        "status": status,
        "task": record.input.get("task"),
        "metadata": jsonable(record.metadata),
        "created_at": record.created_at.isoformat(),
    }


def state_counts(ops: Iterable[Operation]) -> dict[str, int]:
    """Count operations by state (only states that occur), in ``OpState`` order."""
    from effectgate.ledger import OpState

    counts = Counter(op.state.value for op in ops)
    return {state.value: counts[state.value] for state in OpState if counts[state.value]}


def not_taken_effect(ops: Iterable[Operation]) -> str | None:
    """Say which operations ended FAILED or REJECTED, or ``None`` if none did."""
    bad = [op for op in ops if op.state.value in ("FAILED", "REJECTED")]
    if not bad:
        return None
    parts = [
        f"{op.tool} ({op.operation_id}) {op.state.value}" + (f": {op.error}" if op.error else "")
        for op in bad
    ]
    noun = "operation" if len(bad) == 1 else "operations"
    return f"{len(bad)} {noun} did not take effect: " + "; ".join(parts)


def interrupt_json(item: PendingInterrupt) -> dict[str, Any]:
    """Describe one pending interrupt: ``id, kind, value`` and the refusal ``error``, if any."""
    error = item.value.get("error")
    return {
        "id": item.id,
        "kind": item.kind,
        "value": jsonable(item.value),
        "error": str(error) if error else None,
    }


def result_json(
    result: RunResult,
    *,
    exit_code: int,
    external: Mapping[str, Any] | None,
    notes: Sequence[str] = (),
    refused: Sequence[str] = (),
    stopped_by: str | None = None,
) -> dict[str, Any]:
    """Build the single ``--json`` object of ``demo``, ``run`` and ``resume``.

    Args:
        result: where the thread stands.
        exit_code: the code the process exits with.
        external: counts read from the external systems' own storage.
        notes: what the CLI decided on the person's behalf.
        refused: why the graph refused the answers given (then ``error`` says
            so and ``error_type`` is ``"DecisionError"``).
        stopped_by: the signal that stopped the command (``"SIGTERM"``), if any.

    Returns:
        ``thread_id, status, exit_code, operations, shared_operations,
        state_counts, interrupts, external, final_message, error, error_type,
        signal, notes``; ``shared_operations`` are other threads' operations
        this thread met by business key (not counted in ``state_counts``).
    """
    error = "; ".join(refused) if refused else result.error
    return {
        "thread_id": result.thread_id,
        "status": result.status.value,
        "exit_code": exit_code,
        "operations": [operation_json(op) for op in result.operations],
        "shared_operations": [operation_json(op) for op in result.shared_operations],
        "state_counts": state_counts(result.operations),
        "interrupts": [interrupt_json(item) for item in result.interrupts],
        "external": jsonable(external) if external is not None else None,
        "final_message": result.final_message,
        "error": error,
        "error_type": "DecisionError" if refused else None,
        "signal": stopped_by,
        "notes": list(notes),
    }


def _state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state, ""))


def _listing(
    title: str, columns: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str | Text]]
) -> Table:
    """A table whose id columns never wrap; the other columns fold to fit the width.

    Args:
        title: the table's title.
        columns: ``(header, whole)`` in order; a whole column is as wide as its
            widest cell, so an id stays on one line on a narrow terminal (and
            can be copied whole) while the other columns fold.
        rows: the cells, one sequence per row, in column order.
    """
    rows = list(rows)
    table = Table(title=title, title_justify="left", expand=False)
    for i, (name, whole) in enumerate(columns):
        if whole:
            widest = max([len(name), *(Text(str(r[i])).cell_len for r in rows)])
            table.add_column(name, no_wrap=True, min_width=widest)
        else:
            table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _cell_line(cell: object) -> str:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return text.replace("\t", " ").replace("\r\n", " ").replace("\n", " ")


_FOLDED_CELLS = 12
"""The width a folding column is granted when deciding whether a listing fits as a table."""


def _fits(console: Console, table: Table) -> bool:
    """Whether ``table`` fits the terminal with its ids whole and each other column readable."""
    needed = 3 * len(table.columns) + 1  # borders and padding
    for column in table.columns:
        widest = max(
            [len(str(column.header)), *(Text(_cell_line(c)).cell_len for c in column.cells)]
        )
        needed += widest if column.no_wrap else min(widest, _FOLDED_CELLS)
    return needed <= console.width


def print_listing(console: Console, table: Table) -> None:
    """Print a listing (``threads``, ``ledger list``, ``ledger events``) for a person or a pipe.

    - stdout not a terminal (a pipe, a file): one line per row, its cells in
      the table's column order separated by tabs, no title, header or border
      (a tab or newline inside a cell becomes a space), for ``grep``, ``cut``
      and ``awk``; ``--json`` has every field.
    - a terminal wide enough for the table with its ids whole: the rich table
      (ids never wrap, other columns fold).
    - a narrower terminal: one block per row, ``header  value`` per line (as
      ``psql``'s expanded display), so no id is ever broken across lines.
    """
    cells = [list(column.cells) for column in table.columns]
    if not console.is_terminal:
        # Written past rich, which would expand the tabs into spaces.
        for row in zip(*cells, strict=True):
            console.file.write(terminal_safe("\t".join(_cell_line(c) for c in row)) + "\n")
        console.file.flush()
        return
    print_table(console, table)


def print_table(console: Console, table: Table) -> None:
    """Print a table of ids (made by ``_listing``) inside a report, on any width.

    As the rich table when it fits ``console.width`` with its ids whole and
    every other column readable (``_fits``); else one block per row,
    ``header  value`` per line (as ``psql``'s expanded display), so that no
    column shrinks to nothing beside a long id. Used for the tables of
    ``resume``, ``run``, ``pending`` and ``reconcile``; ``print_listing``
    adds the tab-separated form for pipes.
    """
    if _fits(console, table):
        # The title goes first as a line of its own: rich would wrap it to the
        # table's width, breaking a thread id in ``ledger: thread T``.
        title, table.title = table.title, None
        if title:
            print_line(console, Text(str(title), style="italic"))
        console.print(table)
        return
    cells = [list(column.cells) for column in table.columns]
    headers = [str(column.header) for column in table.columns]
    pad = max(len(h) for h in headers)
    print_line(console, Text(str(table.title or ""), style="italic"))
    for n, row in enumerate(zip(*cells, strict=True), 1):
        console.print(Text(f"-[ {n} ]-", style="dim"))
        for header, cell in zip(headers, row, strict=True):
            value = cell if isinstance(cell, Text) else Text(str(cell))
            print_line(console, Text.assemble((header.ljust(pad), "bold"), "  ", value))


def print_line(console: Console, line: str | Text) -> None:
    """Print one line that may carry an id, never broken by rich.

    Rich wraps a long line at the console's width and folds a word longer
    than it, so a 90-character thread id on 80 columns came out in two
    pieces that no longer copy or ``grep`` as one. This prints the line whole
    (``soft_wrap``): a terminal folds it visually and copies it as one line;
    a pipe gets it on one line.

    Args:
        console: where to print.
        line: rich markup (``str``) or a ``Text``.
    """
    console.print(line, soft_wrap=True)


_OPERATION_COLUMNS = (
    ("operation", True),
    ("tool", False),
    ("state", False),
    ("attempt", False),
    ("reference / error", False),
    ("updated", False),
)


def operations_table(ops: Iterable[Operation], *, title: str = "ledger") -> Table:
    """Render operations as a table: id, tool, state, attempt, reference, updated."""
    rows = []
    for op in ops:
        detail = field_text(op.receipt.reference if op.receipt is not None else op.error)
        rows.append(
            (
                _plain(op.operation_id),
                op.tool,
                _state_text(op.state.value),
                str(op.attempt),
                _plain(detail or ""),
                op.updated_at.strftime("%H:%M:%S"),
            )
        )
    return _listing(title, _OPERATION_COLUMNS, rows)


_EVENT_COLUMNS = (
    ("seq", False),
    ("at", False),
    ("operation", True),
    ("change", False),
    ("attempt", False),
    ("detail", False),
)


def events_table(events: Iterable[Event], *, with_operation: bool = True) -> Table:
    """Render ledger events in order: seq, time, operation, transition, attempt, detail.

    Args:
        events: the events, in the order to show.
        with_operation: keep the operation column; ``ledger show`` leaves it
            out, since every event it lists is of the one operation it shows.
    """
    rows = []
    for event in events:
        if event.src is None and event.dst is None:
            change = event.kind.value
        else:
            src = event.src.value if event.src is not None else "-"
            change = f"{src} -> {event.dst.value if event.dst is not None else '-'}"
        row: list[str | Text] = [str(event.seq), event.at.strftime("%H:%M:%S.%f")[:-3]]
        if with_operation:
            row.append(_plain(event.operation_id))
        row += [change, str(event.attempt), _plain(_detail_text(event.detail))]
        rows.append(row)
    columns = [c for c in _EVENT_COLUMNS if with_operation or c[0] != "operation"]
    return _listing("events", columns, rows)


def metrics_table(metrics: LedgerMetrics) -> Table:
    """Render ledger health figures, one per row."""
    table = Table(title="ledger stats", title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("operations", str(metrics.operations))
    for state, count in sorted(metrics.by_state.items()):
        table.add_row(Text(f"  {state}", style=STATE_STYLES.get(state, "")), str(count))
    rate = metrics.first_attempt_success_rate
    table.add_row("first-attempt success", "-" if rate is None else f"{rate:.0%}")
    mean = metrics.mean_attempts
    table.add_row("mean attempts", "-" if mean is None else f"{mean:.2f}")
    table.add_row("results reused", str(metrics.results_reused))
    table.add_row("open unknowns", str(metrics.open_unknowns))
    age = metrics.oldest_reconciliation_age_s
    table.add_row("oldest reconciliation", "-" if age is None else f"{age:.0f} s")
    return table


_THREAD_COLUMNS = (
    ("thread", True),
    ("status", False),
    ("kind / model", False),
    ("task", False),
    ("created", False),
)


def threads_table(rows: Iterable[tuple[ThreadRecord, str | None]]) -> Table:
    """Render threads: id, status, kind and model, task, created."""
    cells = []
    for record, status in rows:
        meta = record.metadata
        kind = f"{meta.get('kind', '-')} / {meta.get('model', '-')}"
        cells.append(
            (
                _plain(record.thread_id),
                status or "?",
                _plain(kind),
                _plain(str(record.input.get("task", ""))),
                record.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    return _listing("threads", _THREAD_COLUMNS, cells)


def print_operation(console: Console, op: Operation, events: Sequence[Event]) -> None:
    """Print one operation in full (``ledger show``): identity, budget, receipt, its events.

    One ``field  value`` line per field, each printed whole (``print_line``):
    the operation id, thread id, intent hash and receipt never break across
    lines, on a narrow terminal or in a pipe. The events follow as a table of
    their own (``print_table``: blocks when too narrow), without the operation
    column, since all are of this operation.

    Args:
        console: where to print.
        op: the operation, as read from the ledger.
        events: its events, oldest first.
    """
    rows: list[tuple[str, str | Text]] = [
        ("operation", op.operation_id),
        ("state", _state_text(op.state.value)),
        ("tool", f"{op.tool} (version {op.tool_version})"),
        ("thread", op.thread_id),
        ("tool call", op.tool_call_id),
        ("intent hash", op.intent_hash),
        ("attempt", _attempts_text(op)),
        ("args", dumps(op.args)),
    ]
    if op.receipt is not None:
        rows.append(("reference", field_text(op.receipt.reference) or "-"))
        result = field_text(op.receipt.result, expect=object)
        rows.append(("receipt", f"{result} (from {op.receipt.source})"))
    if op.error:
        rows.append(("error", field_text(op.error)))
    if op.next_attempt_at is not None:
        rows.append(("next attempt at", op.next_attempt_at.isoformat()))
    pad = max(len(key) for key, _ in rows)
    for key, value in rows:
        shown = value if isinstance(value, Text) else _plain(value)
        print_line(console, Text.assemble((key.ljust(pad), "bold"), "  ", shown))
    print_table(console, events_table(events, with_operation=False))


def print_summary(
    console: Console,
    result: RunResult,
    *,
    external: Mapping[str, Any] | None,
    exit_code: int,
) -> None:
    """Print what ran, the receipts, the ledger table and the external systems' counts.

    The status line is not printed here: ``status_line`` makes it, and the
    command prints it last (``Output.last``), after any explanation.
    """
    if result.final_message:
        console.print(Panel(_plain(result.final_message), title="agent", title_align="left"))
    if result.operations:
        title = f"ledger: thread {result.thread_id}"
        print_table(console, operations_table(result.operations, title=title))
    if result.shared_operations:
        title = "ledger: operations of other threads this thread met by business key"
        print_table(console, operations_table(result.shared_operations, title=title))
    if not result.operations and not result.shared_operations:
        console.print("[dim]no operation of this thread is in the ledger yet[/]")
    if external is not None:
        console.print(_external_table(external))
    if result.error:
        console.print(f"[yellow]note:[/] {escape(result.error)}")
    failed = not_taken_effect(result.operations)
    if failed:
        console.print(f"[bold red]{escape(failed)}[/]")
    for item in result.interrupts:
        print_line(console, pending_text(item.kind, item.value))


def status_line(result: RunResult, exit_code: int) -> str:
    """The final line of a run's summary (rich markup): ``thread T: done (exit code 0)``."""
    status = _STATUS_TEXT.get(result.status.value, result.status.value)
    return f"thread [bold]{escape(result.thread_id)}[/]: {status} (exit code {exit_code})"


def pending_text(kind: str, value: Mapping[str, Any]) -> Text:
    """Describe one pending interrupt in a line per call, with the refusal of the last answer."""
    text = Text()
    if value.get("error"):
        text.append("previous answer refused: ", style="bold red")
        text.append(terminal_safe(f"{value['error']}") + "\n")
    if kind == "question":
        from effectgate.answers import question_text

        text.append("waiting for an answer: ", style="yellow")
        text.append(terminal_safe(f"a tool asks: {question_text(value.get('question'))}") + "\n")
    elif kind == "review":
        for action in value.get("action_requests", []):
            text.append("waiting for review: ", style="yellow")
            text.append(
                terminal_safe(
                    f"{action.get('name')} ({action.get('effect_kind')}) "
                    f"operation {action.get('operation_id')}"
                )
                + "\n"
            )
    else:
        text.append("waiting for reconciliation: ", style="bold red")
        text.append(
            terminal_safe(
                f"{value.get('tool')} operation {value.get('operation_id')}, "
                f"attempt {value.get('attempt')}"
            )
            + "\n"
        )
    text.rstrip()
    return text


def _external_table(external: Mapping[str, Any]) -> Table:
    table = Table(title="external systems (read from their own storage)", title_justify="left")
    table.add_column("system")
    table.add_column("count", justify="right")
    table.add_column("detail", overflow="fold")
    tickets = external.get("ticket_list", [])
    table.add_row(
        "ticket service: tickets",
        str(external.get("tickets")),
        _plain(", ".join(str(t) for t in tickets)),
    )
    table.add_row(
        "mail sink: delivered mails",
        str(external.get("mails_delivered")),
        _plain(", ".join(str(s) for s in external.get("mail_subjects", []))),
    )
    files = external.get("files", [])
    table.add_row(
        "workspace: files",
        str(external.get("workspace_files")),
        _plain(", ".join(f"{f['path']} ({f['bytes']} B)" for f in files)),
    )
    return table


def _attempts_text(op: Operation) -> str:
    """``"2 of at most 3"``, naming attempts given back after a worker died mid-call."""
    text = f"{op.attempt} of at most {op.attempts_allowed}"
    if op.recoveries:
        text += f" ({op.budget.max_attempts} + {op.recoveries} given back: worker died mid-call)"
    return text
