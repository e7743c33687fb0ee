"""The answer protocol: how a person's answer reaches the call it was given for.

One home for the rules every answer path follows (the review node, the effect
node's verdicts, ``Agent.resume``, the CLI, ``Dispatcher.apply_verdict``):

- **Bound.** A review answer names what it answers: the interrupt id it was
  shown under (``"interrupt_id"``), or, per decision, the ``operation_id``
  and ``intent_hash`` shown. An answer that names nothing is refused with the
  pending reviews listed; it is never guessed onto whatever waits now.
- **Each interrupt on its own.** Several pending interrupts are answered by a
  map from interrupt id to answer, as LangGraph's ``Command(resume={id:
  value})``; a partial map leaves the others pending.
- **Idempotent.** The same answer to a review that is already decided returns
  the recorded outcome; a different one is refused, naming the recorded
  decision, and the refusal is written to the ledger as an event.
- **Verdicts.** One validation (``VerdictModel``, pydantic) on every path;
  a verdict is bound to the attempt it was given for.
- **Follow-ups.** A new human message while calls wait for an answer is
  judged by one rule (``follow_up_plan``) on every path (``Agent.send``, the
  graph's agent node a LangGraph client's new input reaches, the
  middleware's ``before_model``): calls whose operation provably never
  started are closed as superseded (``close_for_follow_up``); anything that
  may have started, or a reconciliation, refuses the message
  (``FollowUpError``).

The raw compiled graph keeps LangGraph's own ``Command(resume=...)`` rules:
these rules bind effectgate's own API and CLI. Imports no LangGraph.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NoReturn, Protocol, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from effectgate.errors import (
    DecisionError,
    FollowUpError,
    OrphanedOperationError,
    UnknownInterruptError,
)
from effectgate.ledger import UNFINISHED, Approval, Ledger, Operation, OpState

__all__ = [
    "RESOLVED",
    "SUPERSEDED",
    "SUPERSEDED_BY",
    "AnswerOutcome",
    "Closing",
    "OpenCall",
    "OneAnswerEach",
    "PendingLike",
    "REVIEW_FLAGS",
    "Resolution",
    "Verdict",
    "VerdictModel",
    "answer_summary",
    "as_payload",
    "bind_decisions",
    "bind_shown_flags",
    "EDIT_NEEDS",
    "check_decision_allowed",
    "check_decision_count",
    "check_no_orphans",
    "check_resume_ids",
    "check_unkeyed_resume",
    "refuse_resume_of_idle",
    "check_review_answer",
    "close_for_follow_up",
    "decision_allowed",
    "describe_pending",
    "edited_args",
    "RESPOND_NEEDS",
    "respond_text",
    "description_flags",
    "flag_text",
    "flags_of",
    "follow_up_plan",
    "is_resume_map",
    "never_started",
    "new_flags",
    "orphaned_operations",
    "pending_line",
    "question_text",
    "recorded_decision",
    "recorded_verdict",
    "resolve",
    "review_decisions",
    "review_description",
    "settle_stale",
    "settle_verdict",
    "validate_verdict",
    "decision_object",
    "verdict_attempt_problem",
]

DecisionKind = Literal["approve", "edit", "reject"]

_STARTED = frozenset(
    {OpState.IN_FLIGHT, OpState.UNKNOWN, OpState.NEEDS_RECONCILIATION, OpState.SUCCEEDED}
)
"""States in which the effect may have happened: a reject can no longer stop it."""


class Verdict(TypedDict, total=False):
    """A human's verdict on a NEEDS_RECONCILIATION operation (resume value).

    ``verdict`` is required. ``attempt`` binds the verdict to the attempt it
    was asked about, so a stored answer is never applied to a later question.
    """

    verdict: Literal["succeeded", "failed", "retry", "ledger"]
    attempt: int
    reference: str
    """For ``succeeded``: the external reference the human checked (ticket id...)."""
    evidence: str
    acknowledge_duplicate_risk: bool
    """Required ``True`` for ``retry``: a repeat may duplicate the effect."""
    reviewer: str


class VerdictModel(BaseModel):
    """A person's verdict on an operation whose outcome nobody could know.

    Known keys only. ``reference`` (for ``succeeded``) is a non-empty string;
    ``retry`` needs ``acknowledge_duplicate_risk: true``; ``attempt`` binds the
    verdict to the attempt it was asked about, so it is never applied to a
    later question.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    verdict: Literal["succeeded", "failed", "retry", "ledger"]
    attempt: StrictInt | None = None
    reference: StrictStr | None = None
    evidence: StrictStr | None = None
    acknowledge_duplicate_risk: StrictBool = False
    reviewer: StrictStr | None = None

    @model_validator(mode="after")
    def _rules(self) -> VerdictModel:
        if self.reference is not None and not self.reference.strip():
            raise ValueError("reference must be a non-empty string")
        if self.verdict == "succeeded" and self.reference is None:
            raise ValueError("verdict 'succeeded' needs a reference: the evidence you checked")
        if self.verdict == "retry" and not self.acknowledge_duplicate_risk:
            raise ValueError(
                "verdict 'retry' needs acknowledge_duplicate_risk: true; the earlier attempt "
                "may have taken effect, and a retry may duplicate it"
            )
        if self.attempt is not None and self.attempt < 0:
            raise ValueError("attempt must be >= 0")
        return self


