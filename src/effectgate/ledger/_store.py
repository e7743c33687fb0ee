"""The storage seam: a few atomic primitives a ledger backend must provide.

The ``Ledger`` facade owns the protocol (intent checks, budgets, transitions,
events); a store only persists and compares (powertools' persistence
layer). Every write happens inside ``LedgerStore.transaction()``, so one facade
call is one commit whatever the backend. SQLite implements this today
(``SqliteLedgerStore``); PostgreSQL can be added behind the same Protocol and
run through ``effectgate.testing.ledger_conformance``.

Records crossing the seam are the frozen dataclasses of ``_model``; times are
aware UTC ``datetime`` values, which a store may truncate to milliseconds (so
the facade always returns what the store read back, never its own draft).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from effectgate.ledger._model import (
    Approval,
    Event,
    EventKind,
    Lease,
    Operation,
    OperationTombstone,
    OpState,
    Receipt,
    ThreadEvent,
    ThreadRecord,
    ThreadTombstone,
)

__all__ = [
    "Change",
    "Expect",
    "LedgerStore",
    "NewEvent",
    "StateCount",
    "StoreReader",
    "StoreTransaction",
    "WriteOnce",
]

_DC: dict[str, Any] = {"frozen": True, "slots": True, "kw_only": True}


class WriteOnce(enum.StrEnum):
    """Outcome of inserting a write-once row (insert, then read back and compare)."""

    INSERTED = "inserted"
    """The row is new."""
    EXISTS = "exists"
    """An identical row was already there; nothing was written."""
    CONFLICT = "conflict"
    """A different row holds the same key; nothing was written."""


@dataclass(**_DC)
class Expect:
    """The compare half of a compare-and-set on one operation row.

    Every field that is not ``None`` must match the stored row, or nothing is written.
    """

    states: frozenset[OpState]
    """The stored state must be one of these."""
    attempt: int | None = None
    """The stored attempt must equal this (the fencing token)."""
    intent_hash: str | None = None
    """The stored intent hash must equal this (a receipt's identity check)."""
    attempts_allowed_at_least: int | None = None
    """The stored ``max_attempts + recoveries`` must be at least this.

    That sum is ``Operation.attempts_allowed``.
    """


@dataclass(**_DC)
class Change:
    """The set half of a compare-and-set on one operation row.

    ``attempt``, ``receipt``, ``error`` and ``recoveries`` keep the stored value when ``None``;
    ``claimed_by`` and ``next_attempt_at`` are always written (``None`` clears).
    """

    state: OpState
    updated_at: datetime
    attempt: int | None = None
    receipt: Receipt | None = None
    error: str | None = None
    claimed_by: str | None = None
    next_attempt_at: datetime | None = None
    recoveries: int | None = None
    """The new ``Operation.recoveries`` (it only grows, by one, as an attempt is given back)."""


@dataclass(**_DC)
class NewEvent:
    """An event to append; the store assigns ``seq``."""

    operation_id: str
    kind: EventKind
    src: OpState | None
    dst: OpState | None
    attempt: int
    at: datetime
    detail: dict[str, Any]


@dataclass(**_DC)
class StateCount:
    """How many operations are in ``state`` with exactly ``attempt`` attempts used."""

    state: OpState
    attempt: int
    count: int


class StoreReader(Protocol):
    """Reads, inside one snapshot. Loaded rows are decoded and validated.

    Raises (every method):
        LedgerCorruptError: a row fails decoding (unknown state, broken JSON,
            bad time, negative attempt).
        LedgerBusyError: the store stayed locked past its busy timeout.
    """

    def get_operation(self, operation_id: str) -> Operation | None:
        """Return one operation, or ``None`` if there is no such row."""
        ...

    def list_operations(
        self,
        *,
        thread_id: str | None = None,
        states: Iterable[OpState] | None = None,
        tool: str | None = None,
        intent_hash: str | None = None,
    ) -> list[Operation]:
        """Return operations matching every given filter, by ``created_at``, ``operation_id``."""
        ...

    def approvals(self, operation_id: str) -> list[Approval]:
        """Return an operation's approval rows in the order they were appended."""
        ...

    def events(
        self, *, operation_id: str | None = None, thread_id: str | None = None
    ) -> list[Event]:
        """Return events matching the filters, in ``seq`` order."""
        ...

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        """Return a thread's record, or ``None``."""
        ...

    def list_threads(self) -> list[ThreadRecord]:
        """Return every thread record, oldest first."""
        ...

    def thread_ids(self) -> list[str]:
        """Every recorded thread's id, in ``list_threads`` order, read without decoding the rows.

        A tolerant listing reads the records one by one from these, so one
        damaged record is named instead of failing the whole listing.
        """
        ...

    def get_lease(self, thread_id: str) -> Lease | None:
        """Return a thread's lease row (possibly expired), or ``None``.

        An expiry beyond what ``datetime`` can hold reads as ``datetime.max``
        (UTC), one before it as ``datetime.min``: a lease stored as "never
        expires" is held, not an error. ``put_lease`` must treat such a read
        back value as equal to what is stored.
        """
        ...

    def thread_events(self, thread_id: str | None = None) -> list[ThreadEvent]:
        """Return thread events (of one thread, or all) in ``seq`` order."""
        ...

    def count_operations(self) -> list[StateCount]:
        """Return operation counts grouped by state and attempt."""
        ...

    def count_events(self, kind: EventKind) -> int:
        """Return how many events of ``kind`` exist."""
        ...

    def oldest_updated_at(self, state: OpState) -> datetime | None:
        """Return the earliest ``updated_at`` among operations in ``state``, or ``None``."""
        ...

    def get_thread_tombstone(self, thread_id: str) -> ThreadTombstone | None:
        """Return the tombstone of a deleted thread, or ``None``."""
        ...

    def list_thread_tombstones(self) -> list[ThreadTombstone]:
        """Return every thread tombstone, by ``deleted_at``."""
        ...

    def get_operation_tombstone(self, operation_id: str) -> OperationTombstone | None:
        """Return what is left of a compacted operation, or ``None``."""
        ...

    def list_operation_tombstones(self, *, intent_hash: str) -> list[OperationTombstone]:
        """Return the tombstones of compacted operations of one intent, oldest finish first."""
        ...

    def operation_refs(
        self,
        *,
        thread_id: str | None = None,
        operation_id: str | None = None,
        intent_hash: str | None = None,
    ) -> list[tuple[str, str]]:
        """``(operation_id, thread_id)`` of the matching rows, read without decoding them.

        Matches ``thread_id`` (if given) and, if ``operation_id`` or
        ``intent_hash`` is given, rows under that id or of that intent; in
        ``list_operations`` order. For a listing that must go on past a row
        that fails validation (``Ledger.list(damaged=...)``): each row is then
        read on its own.
        """
        ...

    def intent_neighbours(
        self, operation_id: str, intent_hash: str
    ) -> tuple[list[Operation], list[OperationTombstone]]:
        """Operations and compacted ones' tombstones under ``operation_id`` or of ``intent_hash``.

        What a review asks of the ledger about one call, in one reading: the
        operation and the tombstone its id may already have, and every other
        operation and tombstone of the same intent. Operations in
        ``list_operations`` order (``created_at``, then id), tombstones in
        ``list_operation_tombstones`` order. The two lists may be read from
        two snapshots (each statement its own, as two one-call reads would
        be): a store may send both at once (``PostgresLedgerStore``: one
        round trip instead of four).
        """
        ...


class StoreTransaction(StoreReader, Protocol):
    """Reads and writes inside one atomic, isolated transaction.

    Writers are serialised (SQLite ``BEGIN IMMEDIATE``; a row lock elsewhere).
    Nothing is visible to others until the transaction commits.
    """

    def create_or_get(self, op: Operation) -> tuple[Operation, bool]:
        """Insert ``op`` unless its ``operation_id`` exists; never overwrite.

        Returns:
            The stored row as read back, and whether it was inserted now.
        """
        ...

    def compare_and_set(
        self, operation_id: str, expect: Expect, change: Change
    ) -> tuple[OpState, Operation] | None:
        """Apply ``change`` only if the row matches ``expect``.

        Returns:
            ``(state before, row after)``, or ``None`` when nothing matched
            (no such row, or a compared field differs); then nothing was written.
        """
        ...

    def append_event(self, event: NewEvent) -> None:
        """Append ``event``; the store gives it a ``seq`` greater than every earlier one.

        Nothing is returned, so a store may send the insert later in the same
        transaction, with its next statement or its commit
        (``PostgresLedgerStore`` does, saving a round trip per event); an
        error the insert raises then surfaces there, and the transaction is
        rolled back as for any error.
        """
        ...

    def put_approval(self, approval: Approval) -> WriteOnce:
        """Append an approval row; a resubmitted identical approval is not duplicated.

        The key is ``(operation_id, decided_at, reviewer, decision, intent_hash)``.
        """
        ...

    def put_thread(self, record: ThreadRecord) -> ThreadRecord:
        """Insert a thread record unless one exists; return the stored one."""
        ...

    def put_lease(self, lease: Lease, *, expected: Lease | None) -> bool:
        """Write ``lease`` only if the stored lease equals ``expected`` (``None``: absent)."""
        ...

    def put_thread_tombstone(self, tombstone: ThreadTombstone) -> ThreadTombstone:
        """Insert a thread tombstone unless one exists; return the stored one."""
        ...

    def compact_operations(
        self,
        *,
        finished_before: datetime,
        now: datetime,
        thread_ids: Iterable[str] | None = None,
        keep_threads: Iterable[str] = (),
    ) -> int:
        """Compact terminal operations last updated before ``finished_before``.

        Each becomes an ``OperationTombstone`` (``compacted_at = now``); its
        approvals, events and row are deleted, in that order. Operations that
        are not terminal are never touched. ``thread_ids`` limits it to those
        threads; the operations of ``keep_threads`` are never touched (a
        thread that still waits or has work left reads its decisions back).

        Returns:
            How many operations were compacted.
        """
        ...

    def drop_operation_tombstones(self, *, finished_before: datetime) -> int:
        """Delete operation tombstones whose operation finished before ``finished_before``.

        Returns:
            How many were deleted.
        """
        ...

    def append_thread_event(self, event: ThreadEvent) -> int:
        """Append ``event`` (its ``seq`` is ignored) and return the ``seq`` assigned."""
        ...


class LedgerStore(Protocol):
    """A ledger backend: snapshots for reading, transactions for writing."""

    def read(self, *, single: bool = False) -> AbstractContextManager[StoreReader]:
        """Open a read-only consistent snapshot.

        Args:
            single: the caller promises the block makes exactly one reader
                call. A store whose reader calls are one statement each may
                then skip the snapshot transaction around it, since one
                statement already reads one consistent state
                (``PostgresLedgerStore`` sends no ``BEGIN`` and no
                ``ROLLBACK``: one round trip instead of two), and may refuse a
                second statement with ``LedgerError``. A block of several
                calls that must agree needs ``single=False``.
        """
        ...

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[StoreTransaction]:
        """Open a write transaction, committed when the block exits normally.

        Args:
            durable: ``True`` forces the commit to stable storage before the
                block returns (SQLite ``synchronous=FULL``). ``False`` may
                defer that to the next durable commit; callers use it only
                where a later durable commit always precedes any side effect.

        Raises:
            LedgerBusyError: the write lock could not be taken in time.
        """
        ...

    def compare_and_set_lease(self, lease: Lease, *, expected: Lease) -> bool:
        """Replace the stored lease ``expected`` by ``lease`` in a transaction of its own.

        The same compare-and-set as ``StoreTransaction.put_lease`` with an
        ``expected`` lease (owner, token and expiry must match the stored row),
        committed at once as the store's other lease writes commit: durably
        if the store has ``durable_leases = True`` (a database server that can
        crash while its clients live on), else as ``transaction(durable=False)``. For a
        caller that already knows the row it expects (the lease it holds, or
        the one it gave up last), it saves reading the row first: a store may
        send the whole transaction at once (``PostgresLedgerStore``: one round
        trip instead of three).

        Args:
            lease: the lease to store (its ``thread_id`` names the row).
            expected: the lease the row must hold now.

        Returns:
            ``True`` if the row held ``expected`` and now holds ``lease``;
            ``False`` if it held anything else (or no row), and nothing changed.

        Raises:
            LedgerBusyError: the row lock or a connection was not had in time.
        """
        ...

    def close(self) -> None:
        """Release the backend's connections; later calls fail."""
        ...
