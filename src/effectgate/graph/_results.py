"""What a run of ``Agent`` leaves behind, and how it is read back.

``RunResult`` and ``PendingInterrupt`` (public through ``effectgate.graph``),
what a run's ``updates`` stream showed (``Seen``), where a run stopped
(``Head``, ``Stop``), and the small readers of messages the runner and the
status reader share (``final_text``, ``operation_ids``, ...).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage

from effectgate import answers as answer_protocol
from effectgate.errors import DecisionError
from effectgate.graph._state import RunStatus
from effectgate.ledger import Operation

__all__ = [
    "OPERATION_KEY",
    "OPERATION_KEY_RE",
    "OPERATION_VALUE_RE",
    "STOPPED_MID_STEP",
    "EventHook",
    "Head",
    "PendingInterrupt",
    "RunResult",
    "Seen",
    "Stop",
    "check_answers_shape",
    "clip",
    "final_text",
    "missing_message",
    "noted",
    "operation_ids",
    "refused_repeat",
    "waiting_result",
    "waiting_status",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingInterrupt:
    """One unanswered interrupt: its LangGraph id and its payload."""

    id: str
    value: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """``"review"``, ``"reconciliation"`` or ``"question"``."""
        return str(self.value.get("type", "review"))

    @classmethod
    def of(cls, interrupt_id: str, value: Any) -> PendingInterrupt:
        """Wrap one LangGraph interrupt; anything effectgate did not raise is a question.

        A tool body may ask the user with ``interrupt(value)`` (LangGraph's
        documented pattern); its ``value`` is kept as given under
        ``{"type": "question", "question": value}``, and the answer given
        for this id is delivered to the body unchanged (docs/answers.md).
        """
        return cls(id=interrupt_id, value=answer_protocol.as_payload(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a run left behind, read back from the checkpoint and the ledger."""

    thread_id: str
    status: RunStatus
    interrupts: list[PendingInterrupt] = field(default_factory=list)
    final_message: str | None = None
    """The last AI message's text when the thread is done."""
    operations: list[Operation] = field(default_factory=list)
    """The operations this thread opened, in the order they were created."""
    error: str | None = None
    """Why the run stopped early (model error, drain); the thread stays resumable."""
    shared_operations: list[Operation] = field(default_factory=list)
    """Operations another thread opened that this thread's calls met through a
    business key (a ticket reused, a key parked for reconciliation), as far as
    this agent has seen the thread's messages and interrupts: not in
    ``operations``. A key still in flight under another thread's live worker
    is named by the ``OperationBusyError`` in ``error`` instead."""
    notes: list[str] = field(default_factory=list)
    """Things that went wrong around the run without changing its outcome, e.g.
    the thread lease could not be released (it then expires by itself)."""
    already_decided: list[str] = field(default_factory=list)
    """Answers to reviews already decided the same way: the recorded outcomes, one line each."""
    cause: Exception | None = field(default=None, compare=False, repr=False)
    """The exception behind ``error`` when a node raised one (a model error, a
    ``DatabaseUnavailableError`` after the store's retries), for a caller that
    maps it (the CLI exits 75 for a ``LedgerBusyError``); ``None`` otherwise."""


EventHook = Callable[[Mapping[str, Any]], None]
"""Called with each streamed graph update, ``{node: update}`` (``Agent(on_event=...)``)."""


def noted(result: RunResult, notes: list[str]) -> RunResult:
    """``result`` with ``notes`` appended to its ``notes`` (unchanged if there are none)."""
    return replace(result, notes=[*result.notes, *notes]) if notes else result


def operation_ids(messages: Sequence[Any]) -> frozenset[str]:
    """Operation ids named in tool messages (effect results, rejections carry one)."""
    ids: set[str] = set()
    for msg in messages:
        if not isinstance(msg, ToolMessage) or not isinstance(msg.content, str):
            continue
        if '"operation_id"' not in msg.content:
            continue
        try:
            payload = json.loads(msg.content)
        except ValueError:
            continue
        if isinstance(payload, dict) and isinstance(payload.get("operation_id"), str):
            ids.add(payload["operation_id"])
    return frozenset(ids)


OPERATION_KEY = b'"operation_id"'
OPERATION_KEY_RE = re.compile(re.escape(OPERATION_KEY))
OPERATION_VALUE_RE = re.compile(rb'\s*:\s*"([^"\\]*)"')
"""After the key: ``: "<id>"`` with no escape in the id (JSON's own spacing allowed)."""

STOPPED_MID_STEP = (
    "a run stopped before finishing its step (killed or stopped): resume continues it"
)
"""Why a thread is incomplete when no task recorded an error (``RunResult.error``)."""


