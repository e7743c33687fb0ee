"""Human verdicts on operations whose outcome nobody could know.

``NEEDS_RECONCILIATION -> SUCCEEDED | FAILED | RETRY_WAIT`` happens only here,
from a person's verdict with evidence: in the graph (a reconciliation
interrupt's answer) or outside it (``effectgate reconcile``). What a
verdict may say (``Verdict``, ``validate_verdict``) is an answer rule and
lives in ``effectgate.answers``; this module only applies one to the ledger.
"""

from __future__ import annotations

from datetime import datetime

from effectgate.answers import Verdict, validate_verdict
from effectgate.errors import DecisionError
from effectgate.ledger import Ledger, Operation, OpState, Receipt

__all__ = ["apply_verdict"]


def apply_verdict(
    ledger: Ledger, operation_id: str, verdict: Verdict, *, now: datetime
) -> Operation:
    """Apply a human's reconciliation verdict to a parked operation.

    Idempotent: a verdict for an operation no longer parked, or bound to an
    earlier attempt, changes nothing.

    Args:
        ledger: the operation ledger.
        operation_id: the parked operation.
        verdict: a value that passed ``validate_verdict``.
        now: the time recorded on a human receipt and a retry.

    Returns:
        The operation after the verdict.

    Raises:
        DecisionError: a verdict ``validate_verdict`` refuses, ``retry`` with
            no attempts or time left, or an unknown operation.
    """
    verdict = validate_verdict(verdict)  # every path, including direct library calls
    op = ledger.get(operation_id)
    if op is None:
        raise DecisionError(f"unknown operation {operation_id!r}")
    bound = verdict.get("attempt")
    if (
        op.state is not OpState.NEEDS_RECONCILIATION
        or verdict["verdict"] == "ledger"
        or (bound is not None and bound != op.attempt)
    ):
        return op
    detail = {
        "verdict": verdict["verdict"],
        "reviewer": verdict.get("reviewer", "human"),
        "evidence": verdict.get("evidence", ""),
    }
    kind = verdict["verdict"]
    if kind == "succeeded":
        receipt = Receipt(
            operation_id=op.operation_id,
            intent_hash=op.intent_hash,
            attempt=op.attempt,
            result={"reconciled_by": detail["reviewer"], "evidence": detail["evidence"]},
            reference=verdict.get("reference"),
            source="human",
            recorded_at=now,
        )
        return ledger.transition(
            op.operation_id, src=op.state, dst=OpState.SUCCEEDED, receipt=receipt, detail=detail
        )
    if kind == "failed":
        return ledger.transition(
            op.operation_id,
            src=op.state,
            dst=OpState.FAILED,
            error=f"a human found it did not take effect: {detail['evidence'] or 'no detail'}",
            detail=detail,
        )
    if op.attempt >= op.attempts_allowed:
        raise DecisionError(
            f"operation {operation_id!r} has used {op.attempt} of "
            f"{op.attempts_allowed} attempts; budgets are not extended by a verdict"
        )
    return ledger.transition(
        op.operation_id,
        src=op.state,
        dst=OpState.RETRY_WAIT,
        next_attempt_at=now,
        detail=detail,
    )
