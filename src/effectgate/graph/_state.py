"""Graph state and the interrupt payloads, as TypedDicts (they live in checkpoints).

The review request/decision shapes follow LangChain's
``HumanInTheLoopMiddleware`` (``action_requests``, ``review_configs``, resume
``{"decisions": [...]}`` with ``approve | edit | reject``), extended with what
a reviewer of a durable side effect needs (DESIGN §5).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
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
    "effect_node_name",
]


class AgentState(TypedDict):
    """The thread's state: only the message history the model sees.

    ``messages`` is a LangGraph ``DeltaChannel`` (beta in langgraph 1.2): a
    checkpoint stores only the messages its superstep added, plus a full
    snapshot every 100 updates, and a read replays the writes since the last
    snapshot. With the default ``add_messages`` channel every checkpoint holds
    the whole history, so a thread's storage grows quadratically (issue 8:
    69 -> 406 KiB per call across a 200-call thread; with the delta channel
    12 -> 14 KiB). Threads written with the plain channel still read back: the
    channel takes an old full-list blob as its starting value. Because the
    on-disk form is beta, langgraph and its checkpoint packages are pinned to
    a minor version, and ``tests/integration/test_state_format.py`` reads a
    thread written by an earlier effectgate back.

    The reducer (``_messages_delta_reducer``, re-exported by
    ``langgraph.graph.message`` for this use) replaces a message by id and
    appends new ones, as ``add_messages`` does; LangGraph gives every written
    message an id first (``ensure_message_ids``). effectgate never removes
    messages.
    """

    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]


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

    DESIGN §5 writes ``effect:<tool>``; LangGraph reserves ``:`` for namespaces
    in node names, so the separator is a dot.
    """
    return f"effect.{tool}"
