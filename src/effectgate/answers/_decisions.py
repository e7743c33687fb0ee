"""Review decisions: shape, count, order, allowed types, edits and responds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from effectgate.answers._texts import _json_kind, _shown
from effectgate.errors import (
    DecisionError,
)

__all__ = [
    "EDIT_NEEDS",
    "RESPOND_NEEDS",
    "check_decision_allowed",
    "check_decision_count",
    "check_review_answer",
    "decision_allowed",
    "decision_object",
    "edited_args",
    "respond_text",
    "review_decisions",
]


def _order_problem(
    request: Mapping[str, Any], named: Sequence[tuple[str, str]], what: str
) -> str | None:
    """The refusal for decisions that name a review's calls in another order, or ``None``."""
    shown = _shown(request)
    if list(named) == shown or sorted(named) != sorted(shown):
        return None
    order = ", ".join(
        f"{a.get('name')} {a.get('operation_id')}" for a in request.get("action_requests", ())
    )
    return (
        f"the decisions for {what} name its calls in another order: it shows {order}; give one "
        "decision per call in that order; this answer ran nothing"
    )


def review_decisions(answer: Any) -> list[Any]:
    """The one shape rule: a review answer is ``{"decisions": [...], ...}``.

    Returns:
        ``answer["decisions"]`` (each entry is checked by the other rules).

    Raises:
        DecisionError: ``answer`` is not a mapping with a ``decisions`` list;
            the refusal shows what was given.
    """
    if not isinstance(answer, Mapping) or not isinstance(answer.get("decisions"), list):
        raise DecisionError(
            'a review answer must look like {"decisions": [{"type": "approve"}, ...]}; '
            f"got {answer!r}"
        )
    return list(answer["decisions"])


def decision_object(decision: Any, subject: str) -> Mapping[str, Any]:
    """The one shape rule for a decision: each entry of ``decisions`` is an object.

    Args:
        decision: one entry of a review answer's ``decisions``.
        subject: what the refusal names, e.g. ``decision 0 for write_file (call_1)``.

    Returns:
        ``decision``, a mapping.

    Raises:
        DecisionError: ``decision`` is not a mapping: ``"<subject>: must be an
            object, got null"`` (its JSON type). Nothing is resumed.
    """
    if not isinstance(decision, Mapping):
        raise DecisionError(f"{subject}: must be an object, got {_json_kind(decision)}")
    return decision


def check_decision_allowed(
    kind: Any, allowed: Sequence[str], *, tool: str, call_id: str, conflict: bool = False
) -> None:
    """The one rule for decision types: ``kind`` must be one the call's review allows.

    Args:
        kind: the decision's ``type``.
        allowed: the call's ``allowed_decisions`` (``decision_allowed``).
        tool: the call's tool name, named in the refusal.
        call_id: the call's ``tool_call_id``, named in the refusal.
        conflict: the call's operation id is bound to other arguments (its
            review allows only ``reject``): the refusal says so.

    Raises:
        DecisionError: ``kind`` is not allowed for this call.
    """
    if not decision_allowed(kind, allowed):
        raise DecisionError(
            f"decision {kind!r} is not allowed for {tool} ({call_id}); allowed: "
            f"{', '.join(allowed)}"
            + (" (the operation id is bound to other arguments)" if conflict else "")
        )


def check_decision_count(given: int, pending: int) -> None:
    """The one count rule: a review answer has one decision per pending call, in order.

    Args:
        given: the number of decisions in the answer.
        pending: the number of calls the review asked about.

    Raises:
        DecisionError: ``given != pending`` (``N decision(s) for M pending
            call(s)``, docs/answers.md); nothing is resumed.
    """
    if given != pending:
        raise DecisionError(
            f"{given} decision(s) for {pending} pending call(s): answer every call, in order"
        )


EDIT_NEEDS = "needs edited_action: {name, args}"
"""The clause of the one edit rule's refusal; ``edited_args`` and the CLI's file check say it."""