def validate_verdict(value: Any) -> Verdict:
    """Validate a reconciliation verdict (the one check every path uses).

    Args:
        value: a mapping such as ``{"verdict": "succeeded", "reference":
            "TICKET-7"}``.

    Returns:
        The verdict as a ``Verdict`` mapping, without unset keys.

    Raises:
        DecisionError: not a mapping, an unknown key or verdict, a
            ``reference`` that is not a non-empty string, ``succeeded``
            without a reference, or ``retry`` without the acknowledgement.
    """
    if not isinstance(value, Mapping):
        raise DecisionError(f"a reconciliation verdict must be an object, got {value!r}")
    try:
        model = VerdictModel.model_validate(dict(value))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'verdict'}: {err['msg']}"
            for err in exc.errors()
        )
        raise DecisionError(f"verdict refused: {problems}") from None
    out = model.model_dump(exclude_none=True)
    if not model.acknowledge_duplicate_risk:
        out.pop("acknowledge_duplicate_risk", None)
    verdict: Verdict = out  # type: ignore[assignment]
    return verdict


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


def check_resume_ids(
    named: Collection[str], *, known: Collection[str], pending: Mapping[str, Any]
) -> None:
    """Refuse a resume map that names an interrupt the thread is not waiting on.

    Every interrupt is answered by its own id (``Command(resume={id:
    value})``). LangGraph drops a key that names no interrupt and runs the
    node again, which asks the same question again: the answer would be lost
    without a word. The rule for every path that takes a resume map (the
    graph's nodes, for a LangGraph client such as ``langgraph dev``'s;
    ``resume_command``): each key must name an interrupt the thread raised,
    and an empty map answers nothing.

    Args:
        named: the keys of the resume map.
        known: the interrupt ids the map may name (those recorded on the
            checkpoint it resumes: pending, or answered in the same step).
        pending: interrupt id -> interrupt value, for the ones still waiting
            (named in the refusal).

    Raises:
        UnknownInterruptError: the map is empty or names an unknown id; one line
            naming the unknown id(s) and the pending interrupts. Nothing was
            applied; the pending interrupts can still be answered.
    """
    waiting = describe_pending([_Raised(i, v) for i, v in pending.items()])
    if not named:
        raise UnknownInterruptError(
            f"resume refused: the resume map names no interrupt; nothing was applied. {waiting}"
        )
    unknown = [i for i in named if i not in known]
    if unknown:
        listed = ", ".join(repr(i) for i in unknown)
        verb = "is" if len(unknown) == 1 else "are"
        raise UnknownInterruptError(
            f"resume refused: interrupt {listed} {verb} not pending on this thread "
            f"(another thread's, already answered, or mistyped); nothing was applied. {waiting}"
        )


_ID_SHAPE = re.compile(r"[0-9a-f]{32}")
"""What LangGraph reads as an interrupt id in a resume map (``is_xxh3_128_hexdigest``)."""


def is_resume_map(resume: Any) -> bool:
    """Whether LangGraph reads ``Command(resume=resume)`` as a map by interrupt id.

    LangGraph's rule: a dict every key of which is shaped like an interrupt id
    (32 hex digits); an empty dict is a map that names nothing. Any other value
    is the plain answer of the one pending interrupt.

    Args:
        resume: the ``Command.resume`` value.

    Returns:
        ``True`` for such a map.
    """
    return isinstance(resume, Mapping) and all(_ID_SHAPE.fullmatch(str(k)) for k in resume)


