"""Reading where a thread stands, for ``Agent``: status, pending interrupts, shared operations.

``ThreadReader`` reads a thread back from its checkpoints and the ledger
without running anything. It also keeps what ``Agent``'s runs learnt about a
thread (``stops``: where its last run stopped at interrupts; ``used``: the
operation ids its tool messages named), so that a status or resume of a
thread that did not move since need not reload its whole message history
(benchmarks, "lean_status").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.constants import TASKS
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from effectgate import answers as answer_protocol
from effectgate._recent import Recent
from effectgate.errors import ConfigError
from effectgate.graph._results import (
    OPERATION_KEY,
    OPERATION_KEY_RE,
    OPERATION_VALUE_RE,
    STOPPED_MID_STEP,
    Head,
    PendingInterrupt,
    RunResult,
    Stop,
    final_text,
    missing_message,
    operation_ids,
    refused_repeat,
    waiting_result,
)
from effectgate.graph._saver import HeadState, StepDurableSaver, head_state
from effectgate.graph._state import RunStatus, effect_node_name
from effectgate.ledger import Ledger, Operation
from effectgate.tools import ToolSpec

__all__ = ["HISTORY_LOOKBACK", "ThreadReader"]

HISTORY_LOOKBACK = 500
"""Most checkpoints read back to find the review an answer names (an error path)."""


class ThreadReader:
    """Reads threads of one agent's graph back, and remembers where its runs stopped.

    Args:
        graph: the agent's compiled graph (its checkpointer is read).
        ledger: the operation ledger (threads, operations, decisions).
        specs: the agent's tools by name (a thread may need one it lacks).
        config: the run config of a thread id (``Agent._config``).
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        ledger: Ledger,
        specs: Mapping[str, ToolSpec],
        config: Callable[[str], RunnableConfig],
    ) -> None:
        self.graph = graph
        self.ledger = ledger
        self.specs = specs
        self._config = config
        self.stops: Recent[str, Stop] = Recent(1024)
        """Where this agent's last runs stopped at interrupts, by thread (see ``head``)."""
        self.used: Recent[str, frozenset[str]] = Recent(1024)
        """Per thread: operation ids its tool messages named, as far as this agent saw."""

    def status(self, thread_id: str) -> RunResult:
        """Where the thread stands (``Agent.status`` without its follow-up-turn check).

        A thread waiting at interrupts is remembered in ``stops`` (the next
        resume then answers them without reading the whole state again).
        """
        # The head is read BEFORE the state: if the thread moves in between,
        # the remembered head is older than what was read and ``resume`` takes
        # the full path; read after, a newer head could vouch for stale interrupts.
        head = self.head(thread_id)
        waiting = self.waiting_at_head(thread_id, head)
        if waiting is not None:
            return waiting
        snapshot = self.graph.get_state(self._config(thread_id))
        self.used[thread_id] = operation_ids(snapshot.values.get("messages", []))
        ops = self.ledger.list(thread_id=thread_id)
        if snapshot.metadata is None:
            return RunResult(thread_id=thread_id, status=RunStatus.NOT_STARTED, operations=ops)
        missing = self.missing_nodes(thread_id, snapshot)
        if missing:
            return RunResult(
                thread_id=thread_id,
                status=RunStatus.INCOMPLETE,
                operations=ops,
                error=missing_message(thread_id, missing),
            )
        interrupts = self.interrupts(snapshot)
        pending = self.open_interrupts(thread_id, interrupts)
        if pending:
            if head is not None:
                # What a run that stopped here would remember: a ``resume``
                # that follows, while the head is unchanged, answers these
                # interrupts without reading the whole state again (``Agent._resume``).
                # Every node they need exists (``missing_nodes`` above).
                self.stops[thread_id] = Stop(head=head, interrupts=interrupts)
            return waiting_result(thread_id, pending, ops)
        if snapshot.tasks:
            errors = [str(t.error) for t in snapshot.tasks if t.error]
            return RunResult(
                thread_id=thread_id,
                status=RunStatus.INCOMPLETE,
                operations=ops,
                error="; ".join(errors) or STOPPED_MID_STEP,
            )
        messages = snapshot.values.get("messages", [])
        return RunResult(
            thread_id=thread_id,
            status=RunStatus.DONE,
            operations=ops,
            final_message=refused_repeat(messages) or final_text(messages),
        )

    def waiting_at_head(self, thread_id: str, head: Head | None) -> RunResult | None:
        """``status`` of a thread waiting at interrupts, without rebuilding its messages.

        ``get_state`` deserializes the whole message history (O(thread
        length)) though a thread paused at an interrupt needs only the head's
        tasks and interrupts (``head_state``) and, for ``with_shared``, the
        other threads' operations its tool messages name, which a byte scan
        of the stored messages rules out (``no_shared_named``). ``None``
        whenever any part is not clearly covered: ``status`` then takes the
        full path, which gives the same result for what this one answers.
        """
        if head is None:
            return None
        state = self.usable_head_state(thread_id)
        if state is None or state.checkpoint["id"] != head.checkpoint_id or not state.interrupts:
            return None  # moved since the head was read, or not waiting: the full path says why
        interrupts = self.interrupts(state)
        pending = self.open_interrupts(thread_id, interrupts)
        if not pending:
            return None  # every review already decided: what runs next is the full path's
        ops = self.ledger.list(thread_id=thread_id)
        if not self.names_only_own(thread_id, ops):
            return None
        self.stops[thread_id] = Stop(head=head, interrupts=interrupts)  # as ``status`` does
        return waiting_result(thread_id, pending, ops)

    def usable_head_state(self, thread_id: str) -> HeadState | None:
        """``head_state`` of the thread, if every node its tasks need exists.

        ``None`` for another saver, a head ``head_state`` cannot read, or a
        missing node (the full path words that refusal): the caller then
        takes the full path.
        """
        saver = self.graph.checkpointer
        if not isinstance(saver, StepDurableSaver):
            return None
        state = head_state(self.graph, saver, self._config(thread_id))
        if state is None or self.missing_nodes(thread_id, state, checkpoint=state.checkpoint):
            return None
        return state

    def names_only_own(self, thread_id: str, ops: Sequence[Operation]) -> bool:
        """Whether the thread's tool messages name only ``ops``; if so, ``used`` is set.

        Only other threads' operations matter to ``with_shared`` (it drops
        the thread's own), so an empty set then stands for what
        ``operation_ids`` would read out of the whole history.
        """
        saver = self.graph.checkpointer
        if not isinstance(saver, StepDurableSaver) or not self.no_shared_named(
            thread_id, saver, ops
        ):
            return False
        self.used[thread_id] = frozenset()
        return True

    @staticmethod
    def no_shared_named(thread_id: str, saver: StepDurableSaver, ops: Sequence[Operation]) -> bool:
        """Whether the thread's tool messages name only its own operations (``operation_ids``).

        ``operation_ids`` reads ``"operation_id": "<id>"`` out of a tool
        message's JSON text; msgpack keeps that text as its UTF-8 bytes in a
        stored write or snapshot of ``messages``. When every occurrence of the
        key in those bytes (``StepDurableSaver.raw_mentions``, every branch of
        the thread: a superset) is followed by one of ``ops``' ids as a plain
        JSON string, whatever ``operation_ids`` would find is among ``ops``.
        Anything else (an escape in the string, another id, another layout,
        another serializer) answers ``False``: read the messages.
        """
        blobs = saver.raw_mentions(thread_id, "messages", OPERATION_KEY)
        if blobs is None:
            return False
        own = {op.operation_id.encode() for op in ops}
        for blob in blobs:
            if b"\\u" in blob:
                return False  # an escaped key ("operation\\u005fid") would hide from the scan
            for at in OPERATION_KEY_RE.finditer(blob):
                named = OPERATION_VALUE_RE.match(blob, at.end())
                if named is None or named.group(1) not in own:
                    return False
        return True

    def snapshot(self, thread_id: str) -> Any:
        """The thread's current state (``graph.get_state``)."""
        return self.graph.get_state(self._config(thread_id))

    def messages(self, thread_id: str) -> list[AnyMessage]:
        """Return the thread's current message history."""
        snapshot = self.graph.get_state(self._config(thread_id))
        return list(snapshot.values.get("messages", []))

    def with_shared(self, result: RunResult) -> RunResult:
        """``result`` with the other threads' operations this thread met (``shared_operations``)."""
        named = self.used.get(result.thread_id, frozenset()) | {
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

    def head(self, thread_id: str) -> Head | None:
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
        return None if found is None else Head(checkpoint_id=found[0], writes=found[1])

    def missing_nodes(
        self, thread_id: str, snapshot: Any, *, checkpoint: Checkpoint | None = None
    ) -> list[str]:
        """The nodes the thread's pending work needs that this agent's graph lacks, sorted.

        ``checkpoint``: the one ``snapshot`` was read from, if at hand.
        """
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
            wanted |= {f"tool {name}" for name in started_with if name not in self.specs}
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

    def check_nodes(self, thread_id: str, snapshot: Any) -> None:
        """Refuse a thread whose pending work needs a node this agent lacks.

        Raises:
            ConfigError: names the missing nodes and how to rebuild the agent.
        """
        missing = self.missing_nodes(thread_id, snapshot)
        if missing:
            raise ConfigError(missing_message(thread_id, missing))

    @staticmethod
    def interrupts(snapshot: Any) -> list[PendingInterrupt]:
        """The snapshot's pending interrupts, wrapped (``PendingInterrupt.of``)."""
        return [PendingInterrupt.of(i.id, i.value) for i in snapshot.interrupts]

    def shown_under(self, thread_id: str, interrupt_id: str) -> Mapping[str, Any] | None:
        """The review request this thread showed under ``interrupt_id``, from its history.

        Read only when an answer names an interrupt that is not pending (an
        error or a repeated answer), so walking the checkpoints is affordable.
        """
        for n, snap in enumerate(self.graph.get_state_history(self._config(thread_id))):
            if n >= HISTORY_LOOKBACK:
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

    def open_interrupts(
        self, thread_id: str, pending: Sequence[PendingInterrupt]
    ) -> list[PendingInterrupt]:
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

    def judge_stale(
        self,
        thread_id: str,
        interrupt_id: str | None,
        answer: Mapping[str, Any],
        pending: Sequence[PendingInterrupt],
    ) -> answer_protocol.AnswerOutcome:
        """Judge an answer to a review that is no longer open (``answers.settle_stale``).

        Raises:
            DecisionError: the answer names a review this thread never showed,
                or contradicts the decision recorded for it.
        """
        shown = self.shown_under(thread_id, interrupt_id) if interrupt_id else None
        return answer_protocol.settle_stale(
            self.ledger, thread_id, answer, shown, interrupt_id=interrupt_id, pending=pending
        )
