"""Binding to what was shown: the warning flags a call carried when it was reviewed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "REVIEW_FLAGS",
    "bind_decisions",
    "bind_shown_flags",
    "description_flags",
    "flag_text",
    "flags_of",
    "new_flags",
    "review_description",
]


REVIEW_FLAGS = (
    "possible_duplicate_of",
    "repeat_of_rejected",
    "compacted_operation",
    "replaced_by_edit",
    "unreadable_same_intent",
)
"""The warnings a review request may carry about a call, which no policy approves past."""


def flag_text(action: Mapping[str, Any], flag: str) -> str:
    """What one of ``REVIEW_FLAGS`` says about the call, in words (for refusals and notes).

    The one wording of each flag: the review node's refusal of an approval
    given without a flag, ``--approve all``'s note when it leaves a flagged
    call for a person, and the review screen all say it this way. It reads
    as the end of "the call is ...".

    Args:
        action: one action request of a review (its flags as the review node set them).
        flag: one of ``REVIEW_FLAGS``.

    Raises:
        KeyError: ``flag`` is not one of ``REVIEW_FLAGS``.
    """
    value = action.get(flag)
    if flag == "possible_duplicate_of":
        return f"a possible duplicate of {value}"
    if flag == "repeat_of_rejected":
        if isinstance(value, Mapping):
            return (
                f"a repeat of {value.get('operation_id')}, which a reviewer rejected "
                f"({value.get('reason')})"
            )
        return "a repeat of a rejected call"
    if flag == "compacted_operation":
        if isinstance(value, Mapping) and value.get("message"):
            return f"an operation compacted by retention: {value.get('message')}"
        return "an operation compacted by retention"
    if flag == "replaced_by_edit":
        return f"a call a reviewer's edit replaced (operation {value})"
    if flag == "unreadable_same_intent":
        ids = ", ".join(str(d.get("operation_id")) for d in value or () if isinstance(d, Mapping))
        return f"of the same intent as ledger row(s) that cannot be read ({ids})"
    raise KeyError(flag)


DESCRIPTION_WARNING = "WARNING: this call is "
"""How each flag's line in a review's ``description`` begins (then ``flag_text``)."""


def review_description(prefix: str, action: Mapping[str, Any]) -> str:
    r"""The standard HITL ``description`` of one call: all a reviewer must see, as text.

    A client that renders only LangChain's HITL request (Agent Chat UI, Agent
    Inbox, Studio) shows the tool name, the arguments, the allowed decisions
    and this text, and none of effectgate's own fields. So the text carries
    them, warnings first: one line per flag of ``REVIEW_FLAGS`` the call
    carries (``WARNING: this call is <flag_text>.``), one for an operation id
    bound to other arguments, then ``prefix``, the preview, the effect kind
    and the operation id. A decision given to a request without
    ``flags_shown`` counts as given with the flags this text carried
    (``bind_decisions``).

    Args:
        prefix: the policy's opening line (``Policy.description_prefix``).
        action: the action request, its flags, ``preview``, ``effect_kind``,
            ``name`` and ``operation_id`` already set.

    Returns:
        The description, lines separated by ``\n``.
    """
    lines = [f"{DESCRIPTION_WARNING}{flag_text(action, flag)}." for flag in flags_of(action)]
    conflict = action.get("conflict")
    if isinstance(conflict, Mapping):
        lines.append(
            f"WARNING: operation {action.get('operation_id')} is bound to other arguments "
            f"(state {conflict.get('stored_state')}): it cannot be approved as it stands; "
            "edit it back to its recorded arguments, or reject it."
        )
    if lines:
        lines.append("")
    lines.append(prefix)
    preview = action.get("preview")
    if isinstance(preview, str) and preview.strip():
        lines += ["", "Preview:", preview.rstrip("\n")]
    lines += [
        "",
        f"Tool: {action.get('name')} (effect kind: {action.get('effect_kind')})",
        f"Operation: {action.get('operation_id')}",
    ]
    return "\n".join(lines)


def flags_of(action: Mapping[str, Any]) -> list[str]:
    """The ``REVIEW_FLAGS`` set on one action request, in ``REVIEW_FLAGS`` order."""
    return [flag for flag in REVIEW_FLAGS if action.get(flag)]


def new_flags(action: Mapping[str, Any], decision: Mapping[str, Any]) -> list[str]:
    """The flags ``action`` carries now that the approving ``decision`` was not shown.

    A decision bound by ``bind_decisions`` says which flags it was given
    with (``flags_shown``). A call that became a possible duplicate (or a
    repeat, or compacted) after the review was shown was approved without
    that warning: the review must be asked again. A raw LangGraph client's
    decision is first bound to the flags its request's description showed
    (``bind_shown_flags``); one bound to nothing names no ``flags_shown``
    and is not judged by this rule.
    """
    shown = decision.get("flags_shown")
    if not isinstance(shown, list):
        return []
    return [flag for flag in flags_of(action) if flag not in shown]


def bind_decisions(request: Mapping[str, Any], answer: Mapping[str, Any]) -> dict[str, Any]:
    """Bind each decision of ``answer`` to the call of ``request`` it answers, in order.

    For a client that reads a review and answers it (``--approve all``, a
    terminal, a decisions file): every decision gains the ``tool_call_id``,
    ``operation_id`` and ``intent_hash`` it was given for, and the warnings
    it was shown with (``flags_shown``, see ``new_flags``). A decision that
    already names other ids keeps them (and is refused if they differ).

    Args:
        request: the review request as shown.
        answer: ``{"decisions": [...], ...}`` in ``action_requests`` order.

    Returns:
        A copy of ``answer`` with bound decisions.
    """
    actions = list(request.get("action_requests", ()))
    decisions = answer.get("decisions")
    if not isinstance(decisions, list):
        return dict(answer)
    bound = []
    for decision, action in zip(decisions, actions, strict=False):
        if not isinstance(decision, Mapping):
            bound.append(decision)
            continue
        ids: dict[str, Any] = {
            k: action[k] for k in ("tool_call_id", "operation_id", "intent_hash") if k in action
        }
        ids["flags_shown"] = flags_of(action)
        bound.append({**ids, **decision})
    bound += decisions[len(actions) :]
    return {**answer, "decisions": bound}


def description_flags(action: Mapping[str, Any]) -> list[str]:
    """The ``REVIEW_FLAGS`` whose warning the action's ``description`` carries, as shown.

    ``review_description`` writes one ``WARNING: this call is <flag_text>.``
    line per flag; this reads them back against the action's own flags, so
    a description that did not carry a flag (an older request, a client's
    own text) does not count as having shown it.
    """
    text = action.get("description")
    if not isinstance(text, str):
        return []
    return [
        flag
        for flag in flags_of(action)
        if f"{DESCRIPTION_WARNING}{flag_text(action, flag)}." in text
    ]


def bind_shown_flags(request: Mapping[str, Any], answer: Any) -> Any:
    """Bind a raw client's decisions to the warnings the request's descriptions showed.

    A raw LangGraph client (Agent Chat UI, ``langgraph_sdk``) answers
    ``{"decisions": [{"type": "approve"}]}`` and names no ``flags_shown``;
    what it showed the reviewer is the standard request, whose
    ``description`` carries the warnings (``review_description``). Each such
    decision gains ``flags_shown``: the flags its call's description carried
    (``description_flags``), so an approval of a call that gained a warning
    after it was shown is asked again (``new_flags``), as for the CLI. Only
    approvals are bound (the only decision a warning can invalidate); a
    decision that names ``flags_shown`` keeps it.

    Args:
        request: the review request as it was shown (the interrupt's value).
        answer: the resume value given for it.

    Returns:
        ``answer`` with bound decisions, or ``answer`` itself when it is not
        ``{"decisions": [...]}``.
    """
    if not isinstance(answer, Mapping) or not isinstance(answer.get("decisions"), list):
        return answer
    actions = list(request.get("action_requests", ()))
    bound = [
        {**d, "flags_shown": description_flags(a)}
        if isinstance(d, Mapping) and d.get("type") == "approve" and "flags_shown" not in d
        else d
        for d, a in zip(answer["decisions"], actions, strict=False)
    ]
    return {**answer, "decisions": bound + answer["decisions"][len(actions) :]}
