"""What a command recovered or reused, told from the ledger's own audit trail.

After ``demo``, ``run`` or ``resume`` the summary shows where each operation
ended; these lines add how it got there when that is not the plain path:

- an operation found IN_FLIGHT after a crash and settled by looking its
  outcome up: ``IN_FLIGHT -> UNKNOWN -> looked up (GET ...by-key...: HTTP
  200) -> SUCCEEDED (TICKET-1), attempt 1``;
- a stored receipt handed out instead of calling the tool again (a second
  demo run, a follow-up asking for the same ticket): ``reused``.

They are read from the events the ledger appended while the command ran
(``seq`` above the mark taken before it), so they show what happened, not
what the graph's messages claim. Another command writing to the same ledger
at the same moment would have its events shown too; the lines name each
operation's thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from effectgate.cli._output import Output
    from effectgate.ledger import Event, Ledger

__all__ = ["explained", "recovery_lines"]


@contextlib.contextmanager
def _ledger(state_dir: Path) -> Iterator[Ledger | None]:
    """The state directory's ledger; ``None`` if there is none or it is not ours (untouched)."""
    from effectgate._app import StateDir
    from effectgate.cli._inspect import ledger_if_any
    from effectgate.errors import ConfigError

    try:
        sd = StateDir.open(state_dir, create=False)
    except ConfigError:
        yield None
        return
    with ledger_if_any(sd) as ledger:
        yield ledger


def _mark(state_dir: Path) -> int:
    with _ledger(state_dir) as ledger:
        events = ledger.events() if ledger is not None else []
    return events[-1].seq if events else 0


def _step(event: Event) -> str:
    detail = event.detail
    dst = event.dst.value if event.dst is not None else "?"
    if event.src is not None and event.src.value == "UNKNOWN" and detail.get("reconcile"):
        found = f"looked up by idempotency key ({detail['reconcile']})"
        ref = detail.get("reference")
        return f"{found} -> {dst}" + (f" ({ref})" if ref else "")
    ref = detail.get("reference") if dst == "SUCCEEDED" else None
    return dst + (f" ({ref})" if ref else "")


def recovery_lines(state_dir: Path, since: int) -> list[str]:
    """Describe recoveries and reused receipts among the ledger events after ``since``.

    Args:
        state_dir: the state directory (its ledger is read, never created).
        since: the last event ``seq`` before the command ran.

    Returns:
        One line per operation that went through UNKNOWN, and one per reused
        receipt, in the order they happened.
    """
    with _ledger(state_dir) as ledger:
        if ledger is None:
            return []
        new = [e for e in ledger.events() if e.seq > since]
        ops = {e.operation_id: ledger.get(e.operation_id) for e in new}
    lines = []
    by_op: dict[str, list[Event]] = {}
    for event in new:
        by_op.setdefault(event.operation_id, []).append(event)
    for op_id, events in by_op.items():
        op = ops.get(op_id)
        name = f"{op.tool} ({op_id}, thread {op.thread_id})" if op is not None else op_id
        moves = [e for e in events if e.kind.value == "transition"]
        through_unknown = [
            i for i, e in enumerate(moves) if e.dst is not None and e.dst.value == "UNKNOWN"
        ]
        if through_unknown:
            first = moves[through_unknown[0]]
            path = [first.src.value if first.src is not None else "?"]
            path += [_step(e) for e in moves[through_unknown[0] :]]
            attempt = moves[-1].attempt
            lines.append(f"recovered {name}: {' -> '.join(path)}, attempt {attempt}")
        for event in events:
            if event.kind.value == "result_reused":
                ref = op.receipt.reference if op is not None and op.receipt else None
                by = event.detail.get("thread_id")
                lines.append(
                    f"reused {name}: its stored receipt"
                    + (f" ({ref})" if ref else "")
                    + f" from attempt {event.detail.get('receipt_attempt')}"
                    + (f" for thread {by}" if by and op is not None and by != op.thread_id else "")
                    + "; not run again"
                )
    return lines


@contextlib.contextmanager
def explained(output: Output, state_dir: Path) -> Iterator[None]:
    """Print, after the block, what it recovered or reused (not with ``--json``)."""
    since = 0 if output.json_mode else _mark(state_dir)
    yield
    if output.json_mode:
        return
    _print(output, recovery_lines(state_dir, since))


def _print(output: Output, lines: Sequence[str]) -> None:
    for line in lines:
        output.out.print(escape(line))
