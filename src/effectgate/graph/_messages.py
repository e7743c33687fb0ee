"""Message-history helpers: find unanswered calls, repair ids, build ToolMessages.

Every ``tool_call_id`` of an ``AIMessage`` is answered by exactly one
``ToolMessage`` before the model is called again (invariant 6 of docs/architecture.md);
these helpers are the only place that shapes those answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

from effectgate._intent import canonical_json
from effectgate.dispatch import DispatchStatus, Outcome

__all__ = [
    "PendingCall",
    "effect_message",
    "error_message",
    "last_ai_message",
    "pending_calls",
    "rejection_message",
    "with_call_ids",
    "with_unique_call_ids",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingCall:
    """A tool call of the last AI message that has no ToolMessage yet."""

    id: str
    name: str
    args: Any
    """As the model sent them: a dict, or raw text for an unparsable call."""
    parse_error: str | None = None
    """Set for ``invalid_tool_calls``: the arguments were not valid JSON."""


def last_ai_message(messages: Sequence[AnyMessage]) -> AIMessage | None:
    """Return the last ``AIMessage`` if it is the last non-tool message, else ``None``."""
    for msg in reversed(messages):
        if isinstance(msg, ToolMessage):
            continue
        return msg if isinstance(msg, AIMessage) else None
    return None


def pending_calls(messages: Sequence[AnyMessage]) -> list[PendingCall]:
    """Return the last AI message's calls that no ToolMessage answers yet, in order."""
    ai = last_ai_message(messages)
    if ai is None:
        return []
    idx = max(i for i, m in enumerate(messages) if m is ai)
    answered = {m.tool_call_id for m in messages[idx + 1 :] if isinstance(m, ToolMessage)}
    out = [
        PendingCall(id=str(tc["id"]), name=tc["name"], args=tc["args"])
        for tc in ai.tool_calls
        if tc.get("id") and tc["id"] not in answered
    ]
    for itc in ai.invalid_tool_calls:
        if itc.get("id") and itc["id"] not in answered:
            out.append(
                PendingCall(
                    id=str(itc["id"]),
                    name=itc.get("name") or "",
                    args=itc.get("args"),
                    parse_error=itc.get("error") or "arguments are not valid JSON",
                )
            )
    return out


def with_call_ids(message: AIMessage, *, salt: str) -> AIMessage:
    """Give every tool call without an id a deterministic one.

    A model may emit a tool call without an id (seen with OpenAI-compatible
    servers: LangChain passes the id through as sent); the OpenAI API would then reject the
    history, and nothing could answer the call. The id is derived from
    ``salt`` (the position in the thread), the call's index, name and args, so
    re-running the node yields the same id.

    Args:
        message: the model's message.
        salt: a string stable for this message's position in the thread.

    Returns:
        ``message`` itself if nothing was missing, else a copy with ids filled.
    """
    calls = list(message.tool_calls)
    invalid = list(message.invalid_tool_calls)
    if all(tc.get("id") for tc in calls) and all(tc.get("id") for tc in invalid):
        return message

    def make_id(i: int, name: str | None, args: Any) -> str:
        try:
            blob = canonical_json({"a": args}).decode()
        except (TypeError, ValueError):
            blob = repr(args)
        digest = hashlib.sha256(f"{salt}:{i}:{name}:{blob}".encode()).hexdigest()[:24]
        return f"call_eg{digest}"

    fixed = [
        {**tc, "id": tc.get("id") or make_id(i, tc["name"], tc["args"])}
        for i, tc in enumerate(calls)
    ]
    fixed_invalid = [
        {**tc, "id": tc.get("id") or make_id(len(calls) + i, tc.get("name"), tc.get("args"))}
        for i, tc in enumerate(invalid)
    ]
    return _with_calls(message, fixed, fixed_invalid)