def waiting_result(
    thread_id: str, pending: Sequence[PendingInterrupt], operations: list[Operation]
) -> RunResult:
    """The result of a thread that waits at ``pending`` (reviews, reconciliations, questions)."""
    return RunResult(
        thread_id=thread_id,
        status=waiting_status(pending),
        interrupts=list(pending),
        operations=operations,
    )


def waiting_status(pending: Sequence[PendingInterrupt]) -> RunStatus:
    """A reconciliation outranks a review: it is what blocks the thread longest."""
    if any(p.kind == "reconciliation" for p in pending):
        return RunStatus.WAITING_RECONCILIATION
    return RunStatus.WAITING_REVIEW


@dataclass(frozen=True, slots=True)
class Head:
    """A thread's head: its latest checkpoint id and the writes attached to it."""

    checkpoint_id: str
    writes: tuple[Any, ...]
    """Every write attached to the checkpoint, as stored: (task id, index, channel, bytes)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """A run of this agent ended at ``interrupts`` with the thread at ``head``."""

    head: Head
    interrupts: list[PendingInterrupt]

    def result(self, thread_id: str, operations: list[Operation]) -> RunResult:
        """The waiting result this stop stands for, with the thread's ``operations``."""
        return waiting_result(thread_id, self.interrupts, operations)


class Seen:
    """What a run's ``updates`` stream showed: interrupts and the last AI text."""

    def __init__(self) -> None:
        self.interrupts: list[PendingInterrupt] = []
        self.final: str | None = None
        self.operation_ids: frozenset[str] = frozenset()
        """Operation ids named by the tool messages the run wrote."""
        self.failure: Exception | None = None
        """The exception a node raised, when the run stopped on one (``RunResult.cause``)."""

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Take in one ``{node: update}`` chunk of the stream."""
        for node, update in chunk.items():
            if node == "__interrupt__":
                self.interrupts += [PendingInterrupt.of(i.id, i.value) for i in update]
                continue
            if node != "agent" and isinstance(update, Mapping):
                named = operation_ids(update.get("messages") or [])
                if named:
                    self.operation_ids |= named
            if node == "agent" and isinstance(update, Mapping):
                messages = update.get("messages") or []
                last = messages[-1] if messages else None
                if isinstance(last, AIMessage):
                    self.final = None if last.tool_calls else final_text([last])

    def result(self, thread_id: str, operations: list[Operation]) -> RunResult:
        """How the run ended as the stream showed it: waiting at interrupts, or done."""
        if self.interrupts:
            return waiting_result(thread_id, self.interrupts, operations)
        return RunResult(
            thread_id=thread_id,
            status=RunStatus.DONE,
            final_message=self.final,
            operations=operations,
        )


def check_answers_shape(decisions: Any, verdicts: Any, answers: Any) -> None:
    """Check the shapes of ``resume``'s answers before anything is read.

    Raises:
        DecisionError: ``decisions`` is not a review answer, or ``verdicts``
            or ``answers`` is not a mapping.
    """
    if decisions is not None:
        answer_protocol.review_decisions(decisions)  # the one shape rule
    if verdicts is not None and not isinstance(verdicts, Mapping):
        raise DecisionError("verdicts must map operation ids to verdicts")
    if answers is not None and not isinstance(answers, Mapping):
        raise DecisionError("answers must map interrupt ids to answers")


def missing_message(thread_id: str, missing: Sequence[str]) -> str:
    """Why a thread with pending work cannot go on: the ``missing`` nodes, and how to get them."""
    return (
        f"thread {thread_id!r} has pending work and needs {', '.join(missing)}, which this "
        "agent does not have; rebuild it with the same tools the thread started with "
        "(from the CLI: --agent MODULE:FACTORY loads an agent with your own tools; "
        "resume --with-services brings the demo ticket and mail tools)"
    )


def refused_repeat(messages: Sequence[AnyMessage]) -> str | None:
    """The stop notice when the run ended on a call rejected too often, else ``None``."""
    last = messages[-1] if messages else None
    if isinstance(last, ToolMessage) and '"refused_repeat"' in str(last.content):
        try:
            return str(json.loads(str(last.content))["error"])
        except (ValueError, KeyError):
            return None
    return None


def final_text(messages: Sequence[AnyMessage]) -> str | None:
    for msg in reversed(messages):
        if isinstance(msg, AIMessage):
            return msg.text if hasattr(msg, "text") else str(msg.content)
    return None


def clip(text: Any, limit: int = 80) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters (for messages that quote input)."""
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