def refuse_resume_of_idle(resume: Any, *, step_left: bool = False) -> NoReturn:
    """Refuse a resume sent to a thread that waits on no interrupt and has nothing to run.

    LangGraph runs no node for it (there is no task) and returns the state as
    it was: a second client's late answer to a review answered elsewhere, or
    an answer to a finished thread, was accepted without a word. The served
    graph (``effectgate.server``) checks the thread's head before such a run;
    ``Agent.resume`` words the same case as "already decided" or "nothing is
    pending".

    ``step_left``: the head's last step has tasks that finished (their writes
    are kept on the checkpoint: the review answered, the approved calls sent
    to their effect nodes) but no checkpoint after them, because the run that
    made them was stopped (``runs.cancel(..., action="rollback")`` deletes
    the run's checkpoints, not the writes it attached to the one it started
    from). ``get_state`` then lists no task and no interrupt, and the server
    shows the thread ``idle``, yet a run with no input finishes that step
    (the effect nodes read what already ran back from the ledger). The
    refusal says so instead of "finished".

    Args:
        resume: the ``Command.resume`` value (a map by interrupt id, or a plain answer).
        step_left: the head holds the finished tasks of a step cut short.

    Raises:
        UnknownInterruptError: always; one line, naming the ids the map gave.
    """
    if step_left:
        named = (
            f" (interrupt {', '.join(repr(str(k)) for k in resume)})"
            if resume and is_resume_map(resume)
            else ""
        )
        raise UnknownInterruptError(
            f"resume refused: this thread waits on no interrupt{named}: its last review was "
            "answered and its step began, but the run was stopped before the step's checkpoint "
            "(cancelled or rolled back); nothing was applied. Run the thread with no input and "
            "no command to finish that step: an effect that already ran is read back from the "
            "ledger, not run again"
        )
    if resume and is_resume_map(resume):
        check_resume_ids(list(resume), known=(), pending={})
    raise UnknownInterruptError(
        "resume refused: this thread waits on no interrupt (finished, or its review was "
        "answered elsewhere); nothing was applied. " + describe_pending([])
    )


_ANSWER_FIELDS = {
    "review": frozenset({"decisions", "reviewer", "shown", "shown_operations", "interrupt_id"}),
    "reconciliation": frozenset(VerdictModel.model_fields),
}
"""The fields an answer to each of effectgate's own interrupts may have (docs/answers.md)."""


def check_unkeyed_resume(value: Any, *, kind: str, pending: Mapping[str, Any]) -> None:
    """Refuse a plain resume value that is really a resume map keyed by a non-id.

    LangGraph reads ``Command(resume={key: value})`` as a map only when every
    key is shaped like an interrupt id (32 hex digits); any other key makes the
    whole dict the answer of the one pending interrupt. A client that keys its
    answer by a mistyped or made-up id (``{"review-1": {"decisions": [...]}}``)
    then handed the review a dict it never meant as the answer: the run went on
    and asked again, and the client saw no error. The same refusal as an
    unknown id (``check_resume_ids``) applies: a dict none of whose keys is a
    field of this kind of answer, whose values are all answers (mappings or
    strings), is such a map.

    Args:
        value: the plain (non-map) resume value waiting for the interrupt.
        kind: the interrupt's ``type``: ``"review"`` or ``"reconciliation"``;
            any other kind (a tool's own question) takes any value unchanged.
        pending: interrupt id -> interrupt value, for the ones still waiting.

    Raises:
        UnknownInterruptError: ``value`` is such a map; one line naming its
            keys and the pending interrupts. Nothing was applied.
    """
    fields = _ANSWER_FIELDS.get(kind)
    if fields is None or not isinstance(value, Mapping) or not value:
        return
    if any(k in fields for k in value) or not all(
        isinstance(v, (Mapping, str)) for v in value.values()
    ):
        return  # an answer (maybe a wrong one, which the node words and asks again)
    waiting = describe_pending([_Raised(i, v) for i, v in pending.items()])
    listed = ", ".join(repr(str(k)) for k in value)
    verb = "is not an interrupt id" if len(value) == 1 else "are not interrupt ids"
    raise UnknownInterruptError(
        f"resume refused: {listed} {verb} (LangGraph read the map as the "
        f"answer itself; answer with the interrupt's 32-hex-digit id); nothing was applied. "
        f"{waiting}"
    )


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


_NOT_PART_OF_THE_ANSWER = frozenset({"reviewer", "interrupt_id"})


_BINDING = ("tool_call_id", "operation_id", "intent_hash")