def with_unique_call_ids(message: AIMessage, earlier: Sequence[AnyMessage]) -> AIMessage:
    """Give every call whose id ``earlier`` (or the message itself) already holds a fresh id.

    Some OpenAI-compatible servers number calls per message (``call_0``,
    ``functions.send_email:0`` in every response). The default operation id
    is ``{thread_id}:{tool_call_id}``, so a reused id would alias a new
    action onto a finished operation (replayed as "succeeded", never sent,
    never reviewed) or onto one bound to other arguments (a conflict nobody
    can approve); a repeat within one message would be answered twice,
    against invariant 6 of docs/architecture.md. The first use of an id keeps it; a later
    one becomes ``{id}~{n}`` with the smallest free ``n >= 2``, so fresh ids
    (the usual OpenAI ``call_...``) never change.

    Deterministic in ``earlier`` and ``message``: a replay that re-runs the
    model on the same history renames alike, and a message already in the
    state is never renamed again (nothing re-runs the node that wrote it).

    Args:
        message: the model's new message, every call with an id (``with_call_ids``).
        earlier: the thread's messages before it.

    Returns:
        ``message`` itself if no id repeats, else a copy (same message id) with
        ``tool_calls`` and ``invalid_tool_calls`` renamed, and, as
        ``with_call_ids`` does, without the provider's raw copy of the calls.
    """
    calls = [*message.tool_calls, *message.invalid_tool_calls]
    old = [tc.get("id") for tc in calls]
    ids = _fresh_ids(old, _thread_call_ids(earlier))
    if ids == old:
        return message
    n = len(message.tool_calls)
    return _with_calls(
        message,
        [{**tc, "id": i} for tc, i in zip(message.tool_calls, ids[:n], strict=True)],
        [{**tc, "id": i} for tc, i in zip(message.invalid_tool_calls, ids[n:], strict=True)],
    )


def with_fixed_args(message: AIMessage, specs: Mapping[str, Any]) -> AIMessage:
    """Write into the message the arguments a tool's schema fills in differently each time.

    A schema may fill an omitted field from a ``default_factory`` (a
    timestamp, a uuid): normalizing the model's arguments again would give
    another value and another intent hash, so a reviewer's approval could
    never match what the review node rebuilds on resume. Such a call's
    arguments are normalized once, here, when the call is proposed, and
    stored in the message; every later normalization is then the identity.
    Calls whose normalization is deterministic are left exactly as the
    model wrote them.

    Args:
        message: the model's reply.
        specs: the tools by name (``ToolSpec``).

    Returns:
        ``message`` itself if no call needed it, else a copy with fixed arguments.
    """
    fixed: list[Any] = []
    changed = False
    for given in message.tool_calls:
        call: Any = given
        spec = specs.get(call["name"])
        if spec is not None:
            try:
                first = spec.args_dict(spec.normalize(call["args"], tool_call_id=call.get("id")))
                second = spec.args_dict(spec.normalize(call["args"], tool_call_id=call.get("id")))
            except Exception:  # noqa: BLE001 - a malformed call is answered by the tools node
                first = second = None
            if first is not None and first != second:
                call = {**call, "args": first}
                changed = True
        fixed.append(call)
    if not changed:
        return message
    return _with_calls(message, fixed, list(message.invalid_tool_calls))


def _with_calls(message: AIMessage, calls: list[Any], invalid: list[Any]) -> AIMessage:
    return message.model_copy(
        update={
            "tool_calls": calls,
            "invalid_tool_calls": invalid,
            # Drop the provider's raw copy so the fixed calls are what is sent back
            # (langchain-openai sends ``tool_calls`` whenever they are present).
            "additional_kwargs": {
                k: v for k, v in message.additional_kwargs.items() if k != "tool_calls"
            },
        }
    )


def _thread_call_ids(messages: Sequence[AnyMessage]) -> set[str]:
    """Every tool-call id already used in ``messages``: asked by an AIMessage or answered."""
    used: set[str] = set()
    for msg in messages:
        if isinstance(msg, ToolMessage):
            used.add(msg.tool_call_id)
        elif isinstance(msg, AIMessage):
            calls = [*msg.tool_calls, *msg.invalid_tool_calls]
            used.update(str(tc["id"]) for tc in calls if tc.get("id"))
    return used


def _fresh_ids(ids: Sequence[str | None], used: set[str]) -> list[str | None]:
    """Keep each id unless ``used`` or earlier in ``ids`` has it; then ``{id}~{n}``, n >= 2."""
    taken = used | {i for i in ids if i}  # never hand out an id a later call carries
    seen = set(used)
    out: list[str | None] = []
    for cid in ids:
        new = cid
        if cid and cid in seen:
            n = 2
            while f"{cid}~{n}" in taken:
                n += 1
            new = f"{cid}~{n}"
            taken.add(new)
        if new:
            seen.add(new)
        out.append(new)
    return out


def answer_id(tool_call_id: str) -> str:
    """The message id of the one ToolMessage that answers ``tool_call_id``.

    Every answer to a call carries this id, and the messages channel replaces
    a message by id: a call answered a second time (an effect node sent again
    by hand with ``Command(goto=Send(...))``) keeps exactly one answer, in
    place, and the next model request stays valid.
    """
    return f"answer-{tool_call_id}"


