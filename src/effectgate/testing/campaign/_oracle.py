"""The per-trial oracle: the ticket and mail stores, the workspace, and each system's ledger.

Duplicates and lost actions come only from the external systems' own
storage (``read_tickets`` / ``read_mails``) and the workspace bytes; "left
unknown" is what a system itself still holds as unresolved.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from effectgate._app import StateDir
from effectgate.testing.campaign._systems import (
    EFFECT_LEDGER_DB,
    EFFECT_LEDGER_SCOPE,
    NOTE,
    THREAD,
    System,
)

if TYPE_CHECKING:
    from effectgate.testing.campaign._trial import TrialResult

__all__ = ["NOTE", "THREAD", "judge", "ledger_outcomes"]


def judge(system: System, sd: StateDir, result: TrialResult) -> None:
    """Fill ``result``'s counts from the ticket and mail stores, the workspace, the ledgers."""
    from effectgate.demo.services import read_mails, read_tickets
    from effectgate.testing.oracle import checkpoint_problems

    tickets = read_tickets(sd.services)
    mails = read_mails(sd.services)
    result.tickets, result.mails = len(tickets), len(mails)
    result.duplicate_tickets = max(0, len(tickets) - 1)
    result.duplicate_mails = max(0, len(mails) - 1)
    note = sd.workspace / NOTE
    text = note.read_text(encoding="utf-8", errors="replace") if note.is_file() else ""
    refers = any(f"TICKET-{t['ticket_id']}" in text for t in tickets)
    result.lost_actions = (not tickets) + (not mails) + (not refers)
    result.left_unknown = _left_unknown(system, sd)
    if result.lost_actions and system not in (System.BASELINE, System.EFFECT_LEDGER):
        result.notes.append(ledger_outcomes(sd))
    if sd.checkpoints.exists():
        result.history_problems = len(checkpoint_problems(sd.checkpoints, THREAD))


def ledger_outcomes(sd: StateDir, thread: str = THREAD) -> str:
    """One line: each of ``thread``'s operations, its state, attempt and last event's detail.

    Written into a trial's notes when an action is missing at the end, so the
    report says whether the ledger holds it as failed (and why: an exhausted
    attempt budget, a refusal) or not at all, without keeping the trial's
    state directory.

    Args:
        sd: the trial's state directory.
        thread: the thread whose operations to describe.

    Returns:
        ``"ledger: tool STATE attempt n (detail); ..."``, details cut to 160
        characters, or ``"ledger: no operations"``.
    """
    from effectgate.ledger import SqliteLedger

    if not sd.ledger.exists():
        return "ledger: no ledger file"
    parts = []
    with SqliteLedger(sd.ledger) as ledger:
        for op in ledger.list(thread_id=thread):
            events = ledger.events(operation_id=op.operation_id)
            last = json.dumps(dict(events[-1].detail), default=str)[:160] if events else "-"
            parts.append(f"{op.tool} {op.state.value} attempt {op.attempt} ({last})")
    return "ledger: " + ("; ".join(parts) or "no operations")


def _left_unknown(system: System, sd: StateDir) -> int | None:
    if system is System.BASELINE:
        return None  # no record of attempts: it cannot know, it repeats instead
    if system is System.EFFECT_LEDGER:
        from effect_ledger import EffectExecutor

        path = sd.root / EFFECT_LEDGER_DB
        if not path.exists():
            return 0
        return len(EffectExecutor(path, scope=EFFECT_LEDGER_SCOPE).unresolved(limit=1000))
    from effectgate.ledger import OpState, SqliteLedger

    if not sd.ledger.exists():
        return 0
    open_states = [OpState.IN_FLIGHT, OpState.UNKNOWN, OpState.NEEDS_RECONCILIATION]
    with SqliteLedger(sd.ledger) as ledger:
        return len(ledger.list(states=open_states))
