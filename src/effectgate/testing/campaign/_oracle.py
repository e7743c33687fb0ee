"""The per-trial oracle: the ticket and mail stores, the workspace, and each system's ledger.

Duplicates and lost actions come only from the external systems' own
storage (``read_tickets`` / ``read_mails``) and the workspace bytes; "left
unknown" is what a system itself still holds as unresolved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from effectgate._app import StateDir
from effectgate.testing.campaign._systems import EFFECT_LEDGER_DB, EFFECT_LEDGER_SCOPE, System

if TYPE_CHECKING:
    from effectgate.testing.campaign._harness import TrialResult

__all__ = ["NOTE", "THREAD", "judge"]

THREAD = "incident"
"""The thread id every trial uses."""
NOTE = "incidents/orders-error-rate.md"
"""The note the workflow writes, relative to the workspace."""


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
    if sd.checkpoints.exists():
        result.history_problems = len(checkpoint_problems(sd.checkpoints, THREAD))


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
