"""Verdicts: their one shape (``VerdictModel``), recorded verdicts, a verdict again, applying one.

``NEEDS_RECONCILIATION -> SUCCEEDED | FAILED | RETRY_WAIT`` happens only in
``apply_verdict``, from a person's verdict with evidence: in the graph (a
reconciliation interrupt's answer) or outside it (``effectgate reconcile``,
``Dispatcher.apply_verdict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from effectgate.answers._texts import AnswerOutcome, PendingLike, describe_pending
from effectgate.errors import (
    DecisionError,
)
from effectgate.ledger import Ledger, Operation, OpState, Receipt

__all__ = [
    "Verdict",
    "VerdictModel",
    "apply_verdict",
    "recorded_verdict",
    "settle_verdict",
    "validate_verdict",
    "verdict_attempt_problem",
]


class Verdict(TypedDict, total=False):
    """A human's verdict on a NEEDS_RECONCILIATION operation (resume value).

    ``verdict`` is required. ``attempt`` binds the verdict to the attempt it
    was asked about, so a stored answer is never applied to a later question.
    """

    verdict: Literal["succeeded", "failed", "retry", "ledger"]
    attempt: int
    reference: str
    """For ``succeeded``: the external reference the human checked (ticket id...)."""
    evidence: str
    acknowledge_duplicate_risk: bool
    """Required ``True`` for ``retry``: a repeat may duplicate the effect."""
    reviewer: str


class VerdictModel(BaseModel):
    """A person's verdict on an operation whose outcome nobody could know.

    Known keys only. ``reference`` (for ``succeeded``) is a non-empty string;
    ``retry`` needs ``acknowledge_duplicate_risk: true``; ``attempt`` binds the
    verdict to the attempt it was asked about, so it is never applied to a
    later question.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    verdict: Literal["succeeded", "failed", "retry", "ledger"]
    attempt: StrictInt | None = None
    reference: StrictStr | None = None
    evidence: StrictStr | None = None
    acknowledge_duplicate_risk: StrictBool = False
    reviewer: StrictStr | None = None

    @model_validator(mode="after")
    def _rules(self) -> VerdictModel:
        if self.reference is not None and not self.reference.strip():
            raise ValueError("reference must be a non-empty string")
        if self.verdict == "succeeded" and self.reference is None:
            raise ValueError("verdict 'succeeded' needs a reference: the evidence you checked")
        if self.verdict == "retry" and not self.acknowledge_duplicate_risk:
            raise ValueError(
                "verdict 'retry' needs acknowledge_duplicate_risk: true; the earlier attempt "
                "may have taken effect, and a retry may duplicate it"
            )
        if self.attempt is not None and self.attempt < 0:
            raise ValueError("attempt must be >= 0")
        return self


def validate_verdict(value: Any) -> Verdict:
    """Validate a reconciliation verdict (the one check every path uses).

    Args:
        value: a mapping such as ``{"verdict": "succeeded", "reference":
            "TICKET-7"}``.

    Returns:
        The verdict as a ``Verdict`` mapping, without unset keys.

    Raises:
        DecisionError: not a mapping, an unknown key or verdict, a
            ``reference`` that is not a non-empty string, ``succeeded``
            without a reference, or ``retry`` without the acknowledgement.
    """
    if not isinstance(value, Mapping):
        raise DecisionError(f"a reconciliation verdict must be an object, got {value!r}")
    try:
        model = VerdictModel.model_validate(dict(value))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'verdict'}: {err['msg']}"
            for err in exc.errors()
        )
        raise DecisionError(f"verdict refused: {problems}") from None
    out = model.model_dump(exclude_none=True)
    if not model.acknowledge_duplicate_risk:
        out.pop("acknowledge_duplicate_risk", None)
    verdict: Verdict = out  # type: ignore[assignment]
    return verdict


def recorded_verdict(
    ledger: Ledger, operation_id: str, attempt: int | None = None
) -> tuple[str, str, int, str | None] | None:
    """The latest human verdict recorded on an operation (for ``attempt``, if given).

    Returns:
        ``(verdict, reviewer, attempt, reference)`` read from the transition
        event that applied it, or ``None`` if no verdict was ever applied.
    """
    for event in reversed(ledger.events(operation_id=operation_id)):
        kind = event.detail.get("verdict")
        if event.src is not OpState.NEEDS_RECONCILIATION or not isinstance(kind, str):
            continue
        if attempt is not None and event.attempt != attempt:
            continue
        reference = event.detail.get("reference")
        return (
            kind,
            str(event.detail.get("reviewer") or "human"),
            event.attempt,
            reference if isinstance(reference, str) else None,
        )
    return None


