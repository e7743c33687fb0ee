"""What one ``Dispatcher.dispatch`` concludes, and how a settled operation reads back.

The value types of the dispatch protocol (``dispatch.py``): the reviewed call
it receives (``EffectCall``), where it leaves the operation
(``DispatchStatus``) and what it tells the model and people (``Outcome``).
``settled_outcome`` is the one reading of an operation that already ended,
from the ledger alone: the dispatcher returns it for a replayed call, and a
follow-up message for a call whose answer the checkpoint lost. Everything
here is re-exported by ``effectgate.dispatch``, the public home of these names.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from effectgate.ledger import Ledger, Operation, OpState, Receipt

__all__ = ["DispatchStatus", "EffectCall", "Outcome", "failed_message", "settled_outcome"]


class DispatchStatus(enum.StrEnum):
    """Where one ``dispatch`` call left the operation."""

    SUCCEEDED = "succeeded"
    """A receipt exists (new, reused, reconciled or given by a human)."""
    FAILED = "failed"
    """Known not applied, or known failed for good."""
    REJECTED = "rejected"
    """A reviewer rejected it; never executed."""
    CONFLICT = "conflict"
    """The operation id is bound to other arguments; nothing was executed."""
    NEEDS_REVIEW = "needs_review"
    """No usable approval (missing, expired, for other args, tool version changed)."""
    NEEDS_RECONCILIATION = "needs_reconciliation"
    """The outcome cannot be known without a human verdict."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EffectCall:
    """One reviewed side-effecting call, as the effect node receives it."""

    thread_id: str
    tool_call_id: str
    tool: str
    args: Mapping[str, Any]
    """The arguments to execute (after a reviewer's edit), normalized."""
    operation_id: str
    intent_hash: str
    """The intent hash the review approved."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What ``dispatch`` concluded, for the model and for people."""

    status: DispatchStatus
    operation: Operation | None
    receipt: Receipt | None = None
    reused: bool = False
    """Whether the receipt was stored before this call (no tool call made now)."""
    message: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """For NEEDS_RECONCILIATION / NEEDS_REVIEW: what is known, for the human."""


def settled_outcome(ledger: Ledger, op: Operation, thread_id: str) -> Outcome | None:
    """The outcome of an operation that already ended, from the ledger alone; no tool is called.

    The one reading of a terminal operation: ``Dispatcher`` returns it for a
    replayed call, and a follow-up message answers with it a call whose
    answer the checkpoint lost (``graph._follow_up.settled_message``).

    Args:
        ledger: where the receipt is read and verified.
        op: the operation as last read.
        thread_id: the thread asking (a receipt of another thread's
            operation under a shared business key is verified for it).

    Returns:
        ``SUCCEEDED`` with the stored receipt (``reused``), ``FAILED`` or
        ``REJECTED`` (not executed); ``None`` for any state that is not terminal.

    Raises:
        LedgerCorruptError: the stored receipt does not match its operation.
    """
    if op.state is OpState.SUCCEEDED:
        receipt = ledger.verified_receipt(op, by_thread=thread_id)
        return Outcome(
            status=DispatchStatus.SUCCEEDED,
            operation=op,
            receipt=receipt,
            reused=True,
            message="stored receipt returned; not executed again",
        )
    if op.state is OpState.FAILED:
        return Outcome(status=DispatchStatus.FAILED, operation=op, message=failed_message(op))
    if op.state is OpState.REJECTED:
        return Outcome(
            status=DispatchStatus.REJECTED,
            operation=op,
            message="a reviewer rejected this call; it was not executed",
        )
    return None


def failed_message(op: Operation) -> str:
    """What the model is told about a FAILED operation: what failed, and that it took no effect.

    A tool's runtime failure is never worded as a reviewer's reject: that
    answer (``DispatchStatus.REJECTED``) is only for a person's "no".
    """
    detail = op.error or "no detail recorded"
    if op.attempt == 0:
        return f"{op.tool} was not run: {detail}"
    return (
        f"{op.tool} failed at attempt {op.attempt} of {op.attempts_allowed}: {detail}. "
        "Per the ledger it did not take effect (known not applied)"
    )
