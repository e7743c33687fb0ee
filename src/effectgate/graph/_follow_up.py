"""A follow-up message while calls wait: the graph side of ``answers.follow_up_plan``.

Three paths meet a new human message while a tool call of the last AI
message has no answer: ``Agent.send``, the agent node (a LangGraph client's
new input to a thread whose review was pending: LangGraph writes the input
and drops the pending review task), and ``EffectGateMiddleware.before_model``
(the same in ``create_agent``). Each calls ``close_open_calls``: the one rule
(``answers.follow_up_plan``) decides, the ledger withdraws what the closed
calls opened (``answers.close_for_follow_up``), and each closed call gets one
"superseded" ``ToolMessage``. ``before_follow_up`` then puts those answers
right after their AI message, before the human message, so the history stays
one the OpenAI chat API accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    RemoveMessage,
    ToolMessage,
)
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from effectgate.answers import (
    SUPERSEDED,
    Closing,
    OpenCall,
    PendingLike,
    close_for_follow_up,
    follow_up_plan,
)
from effectgate.errors import ToolCallError
from effectgate.graph._messages import answer_id, effect_message
from effectgate.graph._review import choose_operation_id
from effectgate.ledger import Ledger
from effectgate.tools import ToolSpec

__all__ = [
    "answered_after_follow_up",
    "before_follow_up",
    "close_open_calls",
    "follow_up_index",
    "superseded_message",
]


def _last_ai(messages: Sequence[AnyMessage]) -> tuple[int, AIMessage] | None:
    """The last AI message of ``messages`` and its index, or ``None``."""
    for idx in range(len(messages) - 1, -1, -1):
        msg = messages[idx]
        if isinstance(msg, AIMessage):
            return idx, msg
    return None


def follow_up_index(messages: Sequence[AnyMessage]) -> int | None:
    """The last AI message's index if calls of it are unanswered and a non-tool message follows.

    That is a follow-up sent while those calls waited (a review, a
    reconciliation): the model must not see the history as it stands.
    ``None`` otherwise.
    """
    found = _last_ai(messages)
    if found is None:
        return None
    idx, ai = found
    after = messages[idx + 1 :]
    answered = {m.tool_call_id for m in after if isinstance(m, ToolMessage)}
    calls = [c.get("id") for c in [*ai.tool_calls, *ai.invalid_tool_calls]]
    if not any(c not in answered for c in calls):
        return None
    return idx if any(not isinstance(m, ToolMessage) for m in after) else None


def answered_after_follow_up(messages: Sequence[AnyMessage]) -> int | None:
    """The last AI message's index if every call of it is answered, one only after a later message.

    A follow-up that met a call which may have started (a verdict waiting)
    is kept in the history while that call is asked again; its answer then
    lands after the follow-up. ``before_follow_up(messages, idx, [])`` moves
    it back, so the model gets each answer right after its call. ``None``
    when the order is already one the chat APIs accept.
    """
    found = _last_ai(messages)
    if found is None:
        return None
    idx, ai = found
    own = {c.get("id") for c in [*ai.tool_calls, *ai.invalid_tool_calls]}
    seen_other = False
    for m in messages[idx + 1 :]:
        if isinstance(m, ToolMessage) and m.tool_call_id in own:
            if seen_other:
                return idx
        else:
            seen_other = True
    return None


def _open_calls(
    messages: Sequence[AnyMessage],
    idx: int,
    *,
    specs: Mapping[str, ToolSpec],
    ledger: Ledger,
    thread_id: str,
    waiting: Sequence[PendingLike],
) -> list[OpenCall]:
    """The unanswered calls of ``messages[idx]``, each with the operation it was shown under."""
    ai = messages[idx]
    assert isinstance(ai, AIMessage)
    answered = {m.tool_call_id for m in messages[idx + 1 :] if isinstance(m, ToolMessage)}
    shown = {
        str(a.get("tool_call_id")): str(a.get("operation_id"))
        for item in waiting
        if item.kind == "review"
        for a in item.value.get("action_requests", ())
    }
    out = []
    for call in [*ai.tool_calls, *ai.invalid_tool_calls]:
        call_id, name = str(call.get("id")), str(call.get("name") or "unknown")
        if call.get("id") is None or call_id in answered:
            continue
        op_id = shown.get(call_id)
        spec = specs.get(name)
        raw = call.get("args")
        if op_id is None and spec is not None and not spec.is_read and isinstance(raw, Mapping):
            try:
                args = spec.normalize(raw, tool_call_id=call_id)
            except ToolCallError:
                args = None  # a malformed call never reached the ledger
            if args is not None:
                op_id, _ = choose_operation_id(
                    spec, args, ledger=ledger, thread_id=thread_id, tool_call_id=call_id
                )
        out.append(OpenCall(tool_call_id=call_id, tool=name, operation_id=op_id))
    return out


def superseded_message(closing: Closing) -> ToolMessage:
    """The one answer of a call a follow-up closed: superseded, not executed."""
    payload: dict[str, object] = {"status": "superseded", "message": SUPERSEDED, "executed": False}
    if closing.operation is not None:
        payload["operation_id"] = closing.operation.operation_id
    return ToolMessage(
        content=json.dumps(payload, sort_keys=True),
        tool_call_id=closing.call.tool_call_id,
        name=closing.call.tool,
        status="error",
        id=answer_id(closing.call.tool_call_id),
    )


def close_open_calls(
    messages: Sequence[AnyMessage],
    *,
    specs: Mapping[str, ToolSpec],
    ledger: Ledger,
    thread_id: str,
    now: datetime | None,
    waiting: Sequence[PendingLike] = (),
    supersede: bool = True,
) -> list[ToolMessage]:
    """Judge and close the last AI message's unanswered calls for a follow-up message.

    Args:
        messages: the history (with or without the follow-up already in it).
        specs: the agent's tools (for each call's operation id).
        ledger: read by the rule; written when calls are closed.
        thread_id: the thread.
        now: the decision time to record; ``None`` only judges (nothing is
            written, no message is built: ``Agent.send``'s check before it
            records the turn).
        waiting: the pending interrupts, when the caller can read them.
        supersede: ``answers.follow_up_plan``'s ``supersede``.

    Returns:
        One superseded ``ToolMessage`` per closed call, in call order (none
        when nothing waits or ``now`` is ``None``).

    Raises:
        FollowUpError: ``answers.follow_up_plan`` refused the message.
    """
    found = _last_ai(messages)
    calls = (
        []
        if found is None
        else _open_calls(
            messages, found[0], specs=specs, ledger=ledger, thread_id=thread_id, waiting=waiting
        )
    )
    plan = follow_up_plan(ledger, thread_id, calls, waiting=waiting, supersede=supersede)
    if now is None or not plan:
        return []
    close_for_follow_up(ledger, thread_id, plan, now=now)
    return [
        settled_message(c, ledger, thread_id) if c.settled else superseded_message(c) for c in plan
    ]


def settled_message(closing: Closing, ledger: Ledger, thread_id: str) -> ToolMessage:
    """The answer of a call whose operation already ended: its recorded outcome, from the ledger.

    The same message the effect node gives on a replay (``dispatch.settled_outcome``
    and ``effect_message``): the stored receipt (``reused``) for ``SUCCEEDED``,
    "not executed" with the error for ``FAILED``.

    Raises:
        LedgerCorruptError: the stored receipt does not verify.
    """
    from effectgate._outcome import settled_outcome

    assert closing.operation is not None
    outcome = settled_outcome(ledger, closing.operation, thread_id)
    assert outcome is not None  # Closing.settled: SUCCEEDED or FAILED
    return effect_message(outcome, tool_call_id=closing.call.tool_call_id, tool=closing.call.tool)


def before_follow_up(
    messages: Sequence[AnyMessage], idx: int, answers: Sequence[ToolMessage]
) -> tuple[list[AnyMessage], list[BaseMessage]]:
    """Place ``answers`` right after the AI message at ``idx`` and its tool messages.

    Returns:
        ``(history, update)``: the history in its new order, and the write
        that stores it (``RemoveMessage(REMOVE_ALL_MESSAGES)`` then every
        message, ids kept), which both ``add_messages`` and effectgate's
        delta reducer apply as a replacement.
    """
    ai = messages[idx]
    assert isinstance(ai, AIMessage)
    own = {c.get("id") for c in [*ai.tool_calls, *ai.invalid_tool_calls]}
    after = list(messages[idx + 1 :])
    answered = [m for m in after if isinstance(m, ToolMessage) and m.tool_call_id in own]
    rest = [m for m in after if not (isinstance(m, ToolMessage) and m.tool_call_id in own)]
    history = [*messages[: idx + 1], *answered, *answers, *rest]
    return history, [RemoveMessage(id=REMOVE_ALL_MESSAGES), *history]