def settle_verdict(
    ledger: Ledger,
    operation_id: str,
    verdict: Mapping[str, Any],
    *,
    pending: Sequence[PendingLike] = (),
) -> AnswerOutcome | None:
    """Judge a verdict for an operation that no longer waits for that verdict.

    A verdict re-sent for an attempt already settled returns the recorded
    outcome; a different one is refused, naming the recorded verdict, and
    the refusal is written to the ledger (``Ledger.note``). Mirrors
    ``settle_stale`` for review answers.

    Args:
        ledger: read for the operation and its verdicts, written for refusals.
        operation_id: the operation the verdict names.
        verdict: a validated verdict (``validate_verdict``).
        pending: what is pending now (named in refusals).

    Returns:
        ``None`` when the operation is not settled and holds no verdict for
        the attempt named (parked: the caller applies it, which changes
        nothing for another attempt). Otherwise the recorded outcome, when
        the verdict agrees with it.

    Raises:
        DecisionError: an unknown operation, or a verdict that contradicts
            the recorded verdict or the operation's final state (the refusal
            is recorded as a ``note`` event).
    """
    op = ledger.get(operation_id)
    if op is None:
        raise DecisionError(f"unknown operation {operation_id!r}")
    given = verdict.get("verdict")
    bound = verdict.get("attempt")
    if given == "ledger":
        return None
    if op.state is OpState.NEEDS_RECONCILIATION and bound in (None, op.attempt):
        return None
    found = recorded_verdict(ledger, operation_id, bound if isinstance(bound, int) else None)
    if found is not None:
        kind, reviewer, attempt, reference = found
        same_ref = verdict.get("reference") in (None, reference) or kind != "succeeded"
        if kind == given and same_ref:
            return AnswerOutcome(interrupt_id=None, decisions=[(operation_id, kind)])
        why = (
            f"{operation_id} was already decided: verdict {kind} by {reviewer} for attempt "
            f"{attempt}" + (f" (reference {reference})" if reference else "")
        )
    elif op.is_terminal:
        settled_as = {OpState.SUCCEEDED: "succeeded", OpState.FAILED: "failed"}.get(op.state)
        if settled_as == given:
            return AnswerOutcome(interrupt_id=None, decisions=[(operation_id, str(given))])
        why = f"{operation_id} already ended {op.state.value} at attempt {op.attempt}" + (
            f" ({op.error})" if op.error else ""
        )
    else:
        # Not settled and no verdict for that attempt: ``apply_verdict`` decides
        # (a verdict for another attempt than the one asked changes nothing).
        return None
    ledger.note(
        operation_id,
        {
            "refused_verdict": {
                "verdict": given,
                "attempt": bound,
                "reviewer": verdict.get("reviewer"),
            },
            "reason": why,
        },
    )
    raise DecisionError(
        f"verdict {given!r} refused: {why}; the verdict was refused and recorded and changed "
        f"nothing. {describe_pending(pending)}"
    )


def verdict_attempt_problem(operation_id: str, named: Any, asked: Any) -> str | None:
    """Why a verdict bound to ``named`` does not answer a reconciliation of attempt ``asked``.

    A reconciliation asks about the operation's latest attempt. A verdict
    naming another one changes nothing: an earlier attempt was settled
    already; a later one does not exist.

    Args:
        operation_id: the operation the verdict is for.
        named: the verdict's ``attempt`` (``None``: bound to the one asked).
        asked: the attempt the reconciliation asks about.

    Returns:
        ``None`` when the verdict answers the attempt asked about; else one
        clause naming the attempt it gives and why it is not used.
    """
    if named is None or named == asked:
        return None
    if isinstance(named, int) and isinstance(asked, int) and 0 < named < asked:
        return (
            f"the verdict for {operation_id} is for attempt {named}, an earlier attempt than "
            f"the one asked about (attempt {asked}); it is not used"
        )
    return (
        f"the verdict for {operation_id} gives attempt {named!r}, which names no attempt of "
        f"it (the one asked about is attempt {asked}, its latest); it is not used"
    )


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
