"""How the answer protocol names things: interrupts, pending lists, answers, outcomes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "AnswerOutcome",
    "PendingLike",
    "RESOLVED",
    "SUPERSEDED",
    "SUPERSEDED_BY",
    "answer_summary",
    "as_payload",
    "describe_pending",
    "pending_line",
    "question_text",
]


DecisionKind = Literal["approve", "edit", "reject"]


_OWN_KINDS = frozenset({"review", "reconciliation"})


def as_payload(value: Any) -> Mapping[str, Any]:
    """An interrupt's payload as effectgate reports it.

    Reviews and reconciliations (raised by effectgate) are kept as they are.
    Anything else was raised by a tool body asking the user (LangGraph's
    ``interrupt(value)``): it becomes ``{"type": "question", "question":
    value}``; its answer is delivered to the body unchanged.
    """
    if isinstance(value, Mapping) and value.get("type") in _OWN_KINDS:
        return value
    return {"type": "question", "question": value}


def question_text(value: Any, limit: int = 120) -> str:
    """A tool's question in one line of at most ``limit`` characters (untrusted text)."""
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PendingLike(Protocol):
    """A pending interrupt as the runner reports it (``PendingInterrupt``)."""

    @property
    def id(self) -> str:
        """LangGraph's interrupt id."""
        ...

    @property
    def value(self) -> Mapping[str, Any]:
        """The interrupt payload (a review or reconciliation request)."""
        ...

    @property
    def kind(self) -> str:
        """``"review"``, ``"reconciliation"`` or ``"question"``."""
        ...


def _shown(request: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (str(a.get("operation_id")), str(a.get("intent_hash")))
        for a in request.get("action_requests", ())
    ]


def describe_pending(pending: Sequence[PendingLike]) -> str:
    """Name each pending interrupt in one line: id, kind and the operations it is about."""
    if not pending:
        return "no review is pending, and no reconciliation is pending"
    parts = []
    for item in pending:
        if item.kind == "review":
            calls = ", ".join(
                f"{a.get('name')} {a.get('operation_id')}"
                for a in item.value.get("action_requests", ())
            )
            parts.append(f"review {item.id} ({calls})")
        elif item.kind == "question":
            parts.append(f"question {item.id} ({question_text(item.value.get('question'))})")
        else:
            parts.append(f"reconciliation {item.id} ({item.value.get('operation_id')})")
    lead = "" if any(i.kind != "reconciliation" for i in pending) else "no review is pending; "
    return lead + "pending: " + "; ".join(parts)


@dataclass(frozen=True, slots=True)
class _Raised:
    """An interrupt as LangGraph recorded it, named in a refusal (a ``PendingLike``)."""

    id: str
    raw: Any

    @property
    def value(self) -> Mapping[str, Any]:
        return as_payload(self.raw)

    @property
    def kind(self) -> str:
        return str(self.value.get("type", "review"))


def _json_kind(value: Any) -> str:
    """The JSON name of a value's type (``null``, ``array``, ...), as a client wrote it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def answer_summary(value: Any) -> str:
    """A short, one-line account of an answer (review answer, decision, verdict or other value).

    ``{"decisions": [{"type": "reject", "message": "no"}]}`` becomes
    ``reject ('no')``; a verdict becomes ``verdict succeeded (reference X)``;
    anything else is shown cut to one line (it may be untrusted text).
    """
    if isinstance(value, Mapping) and isinstance(value.get("decisions"), list):
        return ", ".join(answer_summary(d) for d in value["decisions"]) or "no decisions"
    if isinstance(value, Mapping) and isinstance(value.get("type"), str):
        message = value.get("message")
        text = question_text(message, 60) if isinstance(message, str) else None
        return str(value["type"]) + (f" ({text!r})" if text else "")
    if isinstance(value, Mapping) and isinstance(value.get("verdict"), str):
        reference = value.get("reference")
        return f"verdict {value['verdict']}" + (
            f" (reference {question_text(reference, 60)})" if isinstance(reference, str) else ""
        )
    return question_text(value, 60)


@dataclass(frozen=True, slots=True)
class AnswerOutcome:
    """What became of an answer to a review that is no longer open."""

    interrupt_id: str | None
    decisions: list[tuple[str, str]]
    """(operation id, recorded decision or verdict) for each call the answer named."""

    def describe(self) -> str:
        """One line: ``already decided: op (approve), ...``."""
        parts = ", ".join(f"{op} ({kind})" for op, kind in self.decisions)
        return f"already decided: {parts}"


RESOLVED = "resolved by the reviewer without running"
"""The reason recorded for each call of a review answered ``Command(goto="__end__")``."""


SUPERSEDED = "Superseded by a new message from the user; the tool was not executed."
"""What a call closed by a follow-up message is answered (``close_for_follow_up``)."""


SUPERSEDED_BY = "effectgate: superseded by a new message"
"""The reviewer the ledger records for an operation a follow-up message withdrew."""


def pending_line(item: PendingLike) -> str:
    """One pending interrupt in words: ``review ID of tool (op)``, a question, a reconciliation."""
    if item.kind == "question":
        return f"question {item.id}: {question_text(item.value.get('question'))}"
    if item.kind == "review":
        calls = ", ".join(
            f"{a.get('name')} ({a.get('operation_id')})"
            for a in item.value.get("action_requests", [])
        )
        return f"review {item.id} of {calls}"
    return (
        f"reconciliation of {item.value.get('tool')} ({item.value.get('operation_id')}), "
        f"attempt {item.value.get('attempt')}"
    )
