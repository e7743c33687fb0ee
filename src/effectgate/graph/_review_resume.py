"""The review node's reading of a resume: the checkpoint's pending writes, asked once per run.

Moved out of ``graph/_review.py`` (issue #34).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import (
    CONFIG_KEY_CHECKPOINT_MAP,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_RESUME_MAP,
    CONFIG_KEY_SCRATCHPAD,
    CONFIG_KEY_TASK_ID,
    INTERRUPT,
    NULL_TASK_ID,
)
from langgraph.graph import END
from langgraph.pregel._task_status import read_task_statuses

from effectgate.answers import (
    check_resume_ids,
    check_unkeyed_resume,
    is_resume_map,
    refuse_resume_of_idle,
    refuse_resume_of_lost_review,
    refuse_resume_of_step_left,
)

__all__ = ["ResumeReading", "goto_end_asked", "refuse_resume_before_run", "refuse_unknown_resume"]


def _answer_waiting(config: RunnableConfig) -> bool:
    """Whether a resume value waits for this run of the node (it was shown and answered).

    Reads LangGraph's per-task scratchpad, the same place ``interrupt()``
    reads its answer from; nothing is consumed.
    """
    pad = config.get("configurable", {}).get(CONFIG_KEY_SCRATCHPAD)
    if pad is None:
        return False
    return bool(pad.resume) or pad.get_null_resume(False) is not None


def _resume_writes(config: RunnableConfig) -> list[tuple[str, str, Any]]:
    """The pending writes of the checkpoint this run of the node resumes from (or none)."""
    conf = config.get("configurable", {})
    saver = conf.get(CONFIG_KEY_CHECKPOINTER)
    checkpoint_id = (conf.get(CONFIG_KEY_CHECKPOINT_MAP) or {}).get("")
    if saver is None or checkpoint_id is None:
        return []
    found = saver.get_tuple(
        {
            "configurable": {
                "thread_id": conf.get("thread_id"),
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }
    )
    return list(found.pending_writes or []) if found else []


class ResumeReading:
    """The pending writes of the checkpoint one run of a node resumes from, read at most once.

    The review node asks three questions of those writes in one run (is the
    resume map known, did the client ask to end, what was shown); each used
    to load the checkpoint afresh (``get_tuple``: a read and a deserialize).
    The writes they look at (the interrupts recorded by earlier runs, the
    client's resume writes) were all on the checkpoint before this run
    began, so one reading answers all three.
    """

    __slots__ = ("_config", "_writes")

    def __init__(self, config: RunnableConfig) -> None:
        self._config = config
        self._writes: list[tuple[str, str, Any]] | None = None

    def __call__(self) -> list[tuple[str, str, Any]]:
        """The writes, loaded on the first call."""
        if self._writes is None:
            self._writes = _resume_writes(self._config)
        return self._writes


GOTO_END = f"branch:to:{END}"
"""The channel ``Command(goto="__end__")`` writes to (LangGraph's ``map_command``)."""


def goto_end_asked(config: RunnableConfig, reading: ResumeReading | None = None) -> bool:
    """Whether the client answered this review with ``Command(goto="__end__")``.

    "Mark as resolved" in LangGraph Studio and Agent Inbox sends it. LangGraph
    ignores the write (a graph has no ``branch:to:__end__`` channel) and runs
    the interrupted node again, which would ask the same review again while
    the client was told it succeeded. The write is still saved on the
    checkpoint the review resumes from, as a pending write of no task; the
    review node reads it there and answers the review as resolved.

    ``reading``: the run's ``ResumeReading`` when the caller has one.
    """
    writes = (reading or ResumeReading(config))()
    return any(task == NULL_TASK_ID and channel == GOTO_END for task, channel, _ in writes)


def refuse_unknown_resume(config: RunnableConfig, reading: ResumeReading | None = None) -> None:
    """Refuse a resume map that names no interrupt of this thread (``answers.check_resume_ids``).

    A LangGraph client (``langgraph_sdk`` against ``langgraph dev``, Studio)
    answers with ``Command(resume={interrupt_id: answer})``. LangGraph keeps
    the map in the run's config (``CONFIG_KEY_RESUME_MAP``), not as a write,
    hands each task the value under its own id, and ignores the other keys:
    a wrong id reached nothing, the node ran again and asked the same
    question, and the run ended as if answered. Every node that calls
    ``interrupt()`` calls this first, before anything is written, so the run
    fails with the refusal, nothing is applied (LangGraph saves the error,
    not the answer) and the interrupt waits under the same id.

    Only the run that resumes this task is checked: the map stays in the
    config for the whole run, and a later step's node has no interrupt of its
    own recorded on its checkpoint yet. The ids the map may name are the
    interrupts recorded on the checkpoint it resumes (``_resume_writes``),
    answered ones included, as LangGraph re-runs those on a replay.

    A resume whose keys are not shaped like ids is no map to LangGraph: the
    whole dict arrives as the plain answer (the scratchpad's null resume). At
    effectgate's own review or reconciliation such a dict of answers is
    refused the same way (``answers.check_unkeyed_resume``); a tool's own
    question takes any value.

    Args:
        config: the node's run config.
        reading: the run's ``ResumeReading``, shared with the node's other
            questions to the same checkpoint (default: a reading of its own).

    Raises:
        UnknownInterruptError: the map is empty or names an id that is not
            an interrupt of this thread's checkpoint, or a plain answer is a
            dict of answers keyed by non-ids; nothing was applied.
    """
    conf = config.get("configurable", {})
    named = conf.get(CONFIG_KEY_RESUME_MAP)
    task_id = conf.get(CONFIG_KEY_TASK_ID)
    pad = conf.get(CONFIG_KEY_SCRATCHPAD)
    if task_id is None or (named is None and pad is None):
        return
    statuses = read_task_statuses((reading or ResumeReading(config))())
    if task_id not in statuses or not statuses[task_id].interrupts:
        return  # this task is not the one resumed (a later step of the same run)
    pending = {i.id: i.value for status in statuses.values() for i in status.pending_interrupts}
    if named is None:
        # A plain resume value: a dict keyed by a non-id is a mistyped map.
        if pad is None:
            return
        mine = statuses[task_id].pending_interrupts
        kind = mine[-1].value.get("type") if mine and isinstance(mine[-1].value, Mapping) else None
        check_unkeyed_resume(pad.get_null_resume(False), kind=str(kind), pending=pending)
        return
    known = {i.id for status in statuses.values() for i in status.interrupts}
    check_resume_ids(list(named), known=known, pending=pending)


def refuse_resume_before_run(
    resume: Any,
    *,
    next_tasks: Sequence[str],
    writes: Iterable[tuple[str, str, Any]],
    lost_operations: Sequence[str] | None = None,
) -> None:
    """Refuse, before a run starts, a resume that no node could take.

    Cases the nodes' own check (``refuse_unknown_resume``) cannot serve:

    - a resume to a thread that waits on no interrupt and has no task left
      (finished, or its last review answered by another client): LangGraph
      runs no node for it, so nothing refuses it and the run "succeeds"
      having applied nothing (``answers.refuse_resume_of_idle``);
    - a resume map naming an interrupt that does not wait on the checkpoint
      (mistyped, another thread's, already answered): the node refuses it,
      but inside the run, so LangGraph records the refusal as that task's
      error on the checkpoint, and a superstep's writes stay until the step
      ends: ``get_state(...).tasks[i].error`` went on showing the refused
      answer's text after the review was asked again (beside the new
      review's own ``error``). Refused here, nothing is written;
    - a resume to a thread that waits on no interrupt but has tasks next (a
      run stopped inside a step, ``runs.cancel(..., action="interrupt")``):
      LangGraph runs those tasks and drops the answer, so a stale reject was
      lost while the approved calls went on
      (``answers.refuse_resume_of_step_left``). A resume naming only
      interrupts that checkpoint recorded and had answered (a run sent again
      from it: time travel, a server's retry) goes on, as LangGraph replays it;
    - a resume to a thread with no checkpoint, on a graph that knows its
      ledger: when the ledger records operations of the thread, the server
      lost its checkpoints (``kill -9`` of ``langgraph dev``) and the answer
      is refused as for a lost review, not a mistyped one
      (``answers.refuse_resume_of_lost_review``).

    The same rules as the nodes (``answers.check_resume_ids``), read from the
    same place: the pending writes of the checkpoint the resume addresses. A
    graph that calls this before every run (``guard_resumes``, the served
    graph) refuses these resumes with the nodes' words; the nodes keep their
    check for graphs run without it.

    Args:
        resume: the ``Command.resume`` value.
        next_tasks: the tasks the addressed checkpoint has left to run
            (``StateSnapshot.next``).
        writes: that checkpoint's pending writes, ``(task_id, channel, value)``.
        lost_operations: when the thread has no checkpoint at all and the
            graph knows its ledger (the served graph), the ledger's operation
            ids of the thread (maybe none); else ``None``.

    Raises:
        UnknownInterruptError: one line naming the unknown id(s) and what
            waits; nothing was applied and the pending interrupts keep their ids.
    """
    statuses = read_task_statuses(list(writes))
    pending = {i.id: i.value for status in statuses.values() for i in status.pending_interrupts}
    if lost_operations is not None and not next_tasks and not pending:
        refuse_resume_of_lost_review(resume, operations=lost_operations)
    known = {i.id for status in statuses.values() for i in status.interrupts}
    if next_tasks and not pending:
        # A step stopped before its end: LangGraph would run it and drop the
        # answer. An answer to an interrupt this very step recorded and had
        # answered (a run sent again from that checkpoint, time travel) is
        # LangGraph's replay of that answer, and goes on.
        named = list(resume) if is_resume_map(resume) else None
        if (not known) if named is None else (not named or any(i not in known for i in named)):
            refuse_resume_of_step_left(resume, next_tasks=next_tasks, known=known)
    if not next_tasks and not pending:
        # Finished tasks on a head with nothing next: a step whose run was cut
        # off before its checkpoint (a rollback); a run with no input ends it.
        refuse_resume_of_idle(resume, step_left=any(s.finished for s in statuses.values()))
    if pending and is_resume_map(resume):
        check_resume_ids(list(resume), known=known, pending=pending)


def _shown_review(config: RunnableConfig, reading: ResumeReading) -> Mapping[str, Any] | None:
    """The review request this run of the node was shown under, read from its checkpoint.

    LangGraph keeps an interrupt's value as a pending write of its task on the
    checkpoint the run resumes from; a raw client's answer is bound to what
    that value's descriptions showed (``answers.bind_shown_flags``). ``None``
    when there is no checkpointer or no such write (a first run).
    """
    task_id = config.get("configurable", {}).get(CONFIG_KEY_TASK_ID)
    if task_id is None:
        return None
    shown = None
    for write_task, channel, value in reading():
        if write_task != task_id or channel != INTERRUPT:
            continue
        for item in value if isinstance(value, list) else [value]:
            payload = getattr(item, "value", None)
            if isinstance(payload, Mapping) and payload.get("type") == "review":
                shown = payload
    return shown
