"""Graph state and the interrupt payloads, as TypedDicts (they live in checkpoints).

The review request/decision shapes follow LangChain's
``HumanInTheLoopMiddleware`` (``action_requests``, ``review_configs``, resume
``{"decisions": [...]}`` with ``approve | edit | reject``), extended with what
a reviewer of a durable side effect needs (docs/architecture.md, "The graph").
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langchain_core.messages import AnyMessage, BaseMessage
from langgraph._internal._typing import MISSING
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph.message import _messages_delta_reducer

__all__ = [
    "ActionRequest",
    "AgentState",
    "Decision",
    "EditedAction",
    "EffectTask",
    "ReconciliationRequest",
    "ReviewConfig",
    "ReviewRequest",
    "ReviewResponse",
    "SizedDeltaChannel",
    "effect_node_name",
]


def approx_bytes(value: Any) -> int:
    """A cheap estimate of how many bytes ``value`` takes once serialized.

    Strings and bytes count their length, containers the sum of their items,
    a message its content, tool calls and extra fields plus a fixed 64 for
    the envelope; anything else counts 8. It never serializes, so it costs
    O(number of parts), not O(bytes): a 200 KB tool result is one ``len``.
    It runs over the whole message list each time a thread's state is
    loaded, so the plain types are recognised by their exact type first
    (the same answers as the ``isinstance`` checks below, which handle their
    subclasses).

    Args:
        value: a message, a list of messages, or any JSON-like value.

    Returns:
        The estimate, in bytes (at least 0).
    """
    kind = type(value)
    if kind is str or kind is bytes:
        return len(value)
    if kind is list or kind is tuple:
        return sum([approx_bytes(v) for v in value])
    if kind is dict:
        return sum([len(str(k)) + approx_bytes(v) for k, v in value.items()])
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, BaseMessage):
        size = 64 + approx_bytes(value.content) + approx_bytes(value.additional_kwargs)
        calls = _tool_calls(value)
        return size + (approx_bytes(calls) if calls else 0)
    if isinstance(value, dict):
        return sum(len(str(k)) + approx_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(approx_bytes(v) for v in value)
    return 8


_HAS_TOOL_CALLS: dict[type[Any], bool] = {}
"""Message classes by whether ``tool_calls`` is a field or class attribute of theirs."""


def _tool_calls(message: BaseMessage) -> Any:
    """``getattr(message, "tool_calls", None)``, without pydantic's costly miss.

    On a message class without the attribute (a human or tool message)
    ``getattr`` goes through pydantic's ``__getattr__``, which finds it only
    among the extra fields and otherwise builds an ``AttributeError``: about
    4 us, most of the estimate's time per message. Same answer, looked up
    where that ``__getattr__`` would look (private attributes always start
    with ``_``).
    """
    kind = type(message)
    declared = _HAS_TOOL_CALLS.get(kind)
    if declared is None:
        declared = "tool_calls" in kind.model_fields or hasattr(kind, "tool_calls")
        _HAS_TOOL_CALLS[kind] = declared
    if declared:
        return getattr(message, "tool_calls", None)
    extra = message.__pydantic_extra__
    return extra.get("tool_calls") if extra else None


class SizedDeltaChannel(DeltaChannel[Any]):
    """A ``DeltaChannel`` that snapshots when the bytes since the last snapshot reach a share of it.

    LangGraph's ``DeltaChannel`` snapshots the whole value every
    ``snapshot_frequency`` updates (100). With large messages that is
    quadratic again: a thread whose tool returns 200 KB stores its whole,
    growing history every 100 updates (measured: 5.39x more bytes per call in
    the last quarter of a 500-call thread than in the first). Snapshotting
    when the bytes since the last snapshot reach ``GROWTH`` times its size
    makes the snapshots a geometric series: all of them together hold at
    most ``(1 + GROWTH) / GROWTH`` times the final history (3x at 0.5), so a
    thread's storage stays linear in what it wrote; and a read replays at
    most ``GROWTH`` times the snapshot it starts from, so it costs O(history)
    like reading a full blob. The idea is the capacity doubling of dynamic
    arrays, and the size-ratio trigger of log-structured compaction.
    ``MIN_BYTES`` keeps a young thread from snapshotting at every step.

    The decision is the only change: what is stored (``_DeltaSnapshot`` blobs,
    per-superstep writes, the ``counters_since_delta_snapshot`` metadata) is
    LangGraph's format, so threads written with the plain channel read back,
    and this one reads theirs. It works through the hook LangGraph gives: the
    loop snapshots a channel when its update counter reaches
    ``snapshot_frequency``, so that attribute reads 1 once the bytes say
    "snapshot" and ``max_updates`` (the constructor's ``snapshot_frequency``)
    otherwise. The channel knows its bytes since the snapshot it was loaded
    from (the seed LangGraph hands ``from_checkpoint``, then
    ``replay_writes``) and counts each ``update``. The loop reads
    ``snapshot_frequency`` when it writes a checkpoint, then stores a plain
    checkpoint through ``checkpoint()`` or a snapshot of ``get()``; so a read
    while asking that no ``checkpoint()`` followed means a snapshot was
    stored, and the next write starts a new count from the current size.
    The count is advice: a wrong one only moves the next snapshot, and every
    read still starts from a snapshot that is really stored.

    Args:
        reducer: as ``DeltaChannel``.
        typ: as ``DeltaChannel``.
        snapshot_frequency: the most updates between two snapshots whatever
            their bytes (default 100,000; LangGraph also snapshots after
            ``LANGGRAPH_DELTA_MAX_SUPERSTEPS_SINCE_SNAPSHOT`` supersteps, 5000).
    """

    __slots__ = (
        "_asked",
        "_base",
        "_declined",
        "_polled",
        "_seed",
        "_since",
        "_unmeasured",
        "max_updates",
    )

    GROWTH = 0.5
    """Snapshot when the bytes since the last snapshot reach this fraction of its size."""
    MIN_BYTES = 16 * 1024
    """...and at least this many bytes (so a young thread is not snapshotted every step)."""

    def __init__(
        self,
        reducer: Callable[[Any, Sequence[Any]], Any],
        typ: type[Any] | None = None,
        *,
        snapshot_frequency: int = 100_000,
    ) -> None:
        self._restore(snapshot_frequency, None, 0)
        super().__init__(reducer, typ, snapshot_frequency=snapshot_frequency)

    @property  # type: ignore[override]
    def snapshot_frequency(self) -> int:
        """1 while the bytes ask for a snapshot, else ``max_updates``.

        LangGraph's loop reads it when it writes a checkpoint; a read while
        asking is noted (``_polled``), so the next write can tell a snapshot
        was taken (the checkpoint did not call ``checkpoint()``).
        """
        self._settle()
        if self._asked:
            self._polled = True
            return 1
        return self.max_updates

    @snapshot_frequency.setter
    def snapshot_frequency(self, value: int) -> None:
        self.max_updates = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SizedDeltaChannel)
            and self.max_updates == other.max_updates
            and DeltaChannel(self.reducer) == DeltaChannel(other.reducer)
        )

    __hash__ = None  # type: ignore[assignment]

    def _new(self) -> SizedDeltaChannel:
        new = self.__class__(self.reducer, self.typ, snapshot_frequency=self.max_updates)
        new.key = self.key
        return new

    def _restore(self, cap: int, seed: Any, since: int) -> None:
        self.max_updates = cap
        self._count_from(seed)
        self._since = since
        self._unmeasured: list[Any] = []
        self._asked = self._polled = self._declined = False
        self._decide()

    def _count_from(self, value: Any) -> None:
        """Take ``value`` (the value just stored in full) as the snapshot to count from.

        Its size is estimated only when a decision needs it (``_decide``):
        the whole history's estimate costs O(messages), and most loads of a
        thread never write enough to ask. The list is copied (references
        only), so what the channel later does to its own value cannot change
        the snapshot's size.
        """
        self._seed = list(value) if isinstance(value, list) else None
        self._base: int | None = None if self._seed is not None else 0

    def _snapshot_bytes(self) -> int:
        if self._base is None:
            self._base = approx_bytes(self._seed)
            self._seed = None
        return self._base

    def copy(self) -> SizedDeltaChannel:
        """A copy with the same value and the same byte counts."""
        new = self._new()
        new.value = self.value if self.value is MISSING else copy.copy(self.value)
        new._base, new._seed, new._since = self._base, self._seed, self._since
        new._unmeasured = list(self._unmeasured)
        new._asked, new._polled, new._declined = self._asked, self._polled, self._declined
        return new

    def from_checkpoint(self, checkpoint: Any) -> SizedDeltaChannel:
        """``DeltaChannel.from_checkpoint``; the seed's size is the snapshot size."""
        new = self._new()
        if checkpoint is MISSING or checkpoint is None:
            new.value = new.typ()
        elif isinstance(checkpoint, _DeltaSnapshot):
            new.value = checkpoint.value
        else:
            new.value = checkpoint
        new._restore(self.max_updates, new.value, 0)
        return new

    def replay_writes(self, writes: Sequence[Any]) -> None:
        """``DeltaChannel.replay_writes``; the replayed bytes count as written since the seed."""
        super().replay_writes(writes)
        # Measured when a decision is next needed (``_settle``): a load that
        # only reads the state (``get_state``, a status, a run that stops
        # before its first checkpoint) never sizes what it replayed.
        self._unmeasured.extend(w[2] for w in writes)

    def update(self, values: Sequence[Any]) -> bool:
        """``DeltaChannel.update``, counting the bytes written."""
        if not values:
            return super().update(values)
        self._settle()
        if self._polled:
            if not self._declined:
                # The loop read "snapshot now" and did not take the plain
                # path: it stored the value as it is. Count from here.
                self._count_from(self.value)
                self._since = 0
                self._asked = False
            self._polled = self._declined = False
        changed = super().update(values)
        if changed:
            self._since += approx_bytes(list(values))
            self._decide()
        return changed

    def checkpoint(self) -> Any:
        """``DeltaChannel.checkpoint`` (a plain, non-snapshot checkpoint): noted."""
        if self._polled:
            self._declined = True
        return super().checkpoint()

    def _settle(self) -> None:
        """Count the replayed writes not yet measured, then decide again."""
        if self._unmeasured:
            pending, self._unmeasured = self._unmeasured, []
            self._since += sum(approx_bytes(v) for v in pending)
            self._decide()

    def _decide(self) -> None:
        # since >= max(MIN_BYTES, GROWTH * snapshot), the snapshot's size read only if needed
        if self._since >= self.MIN_BYTES and self._since >= self.GROWTH * self._snapshot_bytes():
            self._asked = True


class AgentState(TypedDict):
    """The thread's state: only the message history the model sees.

    ``messages`` is a LangGraph ``DeltaChannel`` (beta in langgraph 1.2): a
    checkpoint stores only the messages its superstep added, plus a full
    snapshot now and then, and a read replays the writes since the last
    snapshot. With the default ``add_messages`` channel every checkpoint holds
    the whole history, so a thread's storage grows quadratically (69 -> 406
    KiB per call across a 200-call thread; with the delta channel 12 -> 14
    KiB). When to snapshot is decided by bytes (``SizedDeltaChannel``), so a
    thread with large messages grows linearly too. Threads written with the
    plain channel still read back: the channel takes an old full-list blob as
    its starting value. Because the on-disk form is beta, langgraph and its
    checkpoint packages are pinned to a minor version, and
    ``tests/integration/test_state_format.py`` reads a thread written by an
    earlier effectgate back.

    The reducer (``_messages_delta_reducer``, re-exported by
    ``langgraph.graph.message`` for this use) replaces a message by id and
    appends new ones, as ``add_messages`` does; LangGraph gives every written
    message an id first (``ensure_message_ids``). effectgate never removes
    messages.
    """

    messages: Annotated[list[AnyMessage], SizedDeltaChannel(_messages_delta_reducer)]


class ActionRequest(TypedDict):
    """One side-effecting call awaiting a decision."""

    name: str
    """Tool name."""
    args: dict[str, Any]
    """Normalized arguments (the tool schema's output), as they would run."""
    description: str
    tool_call_id: str
    operation_id: str
    """The idempotency key this call maps to."""
    intent_hash: str
    effect_kind: str
    preview: str
    """Reviewer-facing preview: a unified diff for files, headers for mail."""
    approval_ttl_s: float | None
    """Seconds an approval stays valid for a first attempt; ``None``: no expiry."""
    possible_duplicate_of: str | None
    """An earlier operation of this thread with the same tool and intent that already succeeded."""
    conflict: dict[str, Any] | None
    """Set when the operation id is already bound to other arguments (a fork that edited args)."""
    repeat_of_rejected: NotRequired[dict[str, Any]]
    """A call of this thread a reviewer rejected, with the same intent.

    ``{operation_id, reason, times_rejected}``.
    """
    replaced_by_edit: NotRequired[str]
    """The operation whose reviewer edited these very arguments away (the call ran edited)."""
    compacted_operation: NotRequired[dict[str, Any]]
    """This call's operation id was used before and compacted by retention.

    ``OperationTombstone.summary()``: ``{operation_id, thread_id, tool, state,
    intent_hash, finished_at, compacted_at, reference, message}``. The call
    is a new proposal (a replay or a new run reached it); never approved by
    policy alone.
    """
    possible_duplicate_compacted: NotRequired[dict[str, Any]]
    """``possible_duplicate_of`` names a compacted operation: its tombstone's summary."""
    unreadable_same_intent: NotRequired[list[dict[str, Any]]]
    """Ledger rows under this call's id or of its intent that fail validation.

    ``[{operation_id, thread_id, reason}]``: a damaged ledger hides whether
    this call already ran, so it is never approved by policy alone.
    """


class ReviewConfig(TypedDict):
    """What a reviewer may decide for one action (HITL ``review_configs``)."""

    action_name: str
    allowed_decisions: list[Literal["approve", "edit", "reject"]]
    """``respond`` is accepted wherever ``reject`` is (a reject with the person's text)."""


class ReviewRequest(TypedDict):
    """The ``interrupt()`` value of the review node: every pending call of one AI message."""

    type: Literal["review"]
    thread_id: str
    action_requests: list[ActionRequest]
    review_configs: list[ReviewConfig]
    error: NotRequired[str]
    """Why the previous answer was refused, when the node asks again."""


class EditedAction(TypedDict):
    """The replacement call of an ``edit`` decision."""

    name: str
    args: dict[str, Any]


class Decision(TypedDict, total=False):
    """One reviewer decision, in ``action_requests`` order."""

    type: Literal["approve", "edit", "reject", "respond"]
    edited_action: EditedAction
    """For ``edit``: the new arguments (validated by the tool schema, new intent hash)."""
    message: str
    """For ``reject``: told to the model. For ``respond``: the answer the model gets
    in the tool's place (nothing runs; recorded as a reject)."""
    tool_call_id: str
    """Optional: names the call this decision answers; checked when given."""
    operation_id: str
    """The operation shown for this call; binds the decision (checked when given)."""
    intent_hash: str
    """The intent hash shown for this call; binds the decision (checked when given)."""


class ReviewResponse(TypedDict, total=False):
    """The resume value for a review interrupt."""

    decisions: list[Decision]
    reviewer: str


class ReconciliationRequest(TypedDict):
    """The ``interrupt()`` value of an effect node whose outcome cannot be known."""

    type: Literal["reconciliation"]
    thread_id: str
    tool_call_id: str
    operation_id: str
    tool: str
    attempt: int
    evidence: dict[str, Any]
    allowed_verdicts: list[Literal["succeeded", "failed", "retry"]]
    error: NotRequired[str]


class EffectTask(TypedDict):
    """The ``Send`` payload of one effect node: one reviewed call."""

    thread_id: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    """The arguments to execute (edited ones, if a reviewer edited)."""
    operation_id: str
    intent_hash: str
    edited: bool
    batch_size: int
    """How many effect nodes run in this superstep (for the MID_SUPERSTEP seam)."""


def effect_node_name(tool: str) -> str:
    """Return the graph node name of a tool's effect node: ``effect.<tool>``.

    A colon would read ``effect:<tool>``; LangGraph reserves ``:`` for namespaces
    in node names, so the separator is a dot.
    """
    return f"effect.{tool}"


class RunStatus(enum.StrEnum):
    """Where a thread stands after a run call."""

    DONE = "done"
    WAITING_REVIEW = "waiting_review"
    WAITING_RECONCILIATION = "waiting_reconciliation"
    INCOMPLETE = "incomplete"
    """Tasks remain (a model error, a drain on SIGTERM): ``resume`` continues."""
    NOT_STARTED = "not_started"