def _answer_key(value: Any) -> str:
    """Canonical text of an answer for comparison; who gave it and what binds it aside."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in _NOT_PART_OF_THE_ANSWER}
        if isinstance(value.get("decisions"), list):
            value["decisions"] = [
                {k: v for k, v in d.items() if k not in _BINDING} if isinstance(d, Mapping) else d
                for d in value["decisions"]
            ]
    return json.dumps(value, sort_keys=True, default=repr)


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


class OneAnswerEach:
    """One input, one answer per thing: a repeat is one answer, a contradiction is refused.

    A decisions file, or the ``answers``, ``decisions`` and ``verdicts`` given
    to one ``Agent.resume`` call, may name one review, call, operation or
    question more than once. Which of two different answers was meant cannot
    be known, so the whole input is refused; applying the last one (a dict
    update) would run a call a reject in the same input was meant to stop.

    Args:
        where: names the input in refusals (``decisions file F``).
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._seen: dict[str, tuple[str, str, Any]] = {}

    def add(self, thing: str, value: Any, source: str) -> bool:
        """Note that ``source`` answers ``thing`` with ``value``.

        Args:
            thing: what is answered, as named in refusals (``review ID``,
                ``call OP``, ``operation OP``, ``question ID``).
            value: the answer (compared without ``reviewer`` or ``interrupt_id``).
            source: where in the input it was given (``entry 0``, ``answers``).

        Returns:
            ``True`` the first time ``thing`` is answered, ``False`` for the
            same answer again (a repeat, to be used once).

        Raises:
            DecisionError: ``thing`` already has a different answer; the
                message names both, in one line. Nothing ran.
        """
        key = _answer_key(value)
        seen = self._seen.get(thing)
        if seen is None:
            self._seen[thing] = (key, source, value)
            return True
        if seen[0] == key:
            return False
        raise DecisionError(
            f"{self.where}: two different answers for {thing}: {seen[1]} gives "
            f"{answer_summary(seen[2])}, {source} gives {answer_summary(value)}; which one "
            "was meant is unknown, so neither is used"
        )


@dataclass(slots=True)
class Resolution:
    """How a client's answers map onto what is pending."""

    resume: dict[str, Any] = field(default_factory=dict)
    """Interrupt id -> resume value, for the pending interrupts answered."""
    stale: list[tuple[str | None, Mapping[str, Any]]] = field(default_factory=list)
    """Review answers bound to nothing pending: (interrupt id named or ``None``, answer)."""
    settled: list[AnswerOutcome] = field(default_factory=list)
    """Verdicts re-sent for operations already settled the same way (``settle_verdict``)."""


def _review_value(item: PendingLike, answer: Mapping[str, Any]) -> dict[str, Any]:
    check_review_answer(item.value, answer, what=f"review {item.id}")
    shown = _shown(item.value)
    clean = {k: v for k, v in bind_shown_flags(item.value, answer).items() if k != "interrupt_id"}
    return {
        **clean,
        "shown": [h for _, h in shown],
        "shown_operations": [o for o, _ in shown],
    }


def _verdict_value(item: PendingLike, given: Any, ledger: Ledger) -> dict[str, Any]:
    op_id = str(item.value.get("operation_id"))
    op = ledger.get(op_id)
    if op is not None and op.state is not OpState.NEEDS_RECONCILIATION:
        # Settled outside the graph (``effectgate reconcile``): the node re-reads it.
        return {"verdict": "ledger", "attempt": op.attempt}
    if not isinstance(given, Mapping):
        raise DecisionError(f"the verdict for {op_id} must be an object, got {given!r}")
    bound = {"attempt": item.value.get("attempt"), **given}
    return dict(validate_verdict(bound))


