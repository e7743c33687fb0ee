"""Operation states, the transition table and the ledger's frozen records.

Pure: no I/O. This module is the only definition of the state machine
(docs/architecture.md draws it); the store persists ``OpState`` values verbatim.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from effectgate.errors import IllegalTransitionError

__all__ = [
    "MAX_RECOVERIES",
    "TERMINAL",
    "TRANSITIONS",
    "UNFINISHED",
    "Approval",
    "Budget",
    "Event",
    "EventKind",
    "Lease",
    "LedgerMetrics",
    "OpState",
    "OpenRequest",
    "Operation",
    "Receipt",
    "ThreadEvent",
    "ThreadRecord",
    "check_transition",
]


class OpState(enum.StrEnum):
    """The state of one operation (one business action) in the ledger."""

    PROPOSED = "PROPOSED"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    IN_FLIGHT = "IN_FLIGHT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    RETRY_WAIT = "RETRY_WAIT"
    UNKNOWN = "UNKNOWN"
    NEEDS_RECONCILIATION = "NEEDS_RECONCILIATION"


TERMINAL: frozenset[OpState] = frozenset({OpState.SUCCEEDED, OpState.FAILED, OpState.REJECTED})
"""States an operation never leaves."""

UNFINISHED: frozenset[OpState] = frozenset(OpState) - TERMINAL
"""States an operation may still leave; the store keeps a partial index on them."""

_S = OpState
TRANSITIONS: Mapping[OpState, frozenset[OpState]] = {
    # review decides; an approval may be withdrawn (expired, re-review) before dispatch
    _S.PROPOSED: frozenset({_S.APPROVED, _S.REJECTED}),
    _S.APPROVED: frozenset({_S.IN_FLIGHT, _S.PROPOSED, _S.REJECTED, _S.FAILED}),
    # IN_FLIGHT is committed before the side effect starts; one of four outcomes follows
    _S.IN_FLIGHT: frozenset({_S.SUCCEEDED, _S.FAILED, _S.RETRY_WAIT, _S.UNKNOWN}),
    # RETRY_WAIT is "known not applied": a new attempt, or FAILED when the budget is spent
    _S.RETRY_WAIT: frozenset({_S.IN_FLIGHT, _S.FAILED, _S.NEEDS_RECONCILIATION}),
    # UNKNOWN settles by reconciliation, same-key replay, or a human
    _S.UNKNOWN: frozenset({_S.SUCCEEDED, _S.RETRY_WAIT, _S.NEEDS_RECONCILIATION, _S.FAILED}),
    _S.NEEDS_RECONCILIATION: frozenset({_S.SUCCEEDED, _S.FAILED, _S.RETRY_WAIT}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.REJECTED: frozenset(),
}
"""Allowed ``src -> dst`` pairs; docs/architecture.md explains each.

