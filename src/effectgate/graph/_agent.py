"""``Agent``: start, resume and inspect threads safely.

LangGraph does not serialise runs per thread (two runs silently fork it) and
several resume paths silently re-run nodes (docs/architecture.md, "The runner"). The
runner closes those gaps: it takes a per-thread lease in the ledger database,
turns abandoned IN_FLIGHT rows of the thread into UNKNOWN, and then follows the
supervisor procedure of docs/architecture.md, "The runner":

- nothing checkpointed     -> start again from the recorded input;
- pending interrupts       -> answer *every* one in a single resume, or wait
  (never ``invoke(None)`` and never new input over them);
- unfinished tasks         -> ``invoke(None)``;
- no tasks                 -> the thread is done.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.constants import TASKS
from langgraph.errors import GraphDrained
from langgraph.runtime import RunControl
from langgraph.types import Command, Send

from effectgate import answers as answer_protocol
from effectgate._clock import Clock
from effectgate._process import new_worker_id, owner_is_gone
from effectgate._recent import Recent
from effectgate.answers import SUPERSEDED, check_review_answer
from effectgate.dispatch import Verdict
from effectgate.errors import ConfigError, DecisionError, LedgerError, ThreadBusyError
from effectgate.graph._build import AgentParts, build_agent
from effectgate.graph._follow_up import close_open_calls
from effectgate.graph._policy import Policy
from effectgate.graph._prune import PrunePolicy, PruneReport, prune
from effectgate.graph._saver import HeadState, StepDurableSaver, head_state
from effectgate.graph._state import RunStatus, effect_node_name
from effectgate.ledger import Lease, Ledger, Operation, ThreadRecord
from effectgate.ledger._tombstones import refuse_deleted
from effectgate.tools import ToolSpec

__all__ = [
    "SUPERSEDED",
    "Agent",
    "PendingInterrupt",
    "RunResult",
    "RunStatus",
    "check_review_answer",
    "turn_message_id",
]


_TURN = "#turn-"
"""Follow-up turn ``n`` of thread ``T`` is recorded as the ledger thread ``T#turn-n``."""

_HISTORY_LOOKBACK = 500
"""Most checkpoints read back to find the review an answer names (an error path)."""


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


EventHook = Callable[[Mapping[str, Any]], None]