def unanswered_calls(messages: Sequence[AnyMessage]) -> list[tuple[str, str]]:
    """``(tool_call_id, tool)`` of every call in ``messages`` no ToolMessage answers."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    return [
        (str(call.get("id")), str(call.get("name")))
        for m in messages
        if isinstance(m, AIMessage)
        for call in [*m.tool_calls, *m.invalid_tool_calls]
        if call.get("id") not in answered
    ]


def _content(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str)


def error_message(call: PendingCall, text: str, *, status: str = "error") -> ToolMessage:
    """Answer a call that is not run (malformed, a duplicate, a refused repeat) with an error.

    Args:
        call: the call answered.
        text: what the model is told.
        status: the payload's ``status`` (``"error"``, or ``"refused_repeat"``).
    """
    return ToolMessage(
        content=_content({"status": status, "error": text, "executed": False}),
        tool_call_id=call.id,
        name=call.name or "unknown",
        status="error",
        id=answer_id(call.id),
    )


def rejection_message(
    *,
    tool_call_id: str,
    tool: str,
    message: str | None,
    operation_id: str | None = None,
    note: str | None = None,
) -> ToolMessage:
    """Answer a call a reviewer rejected: not executed, do not retry (HITL wording).

    Args:
        tool_call_id: the call answered.
        tool: its tool.
        message: the reviewer's reason, told to the model as one sentence.
        operation_id: the operation the call mapped to, when recorded.
        note: a further fact the model must know (the operation is another
            call's, or an earlier attempt may have taken effect).
    """
    text = (
        f"User rejected the tool call for `{tool}` with reason: {_sentence(message)}"
        if message and message.strip()
        else f"User rejected the tool call for `{tool}` with id {tool_call_id}."
    )
    text += " The tool was not executed" + (f"; {note}." if note else ".")
    text += " Do not retry this tool call unless the user asks."
    payload = {"status": "rejected", "message": text, "executed": False}
    if operation_id:
        payload["operation_id"] = operation_id
    return ToolMessage(
        content=_content(payload),
        tool_call_id=tool_call_id,
        name=tool,
        status="error",
        id=answer_id(tool_call_id),
    )


def respond_message(
    *, tool_call_id: str, tool: str, message: str, operation_id: str | None = None
) -> ToolMessage:
    """Answer a call with a person's own words in the tool's place (HITL ``respond``).

    Nothing was executed; the payload says so, and carries the person's text.
    """
    payload: dict[str, Any] = {"status": "responded", "message": message, "executed": False}
    if operation_id:
        payload["operation_id"] = operation_id
    return ToolMessage(
        content=_content(payload),
        tool_call_id=tool_call_id,
        name=tool,
        status="success",
        id=answer_id(tool_call_id),
    )


def _sentence(text: str) -> str:
    """``text`` stripped, ending in a full stop unless it already ends a sentence."""
    text = text.strip()
    return text if text[-1] in ".!?…" else text + "."


def effect_message(
    outcome: Outcome,
    *,
    tool_call_id: str,
    tool: str,
    executed_args: Mapping[str, Any] | None = None,
) -> ToolMessage:
    """Answer an effect call from its dispatch outcome, truthfully.

    Args:
        outcome: what dispatch concluded.
        tool_call_id: the call being answered.
        tool: the tool's name.
        executed_args: set when a reviewer edited the call: the model is told
            what ran instead of its own arguments.
    """
    op = outcome.operation
    payload: dict[str, Any] = {"status": outcome.status.value, "tool": tool}
    if op is not None:
        payload.update(operation_id=op.operation_id, attempt=op.attempt)
    status: Literal["success", "error"] = "error"
    if outcome.status is DispatchStatus.SUCCEEDED and outcome.receipt is not None:
        status = "success"
        payload.update(
            result=outcome.receipt.result,
            reference=outcome.receipt.reference,
            reused=outcome.reused,
        )
        if outcome.receipt.source != "dispatch":
            payload["settled_by"] = outcome.receipt.source
    else:
        # FAILED, REJECTED and CONFLICT all mean "known not to have taken
        # effect"; a maybe-applied write never gets here (it is parked).
        payload.update(message=outcome.message, executed=False)
    if executed_args is not None:
        edited = f"{tool} with arguments {json.dumps(dict(executed_args), sort_keys=True)}"
        payload["note"] = (
            "A human reviewer replaced this tool call before it ran. Do not re-issue your "
            + (
                f"original call. Executed instead: {edited}."
                if status == "success"
                else f"original call. The replacement ({edited}) did not take effect."
            )
        )
    return ToolMessage(
        content=_content(payload),
        tool_call_id=tool_call_id,
        name=tool,
        status=status,
        id=answer_id(tool_call_id),
    )
