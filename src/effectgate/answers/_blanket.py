"""The blanket rule: what ``--approve all`` or ``--approve none`` may answer for a person.

A blanket answer approves (or rejects) every call of a review, bound to the
review as read (``bind_decisions``). It never takes a call whose allowed
decisions exclude it (a conflicting operation id allows only edit or
reject), and ``all`` never approves a call that carries a warning flag
(``REVIEW_FLAGS``: a possible duplicate, a repeat of a rejected call, a
compacted id, an edited-away call, a damaged row of the same intent): the
whole review is then left for a person. The CLI words the note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from effectgate.answers._shown_flags import bind_decisions, flags_of

__all__ = ["BlanketAnswer", "blanket_answer"]


@dataclass(frozen=True, slots=True)
class BlanketAnswer:
    """What a blanket answer does with one review request."""

    answer: dict[str, Any] | None
    """The bound review answer, or ``None``: the review is left for a person."""
    left: Mapping[str, Any] | None = None
    """The call that stopped it (an ``action_requests`` entry), when ``answer`` is ``None``."""
    allowed: list[str] = field(default_factory=list)
    """That call's allowed decisions, when the blanket decision is not among them."""
    flags: list[str] = field(default_factory=list)
    """That call's warning flags, when ``all`` would have approved it."""


def blanket_answer(
    request: Mapping[str, Any], *, approve: bool, reviewer: str, message: str
) -> BlanketAnswer:
    """Answer every call of ``request`` one way, or leave the review for a person.

    Args:
        request: the review request as shown.
        approve: ``True`` approves every call (``--approve all``), ``False``
            rejects every call (``--approve none``).
        reviewer: recorded on the approvals.
        message: told to the model for each rejected call.

    Returns:
        A ``BlanketAnswer``: the answer bound to the calls read
        (``bind_decisions``), or ``None`` with the first call that stops it:
        a decision its review does not allow (``allowed``), or, for
        ``approve``, a warning flag it carries (``flags``).
    """
    wanted = "approve" if approve else "reject"
    decisions: list[dict[str, Any]] = []
    actions = request.get("action_requests", [])
    configs = request.get("review_configs", [])
    for action, config in zip(actions, configs, strict=True):
        allowed = list(config.get("allowed_decisions", []))
        if wanted not in allowed:
            return BlanketAnswer(answer=None, left=action, allowed=allowed)
        flags = flags_of(action)
        if approve and flags:
            return BlanketAnswer(answer=None, left=action, flags=flags)
        if approve:
            decisions.append({"type": "approve", "tool_call_id": action["tool_call_id"]})
        else:
            decisions.append(
                {"type": "reject", "tool_call_id": action["tool_call_id"], "message": message}
            )
    # Each answer names the call, operation and intent it was read for.
    return BlanketAnswer(
        answer=bind_decisions(request, {"decisions": decisions, "reviewer": reviewer})
    )
