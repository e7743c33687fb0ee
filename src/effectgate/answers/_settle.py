"""Answers to reviews no longer open: recorded decisions, repeats, contradictions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from effectgate.answers._decisions import _named_ids
from effectgate.answers._texts import AnswerOutcome, DecisionKind, PendingLike, describe_pending
from effectgate.answers._verdicts import recorded_verdict
from effectgate.errors import (
    DecisionError,
)
from effectgate.ledger import Ledger, OpState

__all__ = ["recorded_decision", "settle_stale"]


def recorded_decision(
    ledger: Ledger, thread_id: str, action: Mapping[str, Any]
) -> tuple[DecisionKind, str] | None:
    """The decision already recorded for one shown call, or ``None`` if it is open.

    Args:
        ledger: read for the operation and its approvals.
        thread_id: the thread that showed the call.
        action: one ``action_requests`` entry as shown.

    Returns:
        ``(decision, reviewer)`` of the latest approval this very call (thread
        and tool-call id) recorded on the operation shown for the intent
        shown, or ``None``.
    """
    op_id = str(action.get("operation_id"))
    for approval in reversed(ledger.approvals(op_id)):
        if (approval.thread_id, approval.tool_call_id) != (thread_id, action.get("tool_call_id")):
            continue
        if approval.intent_hash != action.get("intent_hash") and approval.decision != "edit":
            continue
        return approval.decision, approval.reviewer
    return None


def is_decided(ledger: Ledger, thread_id: str, request: Mapping[str, Any]) -> bool:
    """Whether an interrupt's answer is already recorded in the ledger, so no person is needed.

    A runner can die between recording an answer and writing the checkpoint
    that moves past the interrupt; the interrupt then still stands in the
    checkpoint, but its node reads the recorded answer back when it runs
    again, so the thread is unfinished work, not waiting for anyone.

    - A review: every call's operation holds this call's recorded decision
      and has moved past PROPOSED (an approval withdrawn because it expired
      puts it back to PROPOSED: that review is open again).
    - A reconciliation: a verdict for the very attempt it asked about is
      recorded (``recorded_verdict``); the effect node then finds the
      operation settled, or retrying under a later attempt.
    - Anything else (a tool's question): never; its answer lives only in the
      checkpoint.

    Args:
        ledger: read for the operations, approvals and verdict events.
        thread_id: the thread that raised the interrupt.
        request: the interrupt's value.

    Returns:
        ``True`` if the recorded answer settles the interrupt.
    """
    if request.get("type") == "reconciliation":
        attempt = request.get("attempt")
        op_id = request.get("operation_id")
        if not isinstance(attempt, int) or not isinstance(op_id, str):
            return False
        return recorded_verdict(ledger, op_id, attempt) is not None
    if request.get("type", "review") != "review":
        return False
    actions = list(request.get("action_requests", ()))
    if not actions:
        return False
    for action in actions:
        op = ledger.get(str(action.get("operation_id")))
        if op is None or op.state is OpState.PROPOSED:
            return False
        if recorded_decision(ledger, thread_id, action) is None:
            return False
    return True


def _answered_actions(
    answer: Mapping[str, Any], shown: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The calls a stale answer is for: those shown, or those its decisions name."""
    if shown is not None:
        return [dict(a) for a in shown.get("action_requests", ())]
    named = _named_ids(answer) or []
    actions: list[dict[str, Any]] = [{"operation_id": o, "intent_hash": h} for o, h in named]
    for action, d in zip(actions, answer.get("decisions") or [], strict=False):
        if isinstance(d, Mapping):
            action["tool_call_id"] = d.get("tool_call_id")
    return actions


def _not_shown(what: str, pending: Sequence[PendingLike]) -> str:
    """The refusal for an answer naming a review the thread does not show now.

    The thread's recent history holds no review under that id: it was
    answered and moved past, it was asked again under a new id (after a
    refused answer, or because what it shows changed), or it was never a
    review of this thread. The pending list names what waits now.
    """
    return (
        f"this answer is for {what}, which is not pending (answered elsewhere, asked again "
        f"under a new id, or not a review of this thread); this answer ran nothing. "
        f"{describe_pending(pending)}"
    )


def settle_stale(
    ledger: Ledger,
    thread_id: str,
    answer: Mapping[str, Any],
    shown: Mapping[str, Any] | None,
    *,
    interrupt_id: str | None,
    pending: Sequence[PendingLike],
) -> AnswerOutcome:
    """Judge an answer to a review that is not pending any more.

    The same answer as the one recorded returns the recorded outcome; a
    different one is refused, naming the recorded decision, and the refusal
    is written to the ledger (``Ledger.note``: who, what was refused, why;
    the event carries the time).

    Args:
        ledger: read for the recorded decisions, written for refusals.
        thread_id: the thread.
        answer: the client's review answer.
        shown: the review request the answer was given for (from the thread's
            history), or ``None`` when only the decisions name it.
        interrupt_id: the interrupt the answer named, if any.
        pending: what is pending now (named in refusals).

    Returns:
        The recorded outcome when the answer agrees with it.

    Raises:
        DecisionError: nothing known was shown under that id, the review has
            no recorded decision, or the answer contradicts the recorded one.
    """
    decisions = answer.get("decisions")
    what = f"review {interrupt_id}" if interrupt_id else "the review these decisions name"
    if interrupt_id and shown is None:
        raise DecisionError(_not_shown(what, pending))
    actions = _answered_actions(answer, shown)
    if shown is not None and actions and isinstance(decisions, list):
        if len(decisions) != len(actions):
            # The thread showed this review: say what does not fit, not "never shown".
            raise DecisionError(
                f"this answer is for {what}, which is not pending (no longer open); it "
                f"showed {len(actions)} call(s), this answer gives {len(decisions)} "
                f"decision(s); this answer ran nothing. {describe_pending(pending)}"
            )
    elif not actions or not isinstance(decisions, list) or len(decisions) != len(actions):
        raise DecisionError(_not_shown(what, pending))
    recorded: list[tuple[str, str]] = []
    contradictions = []
    for action, decision in zip(actions, decisions, strict=True):
        op_id = str(action.get("operation_id"))
        asked = action
        if asked.get("tool_call_id") is None:
            op = ledger.get(op_id)
            asked = {**asked, "tool_call_id": op.tool_call_id if op else None}
        found = recorded_decision(ledger, thread_id, asked)
        if found is None:
            raise DecisionError(
                f"this answer is for {what}, which is not pending and has no recorded "
                f"decision for {op_id}; this answer ran nothing. {describe_pending(pending)}"
            )
        kind, reviewer = found
        given = decision.get("type") if isinstance(decision, Mapping) else None
        if given == "respond":
            given = "reject"  # recorded as a reject with the person's text
        recorded.append((op_id, kind))
        if given != kind:
            contradictions.append((op_id, given, kind, reviewer))
    if contradictions:
        for op_id, given, kind, reviewer in contradictions:
            ledger.note(
                op_id,
                {
                    "refused_answer": {
                        "decision": given,
                        "reviewer": answer.get("reviewer"),
                        "interrupt_id": interrupt_id,
                    },
                    "reason": f"already decided: {kind} by {reviewer}",
                },
            )
        listed = "; ".join(
            f"{op} was already decided: {kind} by {who} (this answer: {given}){_now(ledger, op)}"
            for op, given, kind, who in contradictions
        )
        # "Nothing ran" would be false when the recorded approval ran in the
        # same command (its review node read it back): say what this answer did.
        raise DecisionError(
            f"this answer is for {what}, which is not pending (no longer open): {listed}; the "
            "recorded decision stands; this answer was refused and recorded and ran nothing. "
            f"{describe_pending(pending)}"
        )
    return AnswerOutcome(interrupt_id=interrupt_id, decisions=recorded)


def _now(ledger: Ledger, operation_id: str) -> str:
    """``; OP is now succeeded`` (the operation's state as the ledger holds it), or ``""``."""
    op = ledger.get(operation_id)
    return "" if op is None else f"; {operation_id} is now {op.state.value.lower()}"
