"""Follow-ups: a new human message while calls wait, and calls no message answers."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from effectgate.answers._texts import SUPERSEDED, SUPERSEDED_BY, PendingLike, pending_line
from effectgate.errors import (
    FollowUpError,
    OrphanedOperationError,
)
from effectgate.ledger import UNFINISHED, Approval, Ledger, Operation, OpState

__all__ = [
    "Closing",
    "OpenCall",
    "check_no_orphans",
    "close_for_follow_up",
    "follow_up_plan",
    "never_started",
    "orphaned_operations",
]


_STARTED = frozenset(
    {OpState.IN_FLIGHT, OpState.UNKNOWN, OpState.NEEDS_RECONCILIATION, OpState.SUCCEEDED}
)
"""States in which the effect may have happened: a reject can no longer stop it."""


def started(state: OpState) -> bool:
    """Whether an operation in ``state`` may already have taken effect."""
    return state in _STARTED


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A tool call of the history that no tool message answers yet."""

    tool_call_id: str
    tool: str
    operation_id: str | None = None
    """The operation the call was shown under (its review), if known."""


@dataclass(frozen=True, slots=True)
class Closing:
    """One call a follow-up closes, with the operation it opened (``None``: none yet)."""

    call: OpenCall
    operation: Operation | None
    settled: bool = False
    """The operation already ended with a known outcome (``SUCCEEDED`` or
    ``FAILED``): the call is answered with that outcome, not superseded."""


def never_started(op: Operation) -> bool:
    """Proof from the ledger that an operation never ran (nor may run under this approval)."""
    if op.state is OpState.REJECTED:
        return True
    return op.state in (OpState.PROPOSED, OpState.APPROVED) and op.attempt == 0


def _operations_of(ledger: Ledger, thread_id: str, call: OpenCall) -> list[Operation]:
    """The operations a call may have reached: the one it was shown under, those it opened."""
    found: dict[str, Operation] = {}
    if call.operation_id is not None:
        op = ledger.get(call.operation_id)
        if op is not None:
            found[op.operation_id] = op
    for op in ledger.list(thread_id=thread_id):
        if op.tool_call_id == call.tool_call_id:
            found.setdefault(op.operation_id, op)
    return list(found.values())


def follow_up_plan(
    ledger: Ledger,
    thread_id: str,
    calls: Sequence[OpenCall],
    *,
    waiting: Sequence[PendingLike] = (),
    supersede: bool = True,
) -> list[Closing]:
    """Decide what a follow-up message does to the calls still waiting: the one rule.

    A call is closed (superseded) only with the ledger's proof that its
    operation never started (``never_started``: no operation, ``PROPOSED``,
    ``APPROVED`` at attempt 0, or ``REJECTED``). A call whose operation
    already ended ``SUCCEEDED`` or ``FAILED`` is closed with that recorded
    outcome (``Closing.settled``): the effect's truth is known, so nothing
    is left to answer. A call whose operation may have started and has no
    known outcome (``IN_FLIGHT``, ``UNKNOWN``, ``RETRY_WAIT``,
    ``NEEDS_RECONCILIATION``, ``APPROVED`` past attempt 0), and any
    interrupt that is not a review (a reconciliation, a tool's question), refuses
    the message: closing it would tell the model
    "not executed" about an effect that may exist.

    Args:
        ledger: read for each call's operations.
        thread_id: the thread the message is for.
        calls: every call of the history no tool message answers.
        waiting: the interrupts pending, when the caller can read them
            (``Agent.send``); a graph node that runs after new input no
            longer sees them and passes none.
        supersede: ``False`` refuses any waiting call or interrupt
            (``Agent.send`` without ``supersede=True``); the graph and the
            middleware pass ``True``: the message is in the state already.

    Returns:
        The calls to close, in order, each with the operation it opened, if any.

    Raises:
        FollowUpError: something waits that the message may not close; the
            text names it (tool and operation id, state and attempt, or the
            interrupt) and how to answer it.
    """
    blocking = [item for item in waiting if item.kind != "review"]
    if waiting and (blocking or not supersede):
        also = (
            ""
            if blocking
            else "; or send with supersede=True (--supersede) to answer calls that never "
            "started as superseded"
        )
        raise FollowUpError(
            f"thread {thread_id!r} is waiting: {'; '.join(map(pending_line, waiting))}. "
            "Answer it first (Agent.resume with answers=, or effectgate resume "
            f"--thread {thread_id}){also}"
        )
    if calls and not supersede:
        named = ", ".join(f"{c.tool} ({c.operation_id or c.tool_call_id})" for c in calls)
        raise FollowUpError(
            f"thread {thread_id!r} has calls no tool message answers: {named}; answer them first"
        )
    plan: list[Closing] = []
    started: list[tuple[OpenCall, Operation]] = []
    for call in calls:
        ops = _operations_of(ledger, thread_id, call)
        started += [
            (call, op) for op in ops if not never_started(op) and op.state not in _KNOWN_OUTCOME
        ]
        own = [o for o in ops if (o.thread_id, o.tool_call_id) == (thread_id, call.tool_call_id)]
        chosen = own[0] if own else (ops[0] if ops else None)
        settled = chosen is not None and chosen.state in _KNOWN_OUTCOME
        plan.append(Closing(call=call, operation=chosen, settled=settled))
    if started:
        named = "; ".join(
            f"{call.tool} ({op.operation_id}) is {op.state.value} at attempt {op.attempt}"
            for call, op in started
        )
        raise FollowUpError(
            f"thread {thread_id!r}: {named} and may have started: it is "
            "never superseded by a new message; answer its review or reconciliation "
            f"first (effectgate pending, effectgate resume --thread {thread_id})",
            started=tuple((call.tool_call_id, op.operation_id) for call, op in started),
        )
    return plan