def edited_args(decision: Mapping[str, Any], subject: str) -> Mapping[str, Any]:
    """The one edit rule: an ``edit`` carries ``edited_action`` with an ``args`` object.

    Args:
        decision: one decision of a review answer, of type ``edit``.
        subject: what the refusal names, e.g. ``edit of call_1``.

    Returns:
        ``decision["edited_action"]`` (``{"args": {...}, "name": ...?}``).

    Raises:
        DecisionError: ``edited_action`` missing, not an object, or without
            an ``args`` object: ``"<subject> needs edited_action: {name, args}"``.
    """
    edited = decision.get("edited_action")
    if not isinstance(edited, Mapping) or not isinstance(edited.get("args"), Mapping):
        raise DecisionError(f"{subject} {EDIT_NEEDS}")
    return edited


RESPOND_NEEDS = "needs a message: the answer for the model"
"""The clause of the one respond rule's refusal (``respond_text``)."""


def respond_text(decision: Mapping[str, Any], subject: str) -> str:
    """The one respond rule: a ``respond`` carries the person's answer for the model.

    Args:
        decision: one decision of a review answer, of type ``respond``.
        subject: what the refusal names, e.g. ``respond to call_1``.

    Returns:
        ``decision["message"]``, the text the model is given in the tool's place.

    Raises:
        DecisionError: ``message`` missing, not a string, or blank:
            ``"<subject> needs a message: the answer for the model"``. Nothing
            would run for the call, but the model would be told nothing.
    """
    message = decision.get("message")
    if not isinstance(message, str) or not message.strip():
        raise DecisionError(f"{subject} {RESPOND_NEEDS}")
    return message


def decision_allowed(kind: Any, allowed: Sequence[str]) -> bool:
    """Whether a decision type may answer a call whose review allows ``allowed``.

    ``respond`` (LangChain HITL: answer the model in the tool's place) is a
    reject with the person's own text, so it is allowed wherever ``reject`` is.
    """
    return kind in allowed or (kind == "respond" and "reject" in allowed)


def check_review_answer(
    request: Mapping[str, Any], answer: Mapping[str, Any], *, what: str = "this review"
) -> None:
    """Check a review answer's shape against the request before resuming.

    ``what`` names the review in refusals (``review <interrupt id>``).

    Raises:
        DecisionError: not ``{"decisions": [...]}``, wrong count, a decision
            type the request does not allow for that call, or a decision that
            names another call, operation or intent than the one shown.
            Nothing is resumed.
    """
    decisions = review_decisions(answer)
    actions = request.get("action_requests", [])
    configs = request.get("review_configs", [])
    check_decision_count(len(decisions), len(actions))
    named = [
        (str(d.get("operation_id")), str(d.get("intent_hash")))
        for d in decisions
        if isinstance(d, Mapping) and d.get("operation_id") and d.get("intent_hash")
    ]
    if len(named) == len(decisions):
        problem = _order_problem(request, named, what)
        if problem is not None:
            raise DecisionError(problem)
    for number, (action, config, entry) in enumerate(zip(actions, configs, decisions, strict=True)):
        decision = decision_object(
            entry, f"decision {number} for {action['name']} ({action['tool_call_id']})"
        )
        kind = decision.get("type")
        check_decision_allowed(
            kind,
            config.get("allowed_decisions", []),
            tool=action["name"],
            call_id=action["tool_call_id"],
        )
        for key in ("tool_call_id", "operation_id", "intent_hash"):
            given = decision.get(key)
            if given is not None and given != action.get(key):
                raise DecisionError(
                    f"a decision names {key} {given!r} where the review shows "
                    f"{action.get(key)!r} ({action['name']}); this answer ran nothing"
                )
        if kind == "edit":
            edited_args(decision, f"edit of {action['tool_call_id']}")
        if kind == "respond":
            respond_text(decision, f"respond to {action['tool_call_id']}")


def _named_ids(answer: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """The (operation id, intent hash) every decision names, or ``None`` if one names none."""
    decisions = answer.get("decisions")
    if not isinstance(decisions, list) or not decisions:
        return None
    out = []
    for d in decisions:
        if not isinstance(d, Mapping) or not d.get("operation_id") or not d.get("intent_hash"):
            return None
        out.append((str(d["operation_id"]), str(d["intent_hash"])))
    return out
