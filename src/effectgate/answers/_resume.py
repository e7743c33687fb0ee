"""Resume maps: LangGraph's ``Command(resume=...)`` keyed by interrupt id, checked before a run."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NoReturn

from effectgate.answers._texts import _Raised, describe_pending
from effectgate.answers._verdicts import VerdictModel
from effectgate.errors import (
    UnknownInterruptError,
)

__all__ = [
    "check_resume_ids",
    "check_unkeyed_resume",
    "is_resume_map",
    "refuse_goto_end_without_review",
    "refuse_resume_of_idle",
    "refuse_resume_of_lost_review",
    "refuse_resume_of_step_left",
]


def check_resume_ids(
    named: Collection[str],
    *,
    known: Collection[str],
    pending: Mapping[str, Any],
    waiting: str | None = None,
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
        waiting: what the refusal says waits instead of naming ``pending``
            (a thread that waits on no interrupt but has a step to finish).

    Raises:
        UnknownInterruptError: the map is empty or names an unknown id; one line
            naming the unknown id(s) and the pending interrupts. Nothing was
            applied; the pending interrupts can still be answered.
    """
    if waiting is None:
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
            "(cancelled or rolled back); this answer was not applied (an effect of that step may "
            "already have run). Run the thread with no input and no command to finish that "
            "step: an effect that already ran is read back from the ledger, not run again"
        )
    if resume and is_resume_map(resume):
        check_resume_ids(list(resume), known=(), pending={})
    raise UnknownInterruptError(
        "resume refused: this thread waits on no interrupt (finished, or its review was "
        "answered elsewhere); nothing was applied. " + describe_pending([])
    )


def refuse_goto_end_without_review(pending: Mapping[str, Any]) -> None:
    """Refuse "Mark as resolved" (``Command(goto="__end__")``) where no review waits.

    It closes a review's calls as rejected (the review node reads it). At a
    reconciliation or a tool's question LangGraph drops the write and asks
    the same question again, so the client was told the run succeeded while
    nothing changed. A verdict settles a reconciliation, never a jump to the end.

    Args:
        pending: interrupt id -> value of the interrupts the thread waits on.

    Raises:
        UnknownInterruptError: interrupts wait and none is a review; one line
            naming them. Nothing was applied.
    """
    if not pending or any(
        isinstance(v, Mapping) and v.get("type") == "review" for v in pending.values()
    ):
        return
    waiting = describe_pending([_Raised(i, v) for i, v in pending.items()])
    raise UnknownInterruptError(
        "'Mark as resolved' (Command(goto='__end__')) refused: it closes the calls of a "
        "review, and no review waits here; nothing was applied. Answer what waits with "
        f"Command(resume={{interrupt_id: answer}}) (a reconciliation takes a verdict). {waiting}"
    )


def refuse_resume_of_step_left(
    resume: Any, *, next_tasks: Sequence[str], known: Collection[str] = ()
) -> NoReturn:
    """Refuse a resume sent to a thread that waits on no interrupt but has tasks next.

    A run stopped inside a step (``runs.cancel(..., action="interrupt")``
    while an approved call's effect ran, a node that failed, a killed worker)
    leaves the step's checkpoint with its tasks next and no interrupt.
    LangGraph runs those tasks for any resume and drops the answer: a reject
    of the review answered before (a second client's stale answer, or one
    keyed by a mistyped id) was lost without a word while the approved calls
    went on. The same refusal as a map naming an interrupt that does not wait
    (``check_resume_ids``), saying what does wait: the step, which a run with
    no input finishes.

    Args:
        resume: the ``Command.resume`` value (a map by interrupt id, or a plain answer).
        next_tasks: the names of the tasks next (``StateSnapshot.next``).
        known: the interrupt ids that checkpoint recorded, all answered (not
            named as unknown in the refusal).

    Raises:
        UnknownInterruptError: always; one line, naming the ids the map gave
            and the tasks next. Nothing was applied.
    """
    step = (
        f"this thread waits on no interrupt: its next step ({', '.join(next_tasks)}) has not "
        "run to its end (its run was stopped, cancelled or failed there). Run the thread with "
        "no input and no command to finish that step: an effect that already ran is read "
        "back from the ledger, not run again"
    )
    if is_resume_map(resume):
        check_resume_ids(list(resume), known=known, pending={}, waiting=step)
    raise UnknownInterruptError(
        f"resume refused: this answer names no interrupt that waits; nothing was applied. {step}"
    )


def refuse_resume_of_lost_review(resume: Any, *, operations: Sequence[str]) -> NoReturn:
    """Refuse a resume to a thread the server holds no checkpoint of.

    The in-memory runtime of ``langgraph dev`` keeps a thread's checkpoints
    in memory: after ``kill -9`` the thread comes back empty or not at all,
    while the ledger in the state directory keeps the operations the thread
    opened. An answer to the review the server showed is then not mistyped:
    the review was lost with the server's checkpoints, and sending the task
    again is the way on (the ledger keeps an effect that already ran from
    running again). When the ledger records no operation of the thread (a
    kill at its first review, before any answer; or a new or mistyped thread
    id), the refusal says that it cannot tell which.

    Args:
        resume: the ``Command.resume`` value (a map by interrupt id, or a plain answer).
        operations: the ledger's operation ids of this thread (may be empty).

    Raises:
        UnknownInterruptError: always; one line. Nothing was applied.
    """
    named = (
        f" (interrupt {', '.join(repr(str(k)) for k in resume)})"
        if resume and is_resume_map(resume)
        else ""
    )
    again = (
        "Send the task again on this thread: the ledger keeps an effect that already ran "
        "from running again, and asks again about calls not yet approved"
    )
    if not operations:
        raise UnknownInterruptError(
            f"resume refused: this thread has no checkpoint on this server and the ledger "
            f"records no operation of it, so no review of it is pending{named}: a new or "
            "mistyped thread id, or a review lost with the server's checkpoints before any "
            "call of it was answered (e.g. after kill -9 of langgraph dev); this answer was "
            f"not applied. If the thread showed a review, {again[0].lower()}{again[1:]}"
        )
    more = f" and {len(operations) - 3} more" if len(operations) > 3 else ""
    shown = ", ".join(operations[:3]) + more
    raise UnknownInterruptError(
        f"resume refused: the review this answer is for{named} was lost with the server's "
        "checkpoints (the server holds no checkpoint of this thread, e.g. after kill -9 of "
        f"langgraph dev), though the ledger records this thread's operations ({shown}); "
        f"this answer was not applied. {again}"
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
