"""One validator for message histories: the OpenAI tool-call pairing rules.

Invariant 6 (docs/architecture.md): at every checkpoint the history is one the OpenAI
chat API would accept once the pending calls are answered: every
``tool_call_id`` of an ``AIMessage`` is answered by exactly one
``ToolMessage``, contiguous after it, before any other message.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

__all__ = ["history_problems"]


def _call_ids(msg: AIMessage) -> list[str | None]:
    return [tc.get("id") for tc in msg.tool_calls] + [tc.get("id") for tc in msg.invalid_tool_calls]


def history_problems(messages: Sequence[AnyMessage], *, allow_pending: bool = True) -> list[str]:
    """List every way ``messages`` breaks the tool-call pairing rules.

    Args:
        messages: a thread's history, oldest first.
        allow_pending: accept unanswered calls on the *last* AI message (a
            checkpoint taken while calls await review or run).

    Returns:
        Human-readable problems; empty when the history is valid.
    """
    problems: list[str] = []
    open_ids: list[str] = []
    open_at = -1
    answered: set[str] = set()
    for i, msg in enumerate(messages):
        if isinstance(msg, ToolMessage):
            if msg.tool_call_id not in open_ids:
                where = "twice" if msg.tool_call_id in answered else "without a matching call"
                problems.append(f"message {i}: ToolMessage {msg.tool_call_id!r} answers {where}")
                continue
            open_ids.remove(msg.tool_call_id)
            answered.add(msg.tool_call_id)
            continue
        if open_ids:
            problems.append(
                f"message {i}: {type(msg).__name__} before calls "
                f"{open_ids} of message {open_at} were answered"
            )
            open_ids = []
        if isinstance(msg, AIMessage):
            ids = _call_ids(msg)
            if any(not cid for cid in ids):
                problems.append(f"message {i}: a tool call has no id")
            real = [cid for cid in ids if cid]
            if len(set(real)) != len(real):
                problems.append(f"message {i}: duplicate tool call ids {real}")
            open_ids, open_at = list(dict.fromkeys(real)), i
    if open_ids and not allow_pending:
        problems.append(f"calls {open_ids} of message {open_at} are unanswered")
    return problems