def resolve(
    pending: Sequence[PendingLike],
    *,
    ledger: Ledger,
    decisions: Mapping[str, Any] | None = None,
    verdicts: Mapping[str, Any] | None = None,
    answers: Mapping[str, Any] | None = None,
) -> Resolution:
    """Map a client's answers onto the pending interrupts, never guessing.

    Args:
        pending: the thread's open interrupts.
        ledger: read for operations settled outside the graph.
        decisions: one review answer, bound by ``"interrupt_id"`` or by each
            decision's ``operation_id`` and ``intent_hash``.
        verdicts: reconciliation verdicts by operation id.
        answers: interrupt id -> answer (a review answer or a verdict).

    Returns:
        The resume map for the interrupts answered (others stay pending), and
        the review answers that match nothing pending (for ``settle_stale``).

    Raises:
        DecisionError: an unbound review answer (the message lists what is
            pending), a verdict for an operation nothing asks about, or an
            answer of the wrong shape. Nothing is resumed.
        UnknownInterruptError: ``answers`` is an empty map (it names no interrupt).
    """
    by_id = {item.id: item for item in pending}
    if answers is not None and not answers:  # an empty map answers nothing
        check_resume_ids([], known=by_id, pending={i.id: i.value for i in pending})
    res = Resolution()
    # ``answers``, ``decisions`` and ``verdicts`` may name one interrupt twice:
    # the same answer is one answer, two different ones refuse the call.
    one = OneAnswerEach("Agent.resume")
    if decisions is not None and isinstance(decisions.get("interrupt_id"), str):
        one.add(f"review {decisions['interrupt_id']}", decisions, "decisions")
    for interrupt_id, answer in (answers or {}).items():
        item = by_id.get(interrupt_id)
        if item is None:
            if isinstance(answer, Mapping) and "decisions" in answer:
                if one.add(f"review {interrupt_id}", answer, f"answers[{interrupt_id}]"):
                    res.stale.append((interrupt_id, answer))
                continue
            raise DecisionError(
                f"interrupt {interrupt_id} is not pending; {describe_pending(pending)}"
            )
        if item.kind == "review":
            if not isinstance(answer, Mapping):
                raise DecisionError('a review answer must look like {"decisions": [...]}')
            one.add(f"review {item.id}", answer, f"answers[{interrupt_id}]")
            res.resume[item.id] = _review_value(item, answer)
        elif item.kind == "question":
            res.resume[item.id] = answer  # a tool's own question: its answer, unchanged
        else:
            value = _verdict_value(item, answer, ledger)
            one.add(f"reconciliation {item.id}", value, f"answers[{interrupt_id}]")
            res.resume[item.id] = value
    if decisions is not None:
        meant = decisions.get("interrupt_id")
        if not (meant in res.resume or any(i == meant for i, _ in res.stale)):
            _resolve_decisions(pending, decisions, res, one)
    _resolve_verdicts(pending, verdicts or {}, ledger, res, one)
    return res


def _resolve_verdicts(
    pending: Sequence[PendingLike],
    verdicts: Mapping[str, Any],
    ledger: Ledger,
    res: Resolution,
    one: OneAnswerEach,
) -> None:
    asked = {str(i.value.get("operation_id")): i for i in pending if i.kind == "reconciliation"}
    for op_id in sorted(set(verdicts) - set(asked)):
        # Not asked now: the same verdict again returns the recorded outcome.
        given = verdicts[op_id]
        outcome = None
        if ledger.get(op_id) is not None and isinstance(given, Mapping):
            outcome = settle_verdict(ledger, op_id, validate_verdict(given), pending=pending)
        if outcome is None:
            raise DecisionError(
                f"no pending reconciliation for operation {op_id} in this thread; "
                f"{describe_pending(pending)}"
            )
        res.settled.append(outcome)
    for op_id, given in verdicts.items():
        if op_id not in asked:
            continue
        item = asked[op_id]
        value = _verdict_value(item, given, ledger)
        one.add(f"reconciliation {item.id}", value, f"verdicts[{op_id}]")
        res.resume[item.id] = value
    # A reconciliation settled outside the graph (``effectgate reconcile``)
    # needs no answer: its node re-reads the ledger.
    for item in asked.values():
        if item.id not in res.resume:
            op = ledger.get(str(item.value.get("operation_id")))
            if op is not None and op.state is not OpState.NEEDS_RECONCILIATION:
                res.resume[item.id] = {"verdict": "ledger", "attempt": op.attempt}


def _resolve_decisions(
    pending: Sequence[PendingLike],
    decisions: Mapping[str, Any],
    res: Resolution,
    one: OneAnswerEach,
) -> None:
    reviews = [i for i in pending if i.kind == "review"]
    meant = decisions.get("interrupt_id")
    if meant is not None:
        for item in reviews:
            if item.id == meant:
                res.resume[item.id] = _review_value(item, decisions)
                return
        res.stale.append((str(meant), decisions))
        return
    named = _named_ids(decisions)
    if named is None:
        raise DecisionError(
            "this review answer names no review: give the interrupt id it answers "
            '("interrupt_id") or, in each decision, the "operation_id" and "intent_hash" '
            f"shown; this answer ran nothing. {describe_pending(pending)}"
        )
    for item in reviews:
        if _shown(item.value) == named:
            if one.add(f"review {item.id}", decisions, "decisions"):
                res.resume[item.id] = _review_value(item, decisions)
            return
    for item in reviews:
        problem = _order_problem(item.value, named, f"review {item.id}")
        if problem is not None:
            raise DecisionError(f"{problem}. {describe_pending(pending)}")
    res.stale.append((None, decisions))