_KNOWN_OUTCOME = frozenset({OpState.SUCCEEDED, OpState.FAILED})
"""Terminal states whose outcome the ledger knows: a follow-up answers such a
call with it. Reached when the checkpoint lost the call's answer while the
ledger kept it: a run rolled back or cancelled by a double-text after the
effect ran (LangGraph's ``multitask_strategy`` ``rollback`` / ``interrupt``)."""


def close_for_follow_up(
    ledger: Ledger,
    thread_id: str,
    plan: Sequence[Closing],
    *,
    now: datetime,
    reviewer: str = SUPERSEDED_BY,
    reason: str = SUPERSEDED,
) -> None:
    """Withdraw in the ledger the operations the closed calls opened (one transaction).

    Each operation this very call opened (thread and tool-call id) that is
    still ``PROPOSED`` or ``APPROVED`` becomes ``REJECTED`` with a reject
    approval by ``reviewer`` carrying ``reason``, so no later answer can run
    it; an operation another call opened (a shared business key) is left to
    it. Re-running the same closing changes nothing.

    Args:
        ledger: written (``record_review``).
        thread_id: the thread.
        plan: ``follow_up_plan``'s answer.
        now: the decision time recorded.
        reviewer: who the ledger names as having decided.
        reason: the message recorded with the rejection.
    """
    approvals = [
        Approval(
            operation_id=c.operation.operation_id,
            thread_id=thread_id,
            tool_call_id=c.call.tool_call_id,
            decision="reject",
            intent_hash=c.operation.intent_hash,
            reviewer=reviewer,
            message=reason,
            decided_at=now,
        )
        for c in plan
        if c.operation is not None
        and c.operation.state in (OpState.PROPOSED, OpState.APPROVED)
        and (c.operation.thread_id, c.operation.tool_call_id) == (thread_id, c.call.tool_call_id)
    ]
    if approvals:
        ledger.record_review([], approvals)


def orphaned_operations(
    ledger: Ledger,
    thread_id: str,
    call_ids: Collection[str],
    pending: Sequence[PendingLike] = (),
) -> list[Operation]:
    """Operations of a thread's calls left unfinished with no interrupt pending for them.

    A run that ends (or stops at interrupts) must leave each operation of its
    own calls either finished or named by a pending review or
    reconciliation. One that is not was lost to a swallowed interrupt: a
    tool wrapper catching ``Exception`` caught LangGraph's ``GraphInterrupt``
    (an ``Exception`` subclass), answered the call with its own message, and
    the run went on. Only calls in the history count, so operations of a
    branch a replay left behind are not reported.

    Args:
        ledger: read for the thread's unfinished operations.
        thread_id: the thread.
        call_ids: the tool-call ids of the history's AI messages.
        pending: the interrupts pending now (their operations are not orphans).

    Returns:
        The orphaned operations, in ledger order.
    """
    asked = {str(item.value.get("operation_id")) for item in pending}
    for item in pending:
        asked |= {str(a.get("operation_id")) for a in item.value.get("action_requests", ())}
    return [
        op
        for op in ledger.list(thread_id=thread_id, states=UNFINISHED)
        if op.tool_call_id in call_ids and op.operation_id not in asked
    ]


def check_no_orphans(
    ledger: Ledger,
    thread_id: str,
    call_ids: Collection[str],
    pending: Sequence[PendingLike] = (),
) -> None:
    """Fail closed on ``orphaned_operations``: raise naming each, or return.

    Raises:
        OrphanedOperationError: some operation waits for nobody; the text
            names operation, tool, state and attempt, the likely cause and
            the fix.
    """
    orphans = orphaned_operations(ledger, thread_id, call_ids, pending)
    if not orphans:
        return
    named = ", ".join(
        f"{op.tool} ({op.operation_id}, {op.state.value} at attempt {op.attempt})" for op in orphans
    )
    raise OrphanedOperationError(
        f"thread {thread_id!r} ended with operation(s) still waiting for a person and no "
        f"review or reconciliation pending: {named}. An interrupt was swallowed: a tool "
        "wrapper (wrap_tool_call) that catches Exception also catches LangGraph's "
        "GraphInterrupt; re-raise langgraph.errors.GraphBubbleUp in it, then run the thread "
        "again from its checkpoint before the tool step (the one whose next is 'tools'; a "
        "langgraph_sdk client: runs.wait(thread, assistant, checkpoint_id=...)), which asks "
        "about these calls again. Until then nothing runs for them (effectgate ledger show "
        "OPERATION)",
        operation_ids=[op.operation_id for op in orphans],
    )