class Agent:
    """A durable agent: the graph of ``build_agent`` plus a safe runner.

    Args:
        model: chat model with ``bind_tools``.
        tools: ``ToolSpec``s and/or LangChain tools.
        ledger: the operation ledger (also holds threads and leases).
        checkpointer: LangGraph saver, e.g. ``SqliteSaver``.
        policy: approval TTL, auto-approval, budgets.
        system_prompt: prepended to each model call.
        clock: time source.
        lease_ttl_s: seconds a thread lease lasts without renewal; renewed
            every third of it while a run is under way.
        lease_wait_s: seconds to wait for a thread held by another live
            runner before ``ThreadBusyError`` (0: fail at once). Rides over
            short holds, e.g. a second starter that only finds the thread exists.
        recursion_limit: most supersteps one run may take (LangGraph's
            ``recursion_limit``; a read-only tool call costs two). Reviews
            end runs, so only a model looping on reads meets it; the thread
            then stops ``INCOMPLETE`` and ``resume`` continues it.
        on_event: called with each streamed graph update (progress display).
        on_wait: called before each backoff wait with the operation and seconds.
    """

    def __init__(
        self,
        model: BaseChatModel,
        tools: Sequence[ToolSpec | BaseTool],
        *,
        ledger: Ledger,
        checkpointer: BaseCheckpointSaver[Any],
        policy: Policy | None = None,
        system_prompt: str | None = None,
        clock: Clock | None = None,
        lease_ttl_s: float = 30.0,
        lease_wait_s: float = 0.0,
        recursion_limit: int = 1000,
        on_event: EventHook | None = None,
        on_wait: Callable[[Operation, float], None] | None = None,
    ) -> None:
        self.worker = new_worker_id()
        self.parts: AgentParts = build_agent(
            model,
            tools,
            ledger=ledger,
            checkpointer=checkpointer,
            policy=policy,
            system_prompt=system_prompt,
            worker=self.worker,
            clock=clock,
            on_wait=on_wait,
        )
        self.graph = self.parts.graph
        self.ledger = ledger
        self.dispatcher = self.parts.dispatcher
        self.lease_ttl_s = lease_ttl_s
        self.lease_wait_s = lease_wait_s
        self.recursion_limit = recursion_limit
        self.on_event = on_event
        self._listeners: dict[int, EventHook] = {}
        """Per OS thread: where ``astream`` wants the updates of the run it drives."""
        self._controls: dict[int, RunControl] = {}
        """The runs under way, by the OS thread running each (several at once
        through the async API)."""
        self._stop_reason: str | None = None
        """Set by ``request_stop``; sticky, so a stop asked between runs is not lost."""
        self._keeper = _LeaseKeeper(
            ledger, lease_ttl_s, self.request_stop, name=f"effectgate-lease-keeper {self.worker}"
        )
        self._stops: Recent[str, _Stop] = Recent(1024)
        """Where this agent's last runs stopped at interrupts, by thread (see ``_head``)."""
        self._used: Recent[str, frozenset[str]] = Recent(1024)
        """Per thread: operation ids its tool messages named, as far as this agent saw."""

    # ---------------------------------------------------------------- running

    def start(
        self, task: str, *, thread_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> RunResult:
        """Start a thread on ``task``, or resume it if it was started with that task.

        The input is recorded in the ledger first, so a run killed before its
        first checkpoint can be started again by ``resume`` (or by calling
        ``start`` again). A repeated start with the same thread id and task is
        a resume, as durable-execution engines treat a repeated workflow id
        (Temporal's workflow-id reuse, DBOS's idempotent workflow ids): a
        client that retries its start request after a timeout or a crash
        continues the one thread instead of failing or starting a second.

        Args:
            task: the user's request (the first human message).
            thread_id: fix the thread id; default a new random one.
            metadata: stored with the thread record (e.g. the model spec, so a
                later ``resume`` in a new process can rebuild the same agent).
                Write-once: a repeated start keeps the first metadata.

        Returns:
            The thread's state after the run.

        Raises:
            ConfigError: the task is blank, the id ends like a follow-up turn's
                record (``#turn-<n>``), or the thread exists with another task
                (the message names both; use ``send`` for a follow-up).
            ThreadBusyError: another live runner holds the thread.
        """
        if not task.strip():
            raise ConfigError("the task is empty: say what the agent should do")
        thread_id = thread_id or uuid.uuid4().hex
        if is_turn_record(thread_id):
            raise ConfigError(
                f"thread id {thread_id!r}: ids ending in '{_TURN}<n>' name the follow-up turns "
                "of a thread; choose another id"
            )
        # The tools the thread starts with, so a later resume can refuse an
        # agent rebuilt without one of them (see ``_missing_nodes``).
        record_meta = {**(metadata or {}), "tools": sorted(self.parts.specs)}
        record = self.ledger.record_thread(thread_id, {"task": task}, record_meta)
        if dict(record.input) != {"task": task}:
            raise ConfigError(
                f"thread {thread_id!r} already exists with another task: it was started with "
                f"{_clip(record.input.get('task'))}, not {_clip(task)}; send a follow-up "
                "message instead (Agent.send, or effectgate run --thread)"
            )
        # Nothing checkpointed: ``_resume`` starts from the recorded input.
        return self._under_lease(thread_id, lambda: self._continue(thread_id))

    def send(
        self,
        thread_id: str,
        message: str,
        *,
        supersede: bool = False,
        request_id: str | None = None,
    ) -> RunResult:
        """Add a human turn to an existing thread and run it until done or an interrupt.

        Named after LangChain chat ``send``-style follow-ups: in LangGraph a
        follow-up is ``graph.invoke({"messages": [HumanMessage(...)]}, config)``
        on the same ``thread_id``; ``send`` is that call, made safe. The turn
        is recorded in the ledger before it runs, under a deterministic
        message id (``turn_message_id``), so a process killed right after
        recording it is completed by ``resume`` (or by sending the same
        message again) and the message is added exactly once. Operations,
        business keys, possible-duplicate flags and receipts are the
        ledger's, not the turn's: a later turn asking for an earlier turn's
        ticket gets its receipt, not a second ticket.

        A thread waiting at a review or a reconciliation refuses a new
        message, naming what waits and how to answer it. With
        ``supersede=True`` each call waiting at a review whose operation
        provably never started (no operation, PROPOSED, APPROVED with attempt
        0, or REJECTED in the ledger) is answered "superseded by a new message,
        not executed" (its operation, if this call opened it, is rejected in
        the ledger) and the message follows; a call whose operation may have
        started, or a pending reconciliation, is never superseded.

        Args:
            thread_id: an existing thread.
            message: the user's follow-up.
            supersede: answer pending review calls that never started as
                superseded instead of refusing.
            request_id: the caller's id for this message: a repeated ``send``
                with the same ``request_id`` resumes the turn it recorded
                instead of adding the message again (a client retrying after a
                timeout); the same ``request_id`` with another message is
                refused (``ConfigError``). Without it, only a recorded turn
                that has not run yet is recognised as the same message.

        Returns:
            The thread's state after the run.

        Raises:
            ConfigError: the message is blank; ``request_id`` was used for
                another message; the thread is unknown, has not
                run its first task, has unfinished work or a recorded turn not
                yet run (``resume`` first), or waits at a review or
                reconciliation (the message says which and how to answer).
            ThreadBusyError: another live runner holds the thread.
        """
        if not message.strip():
            raise ConfigError("the message is empty: say what the agent should do")
        return self._under_lease(
            thread_id,
            lambda: self._send(thread_id, message, supersede=supersede, request_id=request_id),
        )

    def _send(
        self, thread_id: str, message: str, *, supersede: bool, request_id: str | None
    ) -> RunResult:
        # Runs under the thread's lease (``send``).
        turns = self._turns(thread_id)
        snapshot = self.graph.get_state(self._config(thread_id))
        seen = {m.id for m in snapshot.values.get("messages", [])}
        for turn in turns:
            if request_id is not None and turn.input.get("request_id") == request_id:
                if turn.input.get("message") != message:
                    # A request id names one message: another text under it is
                    # a client bug, and dropping either message would lose it.
                    raise ConfigError(
                        f"thread {thread_id!r}: request id {request_id!r} was already used "
                        f"for turn {turn.input.get('turn')} with message "
                        f"{_clip(turn.input.get('message'))}, not {_clip(message)}: "
                        "use a new request id for a new message"
                    )
                # A retry of a turn already recorded: continue the thread.
                return self._continue(thread_id)
        last = turns[-1] if turns else None
        if last is not None and _turn_id(thread_id, last) not in seen:
            if last.input.get("message") != message:
                raise ConfigError(
                    f"thread {thread_id!r}: turn {last.input.get('turn')} "
                    f"({_clip(last.input.get('message'))}) is recorded but has not run "
                    "yet: resume the thread first"
                )
            record = last  # the same message sent again: run the recorded turn
        else:
            self._check_at_rest(thread_id, snapshot, supersede=supersede)
            record = self.ledger.record_thread(
                _turn_key(thread_id, len(turns) + 2),
                {
                    "thread_id": thread_id,
                    "turn": len(turns) + 2,
                    "message": message,
                    "supersede": supersede,
                    "request_id": request_id,
                },
                {"kind": "turn", "thread": thread_id},
            )
        return self._with_shared(self._apply_turn(thread_id, record, supersede=supersede))

    def _turns(self, thread_id: str) -> list[ThreadRecord]:
        """The thread's recorded follow-up turns (2, 3, ...), oldest first."""
        out: list[ThreadRecord] = []
        while (found := self.ledger.get_thread(_turn_key(thread_id, len(out) + 2))) is not None:
            out.append(found)
        return out

    def _check_at_rest(self, thread_id: str, snapshot: Any, *, supersede: bool) -> None:
        """Refuse a new turn unless the thread is done, or waits only at supersedable calls."""
        if snapshot.metadata is None:
            if self.ledger.get_thread(thread_id) is None:
                raise ConfigError(
                    f"unknown thread {thread_id!r}: start it first (Agent.start, or "
                    f"effectgate run --thread {thread_id} TASK)"
                )
            raise ConfigError(
                f"thread {thread_id!r} has not run its first task yet: resume it first"
            )
        self._check_nodes(thread_id, snapshot)
        pending = self._interrupts(snapshot)
        if not pending and snapshot.tasks:
            raise ConfigError(
                f"thread {thread_id!r} has unfinished work (a crash, a stop, a model "
                "error): resume it first, then send the message"
            )
        if pending:
            self._close_open_calls(thread_id, snapshot, pending, supersede=supersede, now=None)

    def _close_open_calls(
        self,
        thread_id: str,
        snapshot: Any,
        pending: Sequence[PendingInterrupt],
        *,
        supersede: bool,
        now: datetime | None,
    ) -> list[ToolMessage]:
        """The one follow-up rule (``answers.follow_up_plan``) on the pending calls.

        Raises:
            FollowUpError: a reconciliation or question waits, ``supersede``
                is off, or a call's operation may have started (named).
        """
        return close_open_calls(
            snapshot.values.get("messages", []),
            specs=self.parts.specs,
            ledger=self.ledger,
            thread_id=thread_id,
            now=now,
            waiting=pending,
            supersede=supersede,
        )

    def _apply_turn(self, thread_id: str, record: ThreadRecord, *, supersede: bool) -> RunResult:
        """Add a recorded turn's message (once: its id is deterministic) and run it."""
        # Runs under the thread's lease.
        self.ledger.recover_in_flight(thread_id=thread_id)
        config = self._config(thread_id)
        snapshot = self.graph.get_state(config)
        message_id = _turn_id(thread_id, record)
        if any(m.id == message_id for m in snapshot.values.get("messages", [])):
            return self._resume(thread_id, None, None, None)  # added before a crash: continue
        human = HumanMessage(str(record.input.get("message", "")), id=message_id)
        supersede = supersede or bool(record.input.get("supersede"))
        self._check_at_rest(thread_id, snapshot, supersede=supersede)
        pending = self._interrupts(snapshot)
        if not pending:
            return self._run(thread_id, {"messages": [human]})
        answers = self._close_open_calls(
            thread_id, snapshot, pending, supersede=supersede, now=self.parts.clock.now()
        )
        # One checkpoint holds the answers and the message, written as if the
        # tools node had answered the calls: the pending review is left
        # behind with the old checkpoint and the agent node runs next.
        self.graph.update_state(config, {"messages": [*answers, human]}, as_node="tools")
        self._stops.pop(thread_id, None)
        return self._run(thread_id, None)

    def _next_turn(self, thread_id: str, result: RunResult) -> RunResult:
        """After a resume: run a recorded turn a crash left unapplied, if any."""
        if result.status not in (RunStatus.DONE, RunStatus.WAITING_REVIEW):
            return result
        turns = self._turns(thread_id)
        if not turns:
            return result
        last = turns[-1]
        if result.status is RunStatus.WAITING_REVIEW and not last.input.get("supersede"):
            return result
        seen = {m.id for m in self.messages(thread_id)}
        if _turn_id(thread_id, last) in seen:
            return result
        try:
            return self._apply_turn(thread_id, last, supersede=False)
        except ConfigError as exc:
            return replace(result, error=str(exc))

    def resume(
        self,
        thread_id: str,
        *,
        decisions: Mapping[str, Any] | None = None,
        verdicts: Mapping[str, Verdict] | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Continue a thread from wherever it stopped, repeating no effect.

        Answers follow ``effectgate.answers`` (see docs/answers.md): each one
        names what it answers, nothing is guessed.

        Args:
            thread_id: the thread.
            decisions: one review answer, ``{"decisions": [...], "reviewer":
                "...", "interrupt_id": "..."}``, bound to the review it was
                given for by ``interrupt_id`` or by each decision's
                ``operation_id`` and ``intent_hash``.
            verdicts: answers to pending reconciliation interrupts, by
                operation id.
            answers: interrupt id -> answer (a review answer or a verdict), as
                LangGraph's ``Command(resume={id: value})``; interrupts left
                out stay pending.

        Returns:
            The thread's state after the run. If nothing pending is answered,
            nothing runs and the result says what waits. An answer to a
            review that is already decided the same way is listed in
            ``already_decided`` and the thread goes on.

        Raises:
            ConfigError: unknown thread, or its pending work needs a tool this
                agent lacks (nothing runs).
            DecisionError: an answer names no review, has the wrong shape, or
                contradicts a decision already recorded (that refusal is
                written to the ledger); nothing ran.
            ThreadBusyError: another live runner holds the thread.
        """
        return self._under_lease(
            thread_id, lambda: self._continue(thread_id, decisions, verdicts, answers)
        )

    def _under_lease(self, thread_id: str, run: Callable[[], RunResult]) -> RunResult:
        """``run()`` while holding the thread's lease; a deleted thread is refused first.

        A lease release that fails after the run becomes a note on its result
        (``RunResult.notes``) instead of replacing it.
        """
        notes: list[str] = []
        with self._lease(thread_id, notes):
            refuse_deleted(self.ledger, thread_id)
            result = run()
        return _noted(result, notes)

    def _continue(
        self,
        thread_id: str,
        decisions: Mapping[str, Any] | None = None,
        verdicts: Mapping[str, Verdict] | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Under the lease: answer what waits and run, then any follow-up turn recorded."""
        result = self._resume(thread_id, decisions, verdicts, answers)
        return self._with_shared(self._next_turn(thread_id, result))

    def _resume(
        self,
        thread_id: str,
        decisions: Mapping[str, Any] | None,
        verdicts: Mapping[str, Verdict] | None,
        answers: Mapping[str, Any] | None,
    ) -> RunResult:
        # Runs under the thread's lease (``_under_lease``). Live attempts
        # (another thread's runner mid-request on a shared key) and this
        # agent's own are left alone: dispatch waits for them or recovers them.
        self.ledger.recover_in_flight(thread_id=thread_id, worker=self.worker)
        _check_answers_shape(decisions, verdicts, answers)
        stop = self._stops.pop(thread_id, None)
        if stop is not None and stop.head == self._head(thread_id):
            # Nothing moved since this agent's last run stopped at these
            # interrupts: answer them without reloading the whole state.
            pending = self._open(thread_id, stop.interrupts)
            if len(pending) == len(stop.interrupts):
                res = answer_protocol.resolve(
                    pending,
                    ledger=self.ledger,
                    decisions=decisions,
                    verdicts=verdicts,
                    answers=answers,
                )
                if not res.stale and not res.settled:
                    if not res.resume:
                        self._stops[thread_id] = stop
                        return stop.result(thread_id, self.ledger.list(thread_id=thread_id))
                    return self._run(thread_id, Command(resume=res.resume))
        if decisions is None and not verdicts and answers is None:
            recovered = self._continue_at_head(thread_id)
            if recovered is not None:
                return recovered
        snapshot = self.graph.get_state(self._config(thread_id))
        self._used[thread_id] = _operation_ids(snapshot.values.get("messages", []))
        if snapshot.metadata is None:
            record = self.ledger.get_thread(thread_id)
            if record is None:
                raise ConfigError(f"unknown thread {thread_id!r}")
            if decisions is not None or verdicts or answers is not None:
                raise DecisionError(
                    f"thread {thread_id!r} has not reached a review yet: the answer was not applied"
                )
            task = str(record.input.get("task", ""))
            return self._run(thread_id, {"messages": [HumanMessage(task)]})
        self._check_nodes(thread_id, snapshot)
        pending = self._open(thread_id, self._interrupts(snapshot))
        res = answer_protocol.resolve(
            pending, ledger=self.ledger, decisions=decisions, verdicts=verdicts, answers=answers
        )
        settled = [self._judge_stale(thread_id, named, a, pending) for named, a in res.stale]
        settled += res.settled
        given = decisions is not None or bool(verdicts) or answers is not None
        result = self._go_on(thread_id, snapshot, res.resume, pending, given=given, settled=settled)
        if settled:
            result = replace(result, already_decided=[o.describe() for o in settled])
        return result

    def _go_on(
        self,
        thread_id: str,
        snapshot: Any,
        resume: Mapping[str, Any],
        pending: Sequence[PendingInterrupt],
        *,
        given: bool,
        settled: Sequence[answer_protocol.AnswerOutcome],
    ) -> RunResult:
        """Run on after the answers were resolved (or report where the thread waits)."""
        if resume:
            return self._run(thread_id, Command(resume=dict(resume)))
        if pending:
            return self._status(thread_id)
        if snapshot.tasks and (settled or not given):
            return self._run(thread_id, None)
        if given and not settled:
            raise DecisionError(
                f"nothing is pending on thread {thread_id!r}: the answer was not applied "
                "(was it answered elsewhere?)"
            )
        return self._status(thread_id)

    def _continue_at_head(self, thread_id: str) -> RunResult | None:
        """Run on a thread stopped mid-step (a kill), without loading its messages first.

        What ``_resume`` does for a resume with no answers when the head
        checkpoint has tasks left and no interrupt: check that every node they
        need exists, then run (``_run(None)``). The run loads the state
        itself; ``get_state`` before it loaded the whole message history once
        more only to learn what ``head_state`` reads from the head checkpoint
        (the tasks) and what the byte scan of ``_no_shared_named`` shows (the
        thread's tool messages name only its own operations). ``None``
        whenever any part is not clearly covered (no checkpoint, interrupts,
        no task, a missing node, another thread's operation named, another
        saver): ``_resume`` then takes the full path, which words refusals.
        """
        state = self._head_state(thread_id)
        if state is None or state.interrupts or not state.tasks:
            return None
        if not self._names_only_own(thread_id, self.ledger.list(thread_id=thread_id)):
            return None
        return self._run(thread_id, None)

    def _judge_stale(
        self,
        thread_id: str,
        interrupt_id: str | None,
        answer: Mapping[str, Any],
        pending: Sequence[PendingInterrupt],
    ) -> answer_protocol.AnswerOutcome:
        """Judge an answer to a review that is no longer open (``answers.settle_stale``)."""
        shown = self._shown_under(thread_id, interrupt_id) if interrupt_id else None
        if interrupt_id and shown is None:
            raise DecisionError(
                f"this answer is for review {interrupt_id}, which is not pending (answered "
                f"elsewhere, or not a review of this thread); nothing ran. "
                f"{answer_protocol.describe_pending(pending)}"
            )
        return answer_protocol.settle_stale(
            self.ledger, thread_id, answer, shown, interrupt_id=interrupt_id, pending=pending
        )

    def _shown_under(self, thread_id: str, interrupt_id: str) -> Mapping[str, Any] | None:
        """The review request this thread showed under ``interrupt_id``, from its history.

        Read only when an answer names an interrupt that is not pending (an
        error or a repeated answer), so walking the checkpoints is affordable.
        """
        for n, snap in enumerate(self.graph.get_state_history(self._config(thread_id))):
            if n >= _HISTORY_LOOKBACK:
                break
            found = [*snap.interrupts, *(i for t in snap.tasks for i in t.interrupts)]
            for item in found:
                value = item.value
                if (
                    item.id == interrupt_id
                    and isinstance(value, Mapping)
                    and value.get("type", "review") == "review"
                ):
                    return value
        return None

    def _open(self, thread_id: str, pending: Sequence[PendingInterrupt]) -> list[PendingInterrupt]:
        """The pending interrupts that still wait for a person.

        A review whose every call already has a decision recorded in the
        ledger, or a reconciliation whose attempt already has a verdict
        recorded (a process killed right after recording it), is not open:
        its node reads the recorded answer back when it runs again
        (``answers.is_decided``).
        """
        return [
            item
            for item in pending
            if item.kind not in ("review", "reconciliation")
            or not answer_protocol.is_decided(self.ledger, thread_id, item.value)
        ]

    def replay(self, thread_id: str, checkpoint_id: str) -> RunResult:
        """Re-run a thread from one of its checkpoints (LangGraph time travel).

        The replay forks the thread from that checkpoint; every effect it
        reaches goes through review and the ledger again, so nothing that
        succeeded is executed twice.

        Args:
            thread_id: the thread.
            checkpoint_id: one of the thread's checkpoint ids (from
                ``graph.get_state_history``).

        Returns:
            The thread's state after the replayed run.

        Raises:
            ConfigError: the thread has no checkpoint with that id (never
                one, or removed by retention's ``keep_last``); nothing runs.
            ThreadBusyError: another live runner holds the thread.
        """
        config = self._config(thread_id)
        config["configurable"]["checkpoint_id"] = checkpoint_id

        def go() -> RunResult:
            saver = self.graph.checkpointer
            if isinstance(saver, BaseCheckpointSaver) and saver.get_tuple(config) is None:
                # LangGraph would run from nothing and report the head as done.
                raise ConfigError(
                    f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}: it does not "
                    "exist, or retention pruned it; pick one of the thread's checkpoints "
                    "(graph.get_state_history)"
                )
            return self._with_shared(self._run(thread_id, None, config=config))

        return self._under_lease(thread_id, go)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask the current run to stop at the next superstep boundary (SIGTERM, Ctrl-C)."""
        self._stop_reason = reason
        for control in list(self._controls.values()):
            control.request_drain(reason)

    # ------------------------------------------------------------------ async

    async def astart(
        self, task: str, *, thread_id: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> RunResult:
        """``start`` for async code: same arguments, result, errors and guarantees.

        The run goes on in a worker thread (``asyncio.to_thread``), so the
        event loop is never blocked by the model call, SQLite or a tool; many
        threads can run at once from one agent. Cancelling the awaiting task
        asks the run to stop at its next superstep boundary (``request_stop``)
        and waits for it, so no step is left half-recorded; the thread stays
        resumable; other runs of this agent go on.
        """
        return await self._in_thread(self.start, task, thread_id=thread_id, metadata=metadata)

    async def aresume(
        self,
        thread_id: str,
        *,
        decisions: Mapping[str, Any] | None = None,
        verdicts: Mapping[str, Verdict] | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """``resume`` for async code (see ``astart`` for how it runs and is cancelled)."""
        return await self._in_thread(
            self.resume, thread_id, decisions=decisions, verdicts=verdicts, answers=answers
        )

    async def asend(
        self,
        thread_id: str,
        message: str,
        *,
        supersede: bool = False,
        request_id: str | None = None,
    ) -> RunResult:
        """``send`` for async code (see ``astart`` for how it runs and is cancelled)."""
        return await self._in_thread(
            self.send, thread_id, message, supersede=supersede, request_id=request_id
        )

    async def areplay(self, thread_id: str, checkpoint_id: str) -> RunResult:
        """``replay`` for async code (see ``astart`` for how it runs and is cancelled)."""
        return await self._in_thread(self.replay, thread_id, checkpoint_id)

    async def astatus(self, thread_id: str) -> RunResult:
        """``status`` for async code: read in a worker thread; nothing runs."""
        return await asyncio.to_thread(self.status, thread_id)

    async def astream(
        self,
        thread_id: str,
        *,
        task: str | None = None,
        decisions: Mapping[str, Any] | None = None,
        verdicts: Mapping[str, Verdict] | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[tuple[str, Any]]:
        """Run a thread and yield its progress as it happens: start it, or resume it.

        With ``task``, the thread is started (``start``); otherwise it is
        resumed with the answers given (``resume``). Yields
        ``("updates", chunk)`` for each graph update as LangGraph's
        ``stream_mode="updates"`` gives it (``{node: update}``, and
        ``{"__interrupt__": ...}`` when the run stops at a review), then one
        ``("result", RunResult)`` last. The run goes on in a worker thread, as
        for ``astart``; closing the iterator early (``break``, cancellation)
        asks the run to stop at its next step boundary and waits for it.

        Raises:
            The errors of ``start`` / ``resume``, from the iteration.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def listen(chunk: Mapping[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ("updates", chunk))

        if task is not None:
            run = self._in_thread(self.start, task, thread_id=thread_id, _listener=listen)
        else:
            run = self._in_thread(
                self.resume,
                thread_id,
                decisions=decisions,
                verdicts=verdicts,
                answers=answers,
                _listener=listen,
            )
        work = asyncio.ensure_future(run)
        work.add_done_callback(lambda _: queue.put_nowait(("done", None)))
        try:
            while True:
                kind, item = await queue.get()
                if kind == "done":
                    break
                yield kind, item
            yield "result", await work
        finally:
            if not work.done():
                work.cancel()
                await asyncio.wait([work])

    async def _in_thread(
        self,
        fn: Callable[..., RunResult],
        *args: Any,
        _listener: EventHook | None = None,
        **kw: Any,
    ) -> RunResult:
        started: list[int] = []
        cancelled = threading.Event()

        def call() -> RunResult:
            if cancelled.is_set():
                raise asyncio.CancelledError
            ident = threading.get_ident()
            started.append(ident)
            if _listener is None:
                return fn(*args, **kw)
            self._listeners[ident] = _listener
            try:
                return fn(*args, **kw)
            finally:
                self._listeners.pop(ident, None)

        work = asyncio.ensure_future(asyncio.to_thread(call))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            # Stop this run only (other threads of this agent go on), at its
            # next step boundary, and wait: nothing is left half-recorded.
            cancelled.set()
            control = self._controls.get(started[0]) if started else None
            if control is not None:
                control.request_drain("cancelled by the caller")
            await asyncio.wait([work])
            raise

    # ------------------------------------------------------------- inspection

    def status(self, thread_id: str) -> RunResult:
        """Read where a thread stands, without running anything.

        A thread whose last follow-up turn was recorded but has not run yet
        (a crash right after ``send`` recorded it) is ``INCOMPLETE``, with
        the turn named in ``error``: ``resume`` runs it.
        """
        result = self._status(thread_id)
        if result.status is RunStatus.DONE:
            turns = self._turns(thread_id)
            if turns and _turn_id(thread_id, turns[-1]) not in {
                m.id for m in self.messages(thread_id)
            }:
                turn = turns[-1].input
                result = replace(
                    result,
                    status=RunStatus.INCOMPLETE,
                    final_message=None,
                    error=f"turn {turn.get('turn')} ({_clip(turn.get('message'))}) is recorded "
                    "but has not run yet: resume runs it",
                )
        return self._with_shared(result)

    def _status(self, thread_id: str) -> RunResult:
        # The head is read BEFORE the state: if the thread moves in between,
        # the remembered head is older than what was read and ``resume`` takes
        # the full path; read after, a newer head could vouch for stale interrupts.
        head = self._head(thread_id)
        waiting = self._waiting_at_head(thread_id, head)
        if waiting is not None:
            return waiting
        snapshot = self.graph.get_state(self._config(thread_id))
        self._used[thread_id] = _operation_ids(snapshot.values.get("messages", []))
        ops = self.ledger.list(thread_id=thread_id)
        if snapshot.metadata is None:
            return RunResult(thread_id=thread_id, status=RunStatus.NOT_STARTED, operations=ops)
        missing = self._missing_nodes(thread_id, snapshot)
        if missing:
            return RunResult(
                thread_id=thread_id,
                status=RunStatus.INCOMPLETE,
                operations=ops,
                error=_missing_message(thread_id, missing),
            )
        interrupts = self._interrupts(snapshot)
        pending = self._open(thread_id, interrupts)
        if pending:
            if head is not None:
                # What a run that stopped here would remember: a ``resume``
                # that follows, while the head is unchanged, answers these
                # interrupts without reading the whole state again (``_resume``).
                # Every node they need exists (``_missing_nodes`` above).
                self._stops[thread_id] = _Stop(head=head, interrupts=interrupts)
            return _waiting_result(thread_id, pending, ops)
        if snapshot.tasks:
            errors = [str(t.error) for t in snapshot.tasks if t.error]
            return RunResult(
                thread_id=thread_id,
                status=RunStatus.INCOMPLETE,
                operations=ops,
                error="; ".join(errors) or _STOPPED_MID_STEP,
            )
        messages = snapshot.values.get("messages", [])
        return RunResult(
            thread_id=thread_id,
            status=RunStatus.DONE,
            operations=ops,
            final_message=_refused_repeat(messages) or _final_text(messages),
        )

    def _waiting_at_head(self, thread_id: str, head: _Head | None) -> RunResult | None:
        """``_status`` of a thread waiting at interrupts, without rebuilding its messages.

        ``get_state`` deserializes the whole message history (O(thread
        length)) though a thread paused at an interrupt needs only the head's
        tasks and interrupts (``head_state``) and, for ``_with_shared``, the
        other threads' operations its tool messages name, which a byte scan
        of the stored messages rules out (``_no_shared_named``). ``None``
        whenever any part is not clearly covered: ``_status`` then takes the
        full path, which gives the same result for what this one answers.
        """
        if head is None:
            return None
        state = self._head_state(thread_id)
        if state is None or state.checkpoint["id"] != head.checkpoint_id or not state.interrupts:
            return None  # moved since the head was read, or not waiting: the full path says why
        interrupts = self._interrupts(state)
        pending = self._open(thread_id, interrupts)
        if not pending:
            return None  # every review already decided: what runs next is the full path's
        ops = self.ledger.list(thread_id=thread_id)
        if not self._names_only_own(thread_id, ops):
            return None
        self._stops[thread_id] = _Stop(head=head, interrupts=interrupts)  # as ``_status`` does
        return _waiting_result(thread_id, pending, ops)

    def _head_state(self, thread_id: str) -> HeadState | None:
        """``head_state`` of the thread, if every node its tasks need exists.

        ``None`` for another saver, a head ``head_state`` cannot read, or a
        missing node (the full path words that refusal): the caller then
        takes the full path.
        """
        saver = self.graph.checkpointer
        if not isinstance(saver, StepDurableSaver):
            return None
        state = head_state(self.graph, saver, self._config(thread_id))
        if state is None or self._missing_nodes(thread_id, state, checkpoint=state.checkpoint):
            return None
        return state

    def _names_only_own(self, thread_id: str, ops: Sequence[Operation]) -> bool:
        """Whether the thread's tool messages name only ``ops``; if so, ``_used`` is set.

        Only other threads' operations matter to ``_with_shared`` (it drops
        the thread's own), so an empty set then stands for what
        ``_operation_ids`` would read out of the whole history.
        """
        saver = self.graph.checkpointer
        if not isinstance(saver, StepDurableSaver) or not self._no_shared_named(
            thread_id, saver, ops
        ):
            return False
        self._used[thread_id] = frozenset()
        return True

    @staticmethod
    def _no_shared_named(thread_id: str, saver: StepDurableSaver, ops: Sequence[Operation]) -> bool:
        """Whether the thread's tool messages name only its own operations (``_operation_ids``).

        ``_operation_ids`` reads ``"operation_id": "<id>"`` out of a tool
        message's JSON text; msgpack keeps that text as its UTF-8 bytes in a
        stored write or snapshot of ``messages``. When every occurrence of the
        key in those bytes (``StepDurableSaver.raw_mentions``, every branch of
        the thread: a superset) is followed by one of ``ops``' ids as a plain
        JSON string, whatever ``_operation_ids`` would find is among ``ops``.
        Anything else (an escape in the string, another id, another layout,
        another serializer) answers ``False``: read the messages.
        """
        blobs = saver.raw_mentions(thread_id, "messages", _OPERATION_KEY)
        if blobs is None:
            return False
        own = {op.operation_id.encode() for op in ops}
        for blob in blobs:
            if b"\\u" in blob:
                return False  # an escaped key ("operation\\u005fid") would hide from the scan
            for at in _OPERATION_KEY_RE.finditer(blob):
                named = _OPERATION_VALUE_RE.match(blob, at.end())
                if named is None or named.group(1) not in own:
                    return False
        return True

    def messages(self, thread_id: str) -> list[AnyMessage]:
        """Return the thread's current message history."""
        snapshot = self.graph.get_state(self._config(thread_id))
        return list(snapshot.values.get("messages", []))

    def prune(self, policy: PrunePolicy, *, dry_run: bool = False) -> PruneReport:
        """Remove old checkpoints, threads and ledger rows (``effectgate.retention.prune``).

        Args:
            policy: what to remove: ``keep_last`` checkpoints per thread,
                ``finished_older_than``, ``delete_threads``, the ledger windows.
            dry_run: only report what would go.

        Returns:
            A ``PruneReport``: threads deleted and kept (with why), rows and
            bytes removed, the sizes before and after (SQLite files on disk,
            or PostgreSQL tables).

        Raises:
            ConfigError: the policy is impossible, or the saver is neither an
                SQLite nor a PostgreSQL one.
        """
        return prune(self, policy, dry_run=dry_run)

    # -------------------------------------------------------------- internals

    def _with_shared(self, result: RunResult) -> RunResult:
        """``result`` with the other threads' operations this thread met (``shared_operations``)."""
        named = self._used.get(result.thread_id, frozenset()) | {
            str(item.value.get("operation_id"))
            for item in result.interrupts
            if item.kind == "reconciliation"  # it may be another thread's keyed operation
        }
        own = {op.operation_id for op in result.operations}
        shared = []
        for op_id in sorted(named - own):
            op = self.ledger.get(op_id)
            if op is not None and op.thread_id != result.thread_id:
                shared.append(op)
        if not shared:
            return result
        shared.sort(key=lambda op: (op.created_at, op.operation_id))
        return replace(result, shared_operations=shared)

    def _config(self, thread_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id}, "recursion_limit": self.recursion_limit}

    def _head(self, thread_id: str) -> _Head | None:
        """The thread's latest checkpoint id and the writes attached to it.

        Every run, fork, resume answer or finished task of the thread changes
        one or the other (a new checkpoint, or a new pending write), whichever
        process made it. ``resume`` compares it with what its own last run
        left to decide whether that run's interrupts are still the pending
        ones. ``None`` (never equal to a remembered head) for a thread without
        checkpoints or a saver other than ``StepDurableSaver`` and
        ``StepDurablePostgresSaver``.
        """
        saver = self.graph.checkpointer
        # The PostgreSQL saver's module is loaded whenever such a saver exists;
        # looking it up instead of importing it keeps psycopg out of SQLite runs.
        pg = sys.modules.get("effectgate.graph._pg_saver")
        if not isinstance(saver, StepDurableSaver) and not (
            pg is not None and isinstance(saver, pg.StepDurablePostgresSaver)
        ):
            return None  # other savers: always the full path
        found = saver.head(thread_id)
        return None if found is None else _Head(checkpoint_id=found[0], writes=found[1])

    def _missing_nodes(
        self, thread_id: str, snapshot: Any, *, checkpoint: Checkpoint | None = None
    ) -> list[str]:
        # LangGraph drops pending tasks for nodes the graph does not have
        # ("Ignoring unknown node name ...") and would call the thread done:
        # an agent rebuilt without a tool must say so, not lose the call.
        wanted = {t.name for t in snapshot.tasks}
        if snapshot.tasks:
            # Unfinished work with fewer tools than the thread began with: a
            # pending read would be answered "unknown tool" and the model
            # might give up, ending the thread without the work it planned.
            record = self.ledger.get_thread(thread_id)
            started_with = record.metadata.get("tools", []) if record is not None else []
            wanted |= {f"tool {name}" for name in started_with if name not in self.parts.specs}
        # Calls waiting at a review go to their effect nodes once answered; a
        # review node rebuilt without one of those tools would drop the call.
        for item in snapshot.interrupts:
            value = item.value if isinstance(item.value, Mapping) else {}
            for action in value.get("action_requests", ()) if value.get("type") == "review" else ():
                if action.get("effect_kind") != "read":  # a gated read runs in "tools"
                    wanted.add(effect_node_name(str(action.get("name"))))
        # Sends to a node the graph lacks are not among ``snapshot.tasks``: read
        # them from the checkpoint (``checkpoint``: the one the snapshot was read from).
        saver = self.graph.checkpointer
        if checkpoint is None and isinstance(saver, BaseCheckpointSaver):
            stored = saver.get_tuple(self._config(thread_id))
            checkpoint = stored.checkpoint if stored else None
        sends = checkpoint["channel_values"].get(TASKS, []) if checkpoint else []
        wanted |= {send.node for send in sends if isinstance(send, Send)}
        return sorted(wanted - set(self.graph.nodes))  # "tool x" is never a node name

    def _check_nodes(self, thread_id: str, snapshot: Any) -> None:
        missing = self._missing_nodes(thread_id, snapshot)
        if missing:
            raise ConfigError(_missing_message(thread_id, missing))

    @staticmethod
    def _interrupts(snapshot: Any) -> list[PendingInterrupt]:
        return [PendingInterrupt.of(i.id, i.value) for i in snapshot.interrupts]

    @contextmanager
    def _lease(self, thread_id: str, notes: list[str]) -> Iterator[Lease]:
        """Hold ``thread_id``'s lease for the block; a failed release becomes a note.

        The run's own result (or exception) is what the caller gets: a
        release that fails (the ledger stayed locked) must not replace it.
        The lease is then no longer renewed and expires by itself.
        """
        waited = 0.0
        pause = 0.005
        while True:
            try:
                lease = self.ledger.acquire_lease(thread_id, self.worker, self.lease_ttl_s)
                break
            except ThreadBusyError as exc:
                if owner_is_gone(exc.owner):
                    # The holder's process is gone (kill -9): waiting for its lease
                    # to expire would only delay recovery. Take it over, fenced by owner.
                    lease = self.ledger.acquire_lease(
                        thread_id, self.worker, self.lease_ttl_s, take_over_from=exc.owner
                    )
                    break
                if waited >= self.lease_wait_s:
                    raise
                # A live holder, perhaps only for a moment (another process
                # checking the thread): wait a little, as long as allowed.
                pause = min(pause * 2, 0.1, self.lease_wait_s - waited)
                time.sleep(pause)
                waited += pause
        self._keeper.hold(lease)
        try:
            yield lease
        finally:
            try:
                self._keeper.release(thread_id)
            except LedgerError as exc:
                notes.append(
                    f"the lease of thread {thread_id!r} could not be released ({exc}); "
                    f"it expires by itself within {self.lease_ttl_s:g} s"
                )

    def _run(
        self, thread_id: str, value: Any, *, config: RunnableConfig | None = None
    ) -> RunResult:
        control = RunControl()
        self._controls[threading.get_ident()] = control
        if self._stop_reason is not None:
            # asked before this run began (e.g. while waiting for the lease)
            control.request_drain(self._stop_reason)
        error = None
        seen = _Seen()
        try:
            for chunk in self.graph.stream(
                value,
                config or self._config(thread_id),
                stream_mode="updates",
                durability="sync",
                control=control,
            ):
                seen.add(chunk)
                if self.on_event is not None:
                    self.on_event(chunk)
                listener = self._listeners.get(threading.get_ident())
                if listener is not None:
                    listener(chunk)
        except GraphDrained as exc:
            error = f"stopped at a step boundary: {getattr(exc, 'reason', exc)}"
        except Exception as exc:  # noqa: BLE001
            # A node failed (model 5xx after its retries, a corrupt ledger row,
            # a bug). LangGraph has checkpointed the failed step, so the thread
            # stays resumable; report it instead of losing the thread's state.
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self._controls.pop(threading.get_ident(), None)
            self._stop_reason = None  # a stop applies to the run it was asked for
            if seen.operation_ids:
                self._used[thread_id] = self._used.get(thread_id, frozenset()) | seen.operation_ids
        if error is None and config is None and (seen.interrupts or seen.final is not None):
            # The stream already told us how the run ended: skip reloading the
            # whole checkpoint (O(history)) just to read it back (benchmarks,
            # "lean_status").
            head = self._head(thread_id) if seen.interrupts else None  # None: not remembered
            if head is not None:
                self._stops[thread_id] = _Stop(head=head, interrupts=seen.interrupts)
            return seen.result(thread_id, self.ledger.list(thread_id=thread_id))
        result = self._status(thread_id)
        if error is not None:
            return RunResult(
                thread_id=result.thread_id,
                status=result.status,
                interrupts=result.interrupts,
                operations=result.operations,
                final_message=result.final_message,
                error=error,
            )
        return result


def _noted(result: RunResult, notes: list[str]) -> RunResult:
    return replace(result, notes=[*result.notes, *notes]) if notes else result


def _operation_ids(messages: Sequence[Any]) -> frozenset[str]:
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


_OPERATION_KEY = b'"operation_id"'
_OPERATION_KEY_RE = re.compile(re.escape(_OPERATION_KEY))
_OPERATION_VALUE_RE = re.compile(rb'\s*:\s*"([^"\\]*)"')
"""After the key: ``: "<id>"`` with no escape in the id (JSON's own spacing allowed)."""

_STOPPED_MID_STEP = (
    "a run stopped before finishing its step (killed or stopped): resume continues it"
)
"""Why a thread is incomplete when no task recorded an error (``RunResult.error``)."""


def _waiting_result(
    thread_id: str, pending: Sequence[PendingInterrupt], operations: list[Operation]
) -> RunResult:
    return RunResult(
        thread_id=thread_id,
        status=_waiting(pending),
        interrupts=list(pending),
        operations=operations,
    )


def _waiting(pending: Sequence[PendingInterrupt]) -> RunStatus:
    """A reconciliation outranks a review: it is what blocks the thread longest."""
    if any(p.kind == "reconciliation" for p in pending):
        return RunStatus.WAITING_RECONCILIATION
    return RunStatus.WAITING_REVIEW


class _LeaseKeeper:
    """Renews the thread leases an agent holds, from one background thread.

    Every ``ttl_s / 3`` seconds each held lease is renewed; a lease another
    runner took (``ThreadBusyError``) is dropped and ``on_lost`` asks the run
    to stop at its next step boundary. One lock orders renewals and releases,
    so a released lease is never renewed again. The thread starts with the
    first lease held and ends once a period passes with none held: an idle
    agent keeps no thread, and back-to-back runs do not start one each.
    """

    def __init__(
        self, ledger: Ledger, ttl_s: float, on_lost: Callable[[str], None], *, name: str
    ) -> None:
        self._name = name
        self._ledger = ledger
        self._ttl_s = ttl_s
        self._on_lost = on_lost
        self._held: dict[str, Lease] = {}
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[lease.thread_id] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def release(self, thread_id: str) -> None:
        with self._lock:
            lease = self._held.pop(thread_id, None)
            if lease is not None:
                self._ledger.release_lease(lease)

    def _loop(self) -> None:
        with self._lock:
            try:
                while True:
                    self._lock.wait(self._ttl_s / 3)
                    if not self._held:
                        return
                    for thread_id, lease in list(self._held.items()):
                        self._renew(thread_id, lease)
            finally:
                self._thread = None

    def _renew(self, thread_id: str, lease: Lease) -> None:
        try:
            self._held[thread_id] = self._ledger.renew_lease(lease, self._ttl_s)
        except ThreadBusyError:
            del self._held[thread_id]
            self._on_lost("thread lease lost to another runner")
        except Exception:  # noqa: BLE001
            # The ledger was busy or failed for a moment: keep the lease and try
            # again next period; it stays valid for two more periods. Losing
            # the keeper thread instead would let every lease of this agent expire.
            return


@dataclass(frozen=True, slots=True)
class _Head:
    checkpoint_id: str
    writes: tuple[Any, ...]
    """Every write attached to the checkpoint, as stored: (task id, index, channel, bytes)."""


@dataclass(frozen=True, slots=True)
class _Stop:
    """A run of this agent ended at ``interrupts`` with the thread at ``head``."""

    head: _Head
    interrupts: list[PendingInterrupt]

    def result(self, thread_id: str, operations: list[Operation]) -> RunResult:
        return _waiting_result(thread_id, self.interrupts, operations)


class _Seen:
    """What a run's ``updates`` stream showed: interrupts and the last AI text."""

    def __init__(self) -> None:
        self.interrupts: list[PendingInterrupt] = []
        self.final: str | None = None
        self.operation_ids: frozenset[str] = frozenset()
        """Operation ids named by the tool messages the run wrote."""

    def add(self, chunk: Mapping[str, Any]) -> None:
        for node, update in chunk.items():
            if node == "__interrupt__":
                self.interrupts += [PendingInterrupt.of(i.id, i.value) for i in update]
                continue
            if node != "agent" and isinstance(update, Mapping):
                named = _operation_ids(update.get("messages") or [])
                if named:
                    self.operation_ids |= named
            if node == "agent" and isinstance(update, Mapping):
                messages = update.get("messages") or []
                last = messages[-1] if messages else None
                if isinstance(last, AIMessage):
                    self.final = None if last.tool_calls else _final_text([last])

    def result(self, thread_id: str, operations: list[Operation]) -> RunResult:
        if self.interrupts:
            return _waiting_result(thread_id, self.interrupts, operations)
        return RunResult(
            thread_id=thread_id,
            status=RunStatus.DONE,
            final_message=self.final,
            operations=operations,
        )


def _check_answers_shape(decisions: Any, verdicts: Any, answers: Any) -> None:
    if decisions is not None:
        answer_protocol.review_decisions(decisions)  # the one shape rule
    if verdicts is not None and not isinstance(verdicts, Mapping):
        raise DecisionError("verdicts must map operation ids to verdicts")
    if answers is not None and not isinstance(answers, Mapping):
        raise DecisionError("answers must map interrupt ids to answers")


def _missing_message(thread_id: str, missing: Sequence[str]) -> str:
    return (
        f"thread {thread_id!r} has pending work and needs {', '.join(missing)}, which this "
        "agent does not have; rebuild it with the same tools the thread started with "
        "(from the CLI: --agent MODULE:FACTORY loads an agent with your own tools; "
        "resume --with-services brings the demo ticket and mail tools)"
    )


def _refused_repeat(messages: Sequence[AnyMessage]) -> str | None:
    """The stop notice when the run ended on a call rejected too often, else ``None``."""
    last = messages[-1] if messages else None
    if isinstance(last, ToolMessage) and '"refused_repeat"' in str(last.content):
        try:
            return str(json.loads(str(last.content))["error"])
        except (ValueError, KeyError):
            return None
    return None


def _final_text(messages: Sequence[AnyMessage]) -> str | None:
    for msg in reversed(messages):
        if isinstance(msg, AIMessage):
            return msg.text if hasattr(msg, "text") else str(msg.content)
    return None


def turn_message_id(thread_id: str, turn: int) -> str:
    """Return the message id of follow-up turn ``turn`` (2, 3, ...) of a thread.

    Deterministic, so adding the turn's message again after a crash replaces
    it instead of appending a second copy (LangGraph's ``add_messages``
    reducer replaces a message with the same id).
    """
    return f"turn-{uuid.uuid5(uuid.NAMESPACE_URL, f'effectgate:{thread_id}:{turn}').hex}"


def is_turn_record(thread_id: str) -> bool:
    """Whether a ledger thread record is a follow-up turn (``T#turn-n``), not a thread."""
    head, sep, tail = thread_id.rpartition(_TURN)
    return bool(sep and head and tail.isdigit())


def record_thread(thread_id: str) -> str:
    """The thread a ledger thread record belongs to: ``T`` for ``T#turn-n``, else the id itself."""
    return thread_id.rpartition(_TURN)[0] if is_turn_record(thread_id) else thread_id


def _turn_key(thread_id: str, turn: int) -> str:
    return f"{thread_id}{_TURN}{turn}"


def _turn_id(thread_id: str, record: ThreadRecord) -> str:
    return turn_message_id(thread_id, int(record.input.get("turn", 0)))


def _clip(text: Any, limit: int = 80) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")