Four pairs are forced by other rules of the protocol:
``APPROVED -> PROPOSED`` (an expired approval goes back to review),
``APPROVED -> FAILED`` (deadline passed before any attempt: known not applied),
``UNKNOWN -> FAILED`` (a reconciler answered "not found" and that is final, but
no budget is left: known not applied), ``RETRY_WAIT -> NEEDS_RECONCILIATION``
(a retry of a write that may already have applied could not start before the
deadline: FAILED would claim "known not applied").
"""


def check_transition(operation_id: str, src: OpState, dst: OpState) -> None:
    """Refuse a state change the transition table does not allow.

    Args:
        operation_id: the operation, named in the error.
        src: the state the operation is in.
        dst: the state asked for.

    Raises:
        IllegalTransitionError: ``dst`` is not in ``TRANSITIONS[src]``.
    """
    if dst not in TRANSITIONS[src]:
        raise IllegalTransitionError(operation_id=operation_id, src=src.value, dst=dst.value)


MAX_RECOVERIES = 10
"""Attempts per operation given back when their worker died mid-call (``Operation.recoveries``)."""


# Spelled out on each class (not ``**kwargs``) so type checkers see ``kw_only``.
@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Limits stored with an operation when it is created and never changed after.

    A restart or a later ``open`` with other limits does not alter them
    (they are part of the operation).
    """

    max_attempts: int = 3
    """Real dispatch attempts allowed, counting the first; at least 1."""
    deadline_at: datetime | None = None
    """Aware UTC time after which no new attempt starts; ``None`` means no deadline."""
    backoff_base_s: float = 0.5
    """Full-jitter backoff base in seconds.

    After attempt n the wait is ``uniform(0, min(cap, base * 2**(n-1)))``.
    """
    backoff_cap_s: float = 30.0
    """Upper bound of one backoff wait, in seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Receipt:
    """Proof that an operation took effect, with the identity it belongs to.

    A receipt is returned to a caller only after ``operation_id`` and
    ``intent_hash`` are checked against the operation it is stored on.
    """

    operation_id: str
    intent_hash: str
    attempt: int
    """The attempt that produced it; 0 when a human or a reconciler supplied it."""
    result: Any
    """The tool's JSON-compatible result."""
    reference: str | None = None
    """An external reference (ticket id, Message-ID, file digest) when the tool gives one."""
    source: Literal["dispatch", "reconcile", "human"] = "dispatch"
    """How the fact became known."""
    recorded_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One business action and everything the ledger knows about it."""

    operation_id: str
    """The idempotency key: ``{thread_id}:{tool_call_id}`` or a tool's business key."""
    thread_id: str
    tool_call_id: str
    tool: str
    tool_version: str
    args: Mapping[str, Any]
    """Normalized arguments (the tool schema's output), JSON-compatible."""
    intent_hash: str
    state: OpState
    attempt: int = 0
    """Attempts started so far; also the fencing token of the current claim."""
    budget: Budget = field(default_factory=Budget)
    next_attempt_at: datetime | None = None
    """Aware UTC time before which no new attempt starts; ``None``: no wait."""
    claimed_by: str | None = None
    """Worker id holding the current attempt while ``IN_FLIGHT``."""
    receipt: Receipt | None = None
    error: str | None = None
    """Last error text (for people; code branches on ``state``)."""
    created_at: datetime
    updated_at: datetime
    recoveries: int = 0
    """Attempts cut short by their worker's death, not charged to ``budget.max_attempts``.

    At most ``MAX_RECOVERIES``; see ``attempts_allowed``.
    """
    intent_checked: bool = field(default=False, init=False, compare=False, repr=False)
    """Set by the decoder when the stored arguments' text hashes to ``intent_hash``.

    The ledger's load check (``verified``) then skips hashing the decoded
    arguments again. Never passed in, and not carried by ``dataclasses.replace``
    (a copy with other arguments starts unchecked).
    """

    @property
    def is_terminal(self) -> bool:
        """Whether the operation is in a state it never leaves."""
        return self.state in TERMINAL

    @property
    def attempts_allowed(self) -> int:
        """Attempts this operation may start in all: ``budget.max_attempts + recoveries``.

        The budget is the tool's retry policy: errors, refusals, ``Retry-After``.
        A process killed mid-call (``kill -9``, OOM, a power cut of the
        worker) says nothing about the tool, so each attempt whose worker is
        proven gone while it was in flight is given back, up to
        ``MAX_RECOVERIES`` times; past that, a call that keeps killing its
        process is charged like any other attempt and stops. (DBOS keeps
        the same split: a step's retries, and a workflow's
        ``max_recovery_attempts`` for crashes.)
        """
        return self.budget.max_attempts + self.recoveries


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenRequest:
    """The arguments of ``Ledger.open``, as a value (one per call in ``record_review``)."""

    operation_id: str
    thread_id: str
    tool_call_id: str
    tool: str
    tool_version: str
    args: Mapping[str, Any]
    """Normalized arguments, JSON-compatible."""
    intent_hash: str
    """Must equal ``intent_hash(tool, tool_version, args)``."""
    budget: Budget | None = None
    """Limits for a new operation; ``None`` means ``Budget()``. Ignored if the operation exists."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """One review decision, bound to exactly one intent hash until it expires."""

    operation_id: str
    thread_id: str
    tool_call_id: str
    decision: Literal["approve", "edit", "reject"]
    intent_hash: str
    """The intent hash the decision authorises (of the edited args for ``edit``)."""
    reviewer: str
    edited_args: Mapping[str, Any] | None = None
    message: str | None = None
    decided_at: datetime
    expires_at: datetime | None = None
    """Aware UTC time after which the approval no longer authorises a first attempt."""


class EventKind(enum.StrEnum):
    """What an event records."""

    CREATED = "created"
    """The operation row was created (``src`` is ``None``, ``dst`` is PROPOSED)."""
    TRANSITION = "transition"
    """The state changed from ``src`` to ``dst``."""
    APPROVAL = "approval"
    """A review decision was recorded that changed no state."""
    RESULT_REUSED = "result_reused"
    """A stored receipt was handed out instead of calling the tool."""
    NOTE = "note"
    """Any other fact worth keeping (``src`` and ``dst`` are ``None``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One append-only audit record of a state transition or a notable fact."""

    seq: int
    """Monotonic position in the event log (assigned by the store)."""
    operation_id: str
    src: OpState | None
    """State before, ``None`` for creation and for facts that change no state."""
    dst: OpState | None
    attempt: int
    at: datetime
    detail: Mapping[str, Any]
    kind: EventKind = EventKind.TRANSITION


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A per-thread lease: at most one live runner per thread."""

    thread_id: str
    owner: str
    token: int
    """Fencing token: increases each time the lease changes hands."""
    expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadEvent:
    """One append-only audit record about a thread rather than one operation.

    Written for acts of a person on the thread itself, e.g. ``lease_broken``
    (``effectgate lease break``): who did it, when and why.
    """

    seq: int
    """Monotonic position among thread events (assigned by the store; ignored on append)."""
    thread_id: str
    kind: str
    """What happened, e.g. ``"lease_broken"``."""
    actor: str
    """Who did it (a person's name, as given)."""
    at: datetime
    detail: Mapping[str, Any]
    """JSON-compatible facts: the reason, what was there before."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadRecord:
    """The input a thread was started with, kept so a run that never checkpointed can restart."""

    thread_id: str
    input: Mapping[str, Any]
    created_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetrics:
    """Health figures computed from the ledger alone."""

    by_state: Mapping[str, int]
    operations: int
    first_attempt_success_rate: float | None
    """SUCCEEDED with attempt 1 over all SUCCEEDED; ``None`` when none succeeded."""
    mean_attempts: float | None
    """Mean attempts over operations that started at least one attempt."""
    results_reused: int
    """Times a stored receipt was returned instead of calling the tool."""
    open_unknowns: int
    """Operations in UNKNOWN or NEEDS_RECONCILIATION."""
    oldest_reconciliation_age_s: float | None
    """Age in seconds of the oldest NEEDS_RECONCILIATION operation; ``None`` if none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadTombstone:
    """A deleted thread: when, by whom and why (its checkpoints are gone)."""

    thread_id: str
    deleted_at: datetime
    deleted_by: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DamagedOperation:
    """An operation row that fails validation, as a tolerant listing reports it.

    Attributes:
        operation_id: the row's id (read as stored).
        thread_id: the thread the row names (read as stored).
        reason: why it cannot be read (the ``LedgerCorruptError`` message).
    """

    operation_id: str
    thread_id: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DamagedThread:
    """A thread whose stored record or checkpoint fails to decode, as a tolerant listing reports it.

    Attributes:
        thread_id: the thread (read as stored).
        table: where the damage is (``threads`` / ``ledger_threads`` for the
            ledger's thread record, ``checkpoints`` for LangGraph's checkpoint tables).
        reason: what is wrong (the decoding error's message).
    """

    thread_id: str
    table: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationTombstone:
    """What is left of a terminal operation compacted by retention.

    Enough to answer, for the deduplication window, "this operation id was
    used, for this intent, with this outcome and receipt"; the arguments,
    approvals and events are gone.
    """

    operation_id: str
    thread_id: str
    tool: str
    intent_hash: str
    state: OpState
    receipt: Receipt | None
    finished_at: datetime
    """The operation's last ``updated_at``."""
    compacted_at: datetime

    def binds_other_intent(self, intent_hash: str) -> bool:
        """Whether this compacted id still refuses arguments with ``intent_hash``.

        The id was sent to the service as its idempotency key unless a
        reviewer rejected the call (a REJECTED operation never ran), so a
        different intent under it would be a key reused with other
        arguments: the service refuses or replays the old result (Stripe's
        idempotency keys answer that with an error). Such a call is refused
        exactly as if the operation were still in the ledger. The same
        intent is not refused: it is a reopened proposal, reviewed again.

        Args:
            intent_hash: the intent hash of the arguments now proposed.

        Returns:
            ``True`` when the tombstone binds the id to another intent.
        """
        return self.state is not OpState.REJECTED and self.intent_hash != intent_hash

    def summary(self) -> dict[str, Any]:
        """The tombstone as a JSON-compatible dict, for a reviewer and the audit trail.

        Keys: ``operation_id``, ``thread_id``, ``tool``, ``state`` (the
        outcome), ``intent_hash``, ``finished_at`` and ``compacted_at`` (ISO
        8601), ``reference`` (the receipt's external reference, or ``None``)
        and ``message`` (one line saying all of it).
        """
        reference = None if self.receipt is None else self.receipt.reference
        compacted = self.compacted_at.isoformat(timespec="seconds")
        receipt = f"receipt {reference}" if reference else "no receipt reference"
        return {
            "operation_id": self.operation_id,
            "thread_id": self.thread_id,
            "tool": self.tool,
            "state": self.state.value,
            "intent_hash": self.intent_hash,
            "finished_at": self.finished_at.isoformat(),
            "compacted_at": self.compacted_at.isoformat(),
            "reference": reference,
            "message": (
                f"operation {self.operation_id} was compacted on {compacted}; it had intent "
                f"hash {self.intent_hash} and {receipt} ({self.state.value})"
            ),
        }
