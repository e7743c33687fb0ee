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

This module is the facade: the runs and the resume rule. Its collaborators
are siblings: ``_lease`` (taking and renewing the thread lease), ``_reading``
(status, pending interrupts, shared operations), ``_turns`` (follow-up turn
records), ``_async_runs`` (the async twins' worker threads) and ``_results``
(``RunResult``, ``PendingInterrupt``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from effectgate import answers as answer_protocol
from effectgate._clock import Clock
from effectgate._process import new_worker_id
from effectgate._recent import Recent
from effectgate.answers import SUPERSEDED, check_review_answer
from effectgate.dispatch import Verdict
from effectgate.errors import ConfigError, DecisionError
from effectgate.graph._async_runs import in_thread, stream_updates
from effectgate.graph._build import AgentParts, build_agent
from effectgate.graph._drive import Runs
from effectgate.graph._policy import Policy
from effectgate.graph._prune import PrunePolicy, PruneReport, prune
from effectgate.graph._reading import ThreadReader
from effectgate.graph._results import (
    EventHook,
    PendingInterrupt,
    RunResult,
    Seen,
    Stop,
    check_answers_shape,
    clip,
    noted,
    operation_ids,
)
from effectgate.graph._state import RunStatus
from effectgate.graph._turns import (
    TURN,
    check_at_rest,
    close_calls,
    is_turn_record,
    record_thread,
    recorded_turns,
    turn_id,
    turn_message_id,
    turn_to_run,
    unapplied_turn,
)
from effectgate.ledger import LeaseKeeper, Ledger, Operation, ThreadRecord
from effectgate.ledger._tombstones import refuse_deleted
from effectgate.tools import ToolSpec

__all__ = [
    "SUPERSEDED",
    "Agent",
    "PendingInterrupt",
    "RunResult",
    "RunStatus",
    "check_review_answer",
    "is_turn_record",
    "record_thread",
    "turn_message_id",
]


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
        self._keeper = LeaseKeeper(
            ledger, lease_ttl_s, self.request_stop, name=f"effectgate-lease-keeper {self.worker}"
        )
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
            leases=self._keeper,  # a dispatch inside a run holds its lease already
        )
        self.graph = self.parts.graph
        self.ledger = ledger
        self.dispatcher = self.parts.dispatcher
        self.lease_ttl_s = lease_ttl_s
        self.lease_wait_s = lease_wait_s
        self.recursion_limit = recursion_limit
        self.on_event = on_event
        self._runs = Runs()
        """The runs under way: their controls, stop requests and ``astream`` listeners."""
        self._reader = ThreadReader(self.graph, ledger, self.parts.specs, self._config)
        """Reads threads back; keeps where this agent's runs stopped (``_stops``)."""
        self._stops: Recent[str, Stop] = self._reader.stops
        """Where this agent's last runs stopped at interrupts, by thread (``ThreadReader.head``)."""
        self._used: Recent[str, frozenset[str]] = self._reader.used
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
                f"thread id {thread_id!r}: ids ending in '{TURN}<n>' name the follow-up turns "
                "of a thread; choose another id"
            )
        # The tools the thread starts with, so a later resume can refuse an
        # agent rebuilt without one of them (see ``_missing_nodes``).
        record_meta = {**(metadata or {}), "tools": sorted(self.parts.specs)}
        record = self.ledger.record_thread(thread_id, {"task": task}, record_meta)
        if dict(record.input) != {"task": task}:
            raise ConfigError(
                f"thread {thread_id!r} already exists with another task: it was started with "
                f"{clip(record.input.get('task'))}, not {clip(task)}; send a follow-up "
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
        record = turn_to_run(
            self._reader, thread_id, message, supersede=supersede, request_id=request_id
        )
        if record is None:
            return self._continue(thread_id)  # a retry of a turn already recorded
        return self._reader.with_shared(self._apply_turn(thread_id, record, supersede=supersede))

    def _apply_turn(self, thread_id: str, record: ThreadRecord, *, supersede: bool) -> RunResult:
        """Add a recorded turn's message (once: its id is deterministic) and run it."""
        # Runs under the thread's lease.
        self.ledger.recover_in_flight(thread_id=thread_id)
        config = self._config(thread_id)
        snapshot = self.graph.get_state(config)
        message_id = turn_id(thread_id, record)
        if any(m.id == message_id for m in snapshot.values.get("messages", [])):
            return self._resume(thread_id, None, None, None)  # added before a crash: continue
        human = HumanMessage(str(record.input.get("message", "")), id=message_id)
        supersede = supersede or bool(record.input.get("supersede"))
        check_at_rest(self._reader, thread_id, snapshot, supersede=supersede)
        pending = self._reader.interrupts(snapshot)
        if not pending:
            return self._run(thread_id, {"messages": [human]})
        answers = close_calls(
            self._reader,
            thread_id,
            snapshot,
            pending,
            supersede=supersede,
            now=self.parts.clock.now(),
        )
        # One checkpoint holds the answers and the message, written as if the
        # tools node had answered the calls: the pending review is left
        # behind with the old checkpoint and the agent node runs next.
        self.graph.update_state(config, {"messages": [*answers, human]}, as_node="tools")
        self._stops.pop(thread_id, None)
        return self._run(thread_id, None)

    def _next_turn(self, thread_id: str, result: RunResult) -> RunResult:
        """After a resume: run a recorded turn a crash left unapplied, if any."""
        last = unapplied_turn(self._reader, thread_id, result.status)
        if last is None:
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
        with self._keeper.held(
            thread_id,
            worker=self.worker,
            ttl_s=self.lease_ttl_s,
            wait_s=self.lease_wait_s,
            notes=notes,
        ):
            refuse_deleted(self.ledger, thread_id)
            result = run()
        return noted(result, notes)

    def _continue(
        self,
        thread_id: str,
        decisions: Mapping[str, Any] | None = None,
        verdicts: Mapping[str, Verdict] | None = None,
        answers: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Under the lease: answer what waits and run, then any follow-up turn recorded."""
        result = self._resume(thread_id, decisions, verdicts, answers)
        return self._reader.with_shared(self._next_turn(thread_id, result))

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
        check_answers_shape(decisions, verdicts, answers)
        stop = self._stops.pop(thread_id, None)
        if stop is not None and stop.head == self._reader.head(thread_id):
            # Nothing moved since this agent's last run stopped at these
            # interrupts: answer them without reloading the whole state.
            pending = self._reader.open_interrupts(thread_id, stop.interrupts)
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
        self._used[thread_id] = operation_ids(snapshot.values.get("messages", []))
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
        self._reader.check_nodes(thread_id, snapshot)
        pending = self._reader.open_interrupts(thread_id, self._reader.interrupts(snapshot))
        res = answer_protocol.resolve(
            pending, ledger=self.ledger, decisions=decisions, verdicts=verdicts, answers=answers
        )
        settled = [self._reader.judge_stale(thread_id, named, a, pending) for named, a in res.stale]
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
            return self._reader.status(thread_id)
        if snapshot.tasks and (settled or not given):
            return self._run(thread_id, None)
        if given and not settled:
            raise DecisionError(
                f"nothing is pending on thread {thread_id!r}: the answer was not applied "
                "(was it answered elsewhere?)"
            )
        return self._reader.status(thread_id)

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
        state = self._reader.usable_head_state(thread_id)
        if state is None or state.interrupts or not state.tasks:
            return None
        if not self._reader.names_only_own(thread_id, self.ledger.list(thread_id=thread_id)):
            return None
        return self._run(thread_id, None)

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
            return self._reader.with_shared(self._run(thread_id, None, config=config))

        return self._under_lease(thread_id, go)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask the current run to stop at the next superstep boundary (SIGTERM, Ctrl-C)."""
        self._runs.request_stop(reason)

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

        def run(listen: EventHook) -> Awaitable[RunResult]:
            if task is not None:
                return self._in_thread(self.start, task, thread_id=thread_id, _listener=listen)
            return self._in_thread(
                self.resume,
                thread_id,
                decisions=decisions,
                verdicts=verdicts,
                answers=answers,
                _listener=listen,
            )

        async with aclosing(stream_updates(run)) as updates:
            async for item in updates:
                yield item

    async def _in_thread(
        self,
        fn: Callable[..., RunResult],
        *args: Any,
        _listener: EventHook | None = None,
        **kw: Any,
    ) -> RunResult:
        return await in_thread(fn, *args, listener=_listener, runs=self._runs, **kw)

    # ------------------------------------------------------------- inspection

    def status(self, thread_id: str) -> RunResult:
        """Read where a thread stands, without running anything.

        A thread whose last follow-up turn was recorded but has not run yet
        (a crash right after ``send`` recorded it) is ``INCOMPLETE``, with
        the turn named in ``error``: ``resume`` runs it.
        """
        result = self._reader.status(thread_id)
        if result.status is RunStatus.DONE:
            turns = recorded_turns(self.ledger, thread_id)
            if turns and turn_id(thread_id, turns[-1]) not in {
                m.id for m in self.messages(thread_id)
            }:
                turn = turns[-1].input
                result = replace(
                    result,
                    status=RunStatus.INCOMPLETE,
                    final_message=None,
                    error=f"turn {turn.get('turn')} ({clip(turn.get('message'))}) is recorded "
                    "but has not run yet: resume runs it",
                )
        return self._reader.with_shared(result)

    def messages(self, thread_id: str) -> list[AnyMessage]:
        """Return the thread's current message history."""
        return self._reader.messages(thread_id)

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

    def _config(self, thread_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": thread_id}, "recursion_limit": self.recursion_limit}

    def _run(
        self, thread_id: str, value: Any, *, config: RunnableConfig | None = None
    ) -> RunResult:
        seen = Seen()
        try:
            error = self._runs.stream(
                self.graph, value, config or self._config(thread_id), seen, on_event=self.on_event
            )
        finally:
            if seen.operation_ids:
                self._used[thread_id] = self._used.get(thread_id, frozenset()) | seen.operation_ids
        if error is None and config is None and (seen.interrupts or seen.final is not None):
            # The stream already told us how the run ended: skip reloading the
            # whole checkpoint (O(history)) just to read it back (benchmarks,
            # "lean_status").
            head = self._reader.head(thread_id) if seen.interrupts else None  # None: not remembered
            if head is not None:
                self._stops[thread_id] = Stop(head=head, interrupts=seen.interrupts)
            return seen.result(thread_id, self.ledger.list(thread_id=thread_id))
        result = self._reader.status(thread_id)
        if error is not None:
            return RunResult(
                thread_id=result.thread_id,
                status=result.status,
                interrupts=result.interrupts,
                operations=result.operations,
                final_message=result.final_message,
                error=error,
                cause=seen.failure,
            )
        return result