def recorded_decision(
    ledger: Ledger, thread_id: str, action: Mapping[str, Any]
) -> tuple[DecisionKind, str] | None:
    """The decision already recorded for one shown call, or ``None`` if it is open.

    Args:
        ledger: read for the operation and its approvals.
        thread_id: the thread that showed the call.
        action: one ``action_requests`` entry as shown.

    Returns:
        ``(decision, reviewer)`` of the latest approval this very call (thread
        and tool-call id) recorded on the operation shown for the intent
        shown, or ``None``.
    """
    op_id = str(action.get("operation_id"))
    for approval in reversed(ledger.approvals(op_id)):
        if (approval.thread_id, approval.tool_call_id) != (thread_id, action.get("tool_call_id")):
            continue
        if approval.intent_hash != action.get("intent_hash") and approval.decision != "edit":
            continue
        return approval.decision, approval.reviewer
    return None


def is_decided(ledger: Ledger, thread_id: str, request: Mapping[str, Any]) -> bool:
    """Whether an interrupt's answer is already recorded in the ledger, so no person is needed.

    A runner can die between recording an answer and writing the checkpoint
    that moves past the interrupt; the interrupt then still stands in the
    checkpoint, but its node reads the recorded answer back when it runs
    again, so the thread is unfinished work, not waiting for anyone.

    - A review: every call's operation holds this call's recorded decision
      and has moved past PROPOSED (an approval withdrawn because it expired
      puts it back to PROPOSED: that review is open again).
    - A reconciliation: a verdict for the very attempt it asked about is
      recorded (``recorded_verdict``); the effect node then finds the
      operation settled, or retrying under a later attempt.
    - Anything else (a tool's question): never; its answer lives only in the
      checkpoint.

    Args:
        ledger: read for the operations, approvals and verdict events.
        thread_id: the thread that raised the interrupt.
        request: the interrupt's value.

    Returns:
        ``True`` if the recorded answer settles the interrupt.
    """
    if request.get("type") == "reconciliation":
        attempt = request.get("attempt")
        op_id = request.get("operation_id")
        if not isinstance(attempt, int) or not isinstance(op_id, str):
            return False
        return recorded_verdict(ledger, op_id, attempt) is not None
    if request.get("type", "review") != "review":
        return False
    actions = list(request.get("action_requests", ()))
    if not actions:
        return False
    for action in actions:
        op = ledger.get(str(action.get("operation_id")))
        if op is None or op.state is OpState.PROPOSED:
            return False
        if recorded_decision(ledger, thread_id, action) is None:
            return False
    return True


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


