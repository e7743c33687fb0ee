"""The review node's last part: decisions validated, written to the ledger, and routed.

Moved out of ``graph/_review.py`` (issue #34).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langgraph.graph import END
from langgraph.types import Command, Send

from effectgate import _failpoints
from effectgate._clock import Clock
from effectgate._failpoints import Failpoint
from effectgate.answers import (
    check_decision_allowed,
    check_decision_count,
    decision_object,
    edited_args,
    flag_text,
    new_flags,
    respond_text,
    review_decisions,
    started,
)
from effectgate.errors import DecisionError, ToolCallError
from effectgate.graph._messages import (
    error_message,
    rejection_message,
    respond_message,
)
from effectgate.graph._policy import Policy
from effectgate.graph._review_prepare import (
    Prepared,
    _opened_by,
    bound_to_other_intent,
    choose_operation_id,
)
from effectgate.graph._state import (
    EffectTask,
    effect_node_name,
)
from effectgate.ledger import (
    Approval,
    Ledger,
    OpenRequest,
    OpState,
)

__all__ = ["parse_decisions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Decided:
    prepared: Prepared
    kind: Literal["approve", "edit", "reject"]
    args: Any
    """Normalized args to execute (edited ones for ``edit``)."""
    operation_id: str
    intent_hash: str
    message: str | None
    by_policy: bool = False
    """Approved by policy, nobody asked."""
    respond: bool = False
    """A ``respond`` decision: recorded as a reject; ``message`` answers the model."""


def _decide_one(p: Prepared, decision: Any, *, thread_id: str, ledger: Ledger) -> _Decided:
    decision = decision_object(decision, f"decision for {p.call.id}")
    kind = decision.get("type")
    check_decision_allowed(
        kind,
        p.config["allowed_decisions"],
        tool=p.spec.name,
        call_id=p.call.id,
        conflict=bool(p.request["conflict"]),
    )
    named = decision.get("tool_call_id")
    if named is not None and named != p.call.id:
        raise DecisionError(f"decision names call {named!r} where {p.call.id!r} was expected")
    for key in ("operation_id", "intent_hash"):
        named = decision.get(key)
        if named is not None and named != p.request[key]:
            raise DecisionError(
                f"decision names {key} {named!r} where the review shows {p.request[key]!r} "
                f"({p.spec.name}, {p.call.id}); review it again"
            )
    if kind == "approve" and (flags := new_flags(p.request, decision)):
        # The review changed since it was shown (another thread's same action
        # was approved or ran meanwhile): the approval was given without the
        # warning, so it does not stand; ask again with it.
        raise DecisionError(
            f"{p.spec.name} ({p.call.id}) changed since this review was shown: it is now "
            f"{' and '.join(flag_text(p.request, f) for f in flags)}; review it again"
        )
    if kind == "edit":
        return _decide_edit(p, decision, thread_id=thread_id, ledger=ledger)
    message = decision.get("message")
    if message is not None and not isinstance(message, str):
        raise DecisionError(f"message for {p.call.id} must be a string")
    if kind == "respond":
        # HITL's "respond": the person answers the model in the tool's place;
        # nothing runs, and the ledger records it as a reject with that text.
        message = respond_text(decision, f"respond to {p.call.id}")
        return _Decided(
            prepared=p,
            kind="reject",
            args=p.args,
            operation_id=p.request["operation_id"],
            intent_hash=p.request["intent_hash"],
            message=message,
            respond=True,
        )
    return _Decided(
        prepared=p,
        kind="approve" if kind == "approve" else "reject",  # edit and respond returned above
        args=p.args,
        operation_id=p.request["operation_id"],
        intent_hash=p.request["intent_hash"],
        message=message,
    )


def _decide_edit(
    p: Prepared, decision: Mapping[str, Any], *, thread_id: str, ledger: Ledger
) -> _Decided:
    edited = edited_args(decision, f"edit of {p.call.id}")
    if edited.get("name", p.spec.name) != p.spec.name:
        raise DecisionError(f"edit of {p.call.id} may not change the tool ({p.spec.name})")
    try:
        args = p.spec.normalize(edited["args"], tool_call_id=p.call.id)
    except ToolCallError as exc:
        raise DecisionError(f"edited arguments refused: {exc}") from exc
    op_id, existing = choose_operation_id(
        p.spec, args, ledger=ledger, thread_id=thread_id, tool_call_id=p.call.id
    )
    ihash = p.spec.intent_hash(args)
    tomb = ledger.operation_tombstone(op_id) if existing is None else None
    conflict = bound_to_other_intent(op_id, ihash, existing=existing, tombstone=tomb)
    if conflict is not None:
        compacted = " (compacted by retention; its arguments are no longer kept)"
        raise DecisionError(
            f"edited arguments map to operation {op_id!r}, which is bound to other arguments "
            f"(state {conflict['stored_state']}){compacted if 'compacted' in conflict else ''}; "
            "reject, or edit to its recorded arguments"
        )
    return _Decided(
        prepared=p, kind="edit", args=args, operation_id=op_id, intent_hash=ihash, message=None
    )


def parse_decisions(
    answer: Any, asked: Sequence[Prepared], *, thread_id: str, ledger: Ledger
) -> tuple[list[_Decided], str | None]:
    """Validate a review resume value against the calls that were asked about.

    Args:
        answer: the resume value: ``{"decisions": [...], "reviewer": str?,
            "shown": [intent_hash, ...]?, "shown_operations": [operation_id, ...]?}``;
            ``shown`` and ``shown_operations`` (filled in by ``Agent``) list
            the intent hashes and operation ids the reviewer saw, in order.
        asked: the calls in the interrupt, in order.
        thread_id: the thread.
        ledger: read to check edited arguments against existing operations.

    Returns:
        The validated decisions in order, and the reviewer name if given.

    Raises:
        DecisionError: wrong shape, wrong count, a decision not allowed for its
            call, a call named out of order, edited args the schema refuses, or
            ``shown`` hashes or operation ids that differ from the calls as
            they are now.
    """
    decisions = review_decisions(answer)
    check_decision_count(len(decisions), len(asked))
    reviewer = answer.get("reviewer")
    if reviewer is not None and not isinstance(reviewer, str):
        raise DecisionError("reviewer must be a string")
    shown = answer.get("shown")
    if shown is not None and list(shown) != [p.request["intent_hash"] for p in asked]:
        # The answer was given to another version of these calls (the tool or
        # its version changed between the interrupt and the resume): an
        # approval binds to what the reviewer saw, so ask again.
        raise DecisionError(
            "the pending calls changed since they were shown (tool version or arguments); "
            "review them again"
        )
    shown_ids = answer.get("shown_operations")
    if shown_ids is not None and list(shown_ids) != [p.request["operation_id"] for p in asked]:
        # Same intent, another operation: a key shown as ``#2`` that another
        # thread's reviewer rejected meanwhile is now ``#3``; the reviewer
        # approved the operation shown, so ask again about this one.
        raise DecisionError(
            "the operation ids changed since they were shown (another thread decided on "
            "the same key meanwhile); review them again"
        )
    return [
        _decide_one(p, d, thread_id=thread_id, ledger=ledger)
        for p, d in zip(asked, decisions, strict=True)
    ], reviewer


def _ledger_rows(
    p: Prepared,
    d: _Decided,
    *,
    thread_id: str,
    reviewer: str,
    policy: Policy,
    now: datetime,
) -> tuple[OpenRequest, Approval]:
    """The operation to create-or-get and the approval row for one decided call."""
    ttl = policy.approval_ttl_s
    op = OpenRequest(
        operation_id=d.operation_id,
        thread_id=thread_id,
        tool_call_id=p.call.id,
        tool=p.spec.name,
        tool_version=p.spec.version,
        args=p.spec.args_dict(d.args),
        intent_hash=d.intent_hash,
        budget=policy.budget,
    )
    approval = Approval(
        operation_id=d.operation_id,
        thread_id=thread_id,
        tool_call_id=p.call.id,
        decision=d.kind,
        intent_hash=d.intent_hash,
        reviewer="policy:auto" if d.by_policy else reviewer,
        edited_args=p.spec.args_dict(d.args) if d.kind == "edit" else None,
        message=d.message,
        decided_at=now,
        expires_at=now + timedelta(seconds=ttl) if ttl else None,
    )
    return op, approval


def _send(p: Prepared, d: _Decided, *, thread_id: str, batch_size: int) -> Send:
    task = EffectTask(
        thread_id=thread_id,
        tool_call_id=p.call.id,
        tool=p.spec.name,
        args=p.spec.args_dict(d.args),
        operation_id=d.operation_id,
        intent_hash=d.intent_hash,
        edited=d.kind == "edit",
        batch_size=batch_size,
    )
    return Send(effect_node_name(p.spec.name), task)


def _unrunnable_answer(p: Prepared, d: _Decided | None) -> ToolMessage | None:
    """Answer calls that never reach the ledger: in-message duplicates, rejected conflicts."""
    if p.refused_repeat is not None:
        return error_message(
            p.call,
            f"rejected again; not executed; do not propose it again: a reviewer rejected this "
            f"same call {p.refused_repeat['times_rejected']} time(s) in this thread (last: "
            f"operation {p.refused_repeat['operation_id']}, reason: "
            f"{p.refused_repeat['reason']}). The run stops here",
            status="refused_repeat",
        )
    if p.duplicate_in_message is not None or d is None:
        return error_message(
            p.call,
            "not executed: this call maps to the same operation as call "
            f"{p.duplicate_in_message} in the same message",
        )
    if d.kind == "reject" and p.request["conflict"]:
        # The operation id belongs to other arguments: record nothing on it.
        return _no(p, d, operation_id=None)
    return None


def _no(
    p: Prepared, d: _Decided, *, operation_id: str | None, note: str | None = None
) -> ToolMessage:
    """Answer a call a person said no to: a rejection, or their own answer (``respond``)."""
    if d.respond and d.message:
        return respond_message(
            tool_call_id=p.call.id, tool=p.spec.name, message=d.message, operation_id=operation_id
        )
    return rejection_message(
        tool_call_id=p.call.id,
        tool=p.spec.name,
        message=d.message,
        operation_id=operation_id,
        note=note,
    )


def _opened_elsewhere(ledger: Ledger, op_id: str, thread_id: str, tool_call_id: str) -> bool:
    """Whether ``op_id`` exists and was opened by another call (a shared business key)."""
    op = ledger.get(op_id)
    return op is not None and not _opened_by(op, thread_id, tool_call_id)


def _keep_replaced(
    runnable: Sequence[tuple[Prepared, _Decided]], ledger: Ledger, reviewer: str
) -> None:
    """Keep the intent an edit replaced with the operation (an audit note)."""
    for p, d in runnable:
        if d.kind == "edit" and d.intent_hash != p.request["intent_hash"]:
            # A later proposal of the replaced intent is flagged from the history.
            ledger.note(
                d.operation_id,
                {
                    "replaced_intent_hash": p.request["intent_hash"],
                    "replaced_args": p.request["args"],
                    "reviewer": reviewer,
                },
            )


def _answer_rejected(
    rejected: Sequence[tuple[Prepared, _Decided]],
    states: Mapping[str, OpState],
    runnable: list[tuple[Prepared, _Decided]],
) -> list[ToolMessage]:
    """Answer rejected calls truthfully; one whose operation started goes to dispatch."""
    out = []
    for p, d in rejected:
        state = states.get(d.operation_id, OpState.REJECTED)
        if started(state):
            # The "no" came too late: the operation started meanwhile (another
            # thread's call under a shared key). Only dispatch can say what
            # happened; "not executed" would be a guess.
            runnable.append((p, d))
            continue
        note = None
        if state is not OpState.REJECTED:
            note = (
                f"operation {d.operation_id} is {state.value}: an earlier attempt may have "
                "taken effect; no further attempt is made for this call"
            )
        out.append(_no(p, d, operation_id=d.operation_id, note=note))
    return out


def _record_and_route(
    prepared: Sequence[Prepared],
    by_id: Mapping[str, _Decided],
    reviewer: str,
    *,
    thread_id: str,
    ledger: Ledger,
    policy: Policy,
    clock: Clock,
    end: bool = False,
) -> Command[Any]:
    now = clock.now()
    rows: list[tuple[OpenRequest, Approval]] = []
    messages: list[ToolMessage] = []
    runnable: list[tuple[Prepared, _Decided]] = []
    rejected: list[tuple[Prepared, _Decided]] = []
    for p in prepared:
        d = by_id.get(p.call.id)
        answer = _unrunnable_answer(p, d)
        if answer is not None or d is None:
            messages += [answer] if answer is not None else []
            continue
        if d.kind == "reject" and _opened_elsewhere(ledger, d.operation_id, thread_id, p.call.id):
            # A business-keyed operation another call opened (and may have had
            # approved): this "no" answers this call only. Rejecting the shared
            # operation would cancel the other thread's approved action.
            ledger.note(
                d.operation_id,
                {
                    "rejected_call": {"thread_id": thread_id, "tool_call_id": p.call.id},
                    "reviewer": reviewer,
                    "left_unchanged": True,
                },
            )
            note = f"operation {d.operation_id} belongs to another call and was left to it"
            messages.append(_no(p, d, operation_id=d.operation_id, note=note))
            continue
        if not p.settled:  # a settled operation has nothing left to approve
            rows.append(
                _ledger_rows(p, d, thread_id=thread_id, reviewer=reviewer, policy=policy, now=now)
            )
        if d.kind == "reject":
            rejected.append((p, d))
        else:
            runnable.append((p, d))
    states: dict[str, OpState] = {}
    if rows:
        recorded = ledger.record_review([r[0] for r in rows], [r[1] for r in rows])
        states = {op.operation_id: op.state for op in recorded}
    _keep_replaced(runnable, ledger, reviewer)
    _failpoints.hit(Failpoint.AFTER_REVIEW_RECORDED)
    messages += _answer_rejected(rejected, states, runnable)
    sends = [_send(p, d, thread_id=thread_id, batch_size=len(runnable)) for p, d in runnable]
    update = {"messages": messages} if messages else None
    if not sends and (end or any(p.refused_repeat is not None for p in prepared)):
        # The model keeps proposing what a reviewer keeps rejecting: stop the
        # run instead of asking the same question again and again.
        return Command(goto=END, update=update)
    return Command(goto=sends or "agent", update=update)