def _answered_actions(
    answer: Mapping[str, Any], shown: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The calls a stale answer is for: those shown, or those its decisions name."""
    if shown is not None:
        return [dict(a) for a in shown.get("action_requests", ())]
    named = _named_ids(answer) or []
    actions: list[dict[str, Any]] = [{"operation_id": o, "intent_hash": h} for o, h in named]
    for action, d in zip(actions, answer.get("decisions") or [], strict=False):
        if isinstance(d, Mapping):
            action["tool_call_id"] = d.get("tool_call_id")
    return actions


def settle_stale(
    ledger: Ledger,
    thread_id: str,
    answer: Mapping[str, Any],
    shown: Mapping[str, Any] | None,
    *,
    interrupt_id: str | None,
    pending: Sequence[PendingLike],
) -> AnswerOutcome:
    """Judge an answer to a review that is not pending any more.

    The same answer as the one recorded returns the recorded outcome; a
    different one is refused, naming the recorded decision, and the refusal
    is written to the ledger (``Ledger.note``: who, what was refused, why;
    the event carries the time).

    Args:
        ledger: read for the recorded decisions, written for refusals.
        thread_id: the thread.
        answer: the client's review answer.
        shown: the review request the answer was given for (from the thread's
            history), or ``None`` when only the decisions name it.
        interrupt_id: the interrupt the answer named, if any.
        pending: what is pending now (named in refusals).

    Returns:
        The recorded outcome when the answer agrees with it.

    Raises:
        DecisionError: nothing known was shown under that id, the review has
            no recorded decision, or the answer contradicts the recorded one.
    """
    decisions = answer.get("decisions")
    actions = _answered_actions(answer, shown)
    what = f"review {interrupt_id}" if interrupt_id else "the review these decisions name"
    if shown is not None and actions and isinstance(decisions, list):
        if len(decisions) != len(actions):
            # The thread showed this review: say what does not fit, not "never shown".
            raise DecisionError(
                f"this answer is for {what}, which is not pending (no longer open); it "
                f"showed {len(actions)} call(s), this answer gives {len(decisions)} "
                f"decision(s); this answer ran nothing. {describe_pending(pending)}"
            )
    elif not actions or not isinstance(decisions, list) or len(decisions) != len(actions):
        raise DecisionError(
            f"this answer is for {what}, which is not pending (answered elsewhere, or not a "
            f"review of this thread); this answer ran nothing. {describe_pending(pending)}"
        )
    recorded: list[tuple[str, str]] = []
    contradictions = []
    for action, decision in zip(actions, decisions, strict=True):
        op_id = str(action.get("operation_id"))
        asked = action
        if asked.get("tool_call_id") is None:
            op = ledger.get(op_id)
            asked = {**asked, "tool_call_id": op.tool_call_id if op else None}
        found = recorded_decision(ledger, thread_id, asked)
        if found is None:
            raise DecisionError(
                f"this answer is for {what}, which is not pending and has no recorded "
                f"decision for {op_id}; this answer ran nothing. {describe_pending(pending)}"
            )
        kind, reviewer = found
        given = decision.get("type") if isinstance(decision, Mapping) else None
        if given == "respond":
            given = "reject"  # recorded as a reject with the person's text
        recorded.append((op_id, kind))
        if given != kind:
            contradictions.append((op_id, given, kind, reviewer))
    if contradictions:
        for op_id, given, kind, reviewer in contradictions:
            ledger.note(
                op_id,
                {
                    "refused_answer": {
                        "decision": given,
                        "reviewer": answer.get("reviewer"),
                        "interrupt_id": interrupt_id,
                    },
                    "reason": f"already decided: {kind} by {reviewer}",
                },
            )
        listed = "; ".join(
            f"{op} was already decided: {kind} by {who} (this answer: {given}){_now(ledger, op)}"
            for op, given, kind, who in contradictions
        )
        # "Nothing ran" would be false when the recorded approval ran in the
        # same command (its review node read it back): say what this answer did.
        raise DecisionError(
            f"this answer is for {what}, which is not pending (no longer open): {listed}; the "
            "recorded decision stands; this answer was refused and recorded and ran nothing. "
            f"{describe_pending(pending)}"
        )
    return AnswerOutcome(interrupt_id=interrupt_id, decisions=recorded)


def _now(ledger: Ledger, operation_id: str) -> str:
    """``; OP is now succeeded`` (the operation's state as the ledger holds it), or ``""``."""
    op = ledger.get(operation_id)
    return "" if op is None else f"; {operation_id} is now {op.state.value.lower()}"


def recorded_verdict(
    ledger: Ledger, operation_id: str, attempt: int | None = None
) -> tuple[str, str, int, str | None] | None:
    """The latest human verdict recorded on an operation (for ``attempt``, if given).

    Returns:
        ``(verdict, reviewer, attempt, reference)`` read from the transition
        event that applied it, or ``None`` if no verdict was ever applied.
    """
    for event in reversed(ledger.events(operation_id=operation_id)):
        kind = event.detail.get("verdict")
        if event.src is not OpState.NEEDS_RECONCILIATION or not isinstance(kind, str):
            continue
        if attempt is not None and event.attempt != attempt:
            continue
        reference = event.detail.get("reference")
        return (
            kind,
            str(event.detail.get("reviewer") or "human"),
            event.attempt,
            reference if isinstance(reference, str) else None,
        )
    return None


def settle_verdict(
    ledger: Ledger,
    operation_id: str,
    verdict: Mapping[str, Any],
    *,
    pending: Sequence[PendingLike] = (),
) -> AnswerOutcome | None:
    """Judge a verdict for an operation that no longer waits for that verdict.

    A verdict re-sent for an attempt already settled returns the recorded
    outcome; a different one is refused, naming the recorded verdict, and
    the refusal is written to the ledger (``Ledger.note``). Mirrors
    ``settle_stale`` for review answers.

    Args:
        ledger: read for the operation and its verdicts, written for refusals.
        operation_id: the operation the verdict names.
        verdict: a validated verdict (``validate_verdict``).
        pending: what is pending now (named in refusals).

    Returns:
        ``None`` when the operation is not settled and holds no verdict for
        the attempt named (parked: the caller applies it, which changes
        nothing for another attempt). Otherwise the recorded outcome, when
        the verdict agrees with it.

    Raises:
        DecisionError: an unknown operation, or a verdict that contradicts
            the recorded verdict or the operation's final state (the refusal
            is recorded as a ``note`` event).
    """
    op = ledger.get(operation_id)
    if op is None:
        raise DecisionError(f"unknown operation {operation_id!r}")
    given = verdict.get("verdict")
    bound = verdict.get("attempt")
    if given == "ledger":
        return None
    if op.state is OpState.NEEDS_RECONCILIATION and bound in (None, op.attempt):
        return None
    found = recorded_verdict(ledger, operation_id, bound if isinstance(bound, int) else None)
    if found is not None:
        kind, reviewer, attempt, reference = found
        same_ref = verdict.get("reference") in (None, reference) or kind != "succeeded"
        if kind == given and same_ref:
            return AnswerOutcome(interrupt_id=None, decisions=[(operation_id, kind)])
        why = (
            f"{operation_id} was already decided: verdict {kind} by {reviewer} for attempt "
            f"{attempt}" + (f" (reference {reference})" if reference else "")
        )
    elif op.is_terminal:
        settled_as = {OpState.SUCCEEDED: "succeeded", OpState.FAILED: "failed"}.get(op.state)
        if settled_as == given:
            return AnswerOutcome(interrupt_id=None, decisions=[(operation_id, str(given))])
        why = f"{operation_id} already ended {op.state.value} at attempt {op.attempt}" + (
            f" ({op.error})" if op.error else ""
        )
    else:
        # Not settled and no verdict for that attempt: ``apply_verdict`` decides
        # (a verdict for another attempt than the one asked changes nothing).
        return None
    ledger.note(
        operation_id,
        {
            "refused_verdict": {
                "verdict": given,
                "attempt": bound,
                "reviewer": verdict.get("reviewer"),
            },
            "reason": why,
        },
    )
    raise DecisionError(
        f"verdict {given!r} refused: {why}; the verdict was refused and recorded and changed "
        f"nothing. {describe_pending(pending)}"
    )


def verdict_attempt_problem(operation_id: str, named: Any, asked: Any) -> str | None:
    """Why a verdict bound to ``named`` does not answer a reconciliation of attempt ``asked``.

    A reconciliation asks about the operation's latest attempt. A verdict
    naming another one changes nothing: an earlier attempt was settled
    already; a later one does not exist.

    Args:
        operation_id: the operation the verdict is for.
        named: the verdict's ``attempt`` (``None``: bound to the one asked).
        asked: the attempt the reconciliation asks about.

    Returns:
        ``None`` when the verdict answers the attempt asked about; else one
        clause naming the attempt it gives and why it is not used.
    """
    if named is None or named == asked:
        return None
    if isinstance(named, int) and isinstance(asked, int) and 0 < named < asked:
        return (
            f"the verdict for {operation_id} is for attempt {named}, an earlier attempt than "
            f"the one asked about (attempt {asked}); it is not used"
        )
    return (
        f"the verdict for {operation_id} gives attempt {named!r}, which names no attempt of "
        f"it (the one asked about is attempt {asked}, its latest); it is not used"
    )


def started(state: OpState) -> bool:
    """Whether an operation in ``state`` may already have taken effect."""
    return state in _STARTED


RESOLVED = "resolved by the reviewer without running"
"""The reason recorded for each call of a review answered ``Command(goto="__end__")``."""

SUPERSEDED = "Superseded by a new message from the user; the tool was not executed."
"""What a call closed by a follow-up message is answered (``close_for_follow_up``)."""

SUPERSEDED_BY = "effectgate: superseded by a new message"
"""The reviewer the ledger records for an operation a follow-up message withdrew."""


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
    for call in calls:
        ops = _operations_of(ledger, thread_id, call)
        for op in ops:
            if not never_started(op) and op.state not in _KNOWN_OUTCOME:
                raise FollowUpError(
                    f"thread {thread_id!r}: {call.tool} ({op.operation_id}) is "
                    f"{op.state.value} at attempt {op.attempt} and may have started: it is "
                    "never superseded by a new message; answer its review or reconciliation "
                    f"first (effectgate pending, effectgate resume --thread {thread_id})"
                )
        own = [o for o in ops if (o.thread_id, o.tool_call_id) == (thread_id, call.tool_call_id)]
        chosen = own[0] if own else (ops[0] if ops else None)
        settled = chosen is not None and chosen.state in _KNOWN_OUTCOME
        plan.append(Closing(call=call, operation=chosen, settled=settled))
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
