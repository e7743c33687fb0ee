"""The store seam's reads and writes, written once over SQL for both stores.

``SqlReader`` and ``SqlTransaction`` implement ``StoreReader`` and
``StoreTransaction`` from the statements of ``_sql`` and the row codec of
``_codec``; a backend subclasses them for its connection and provides a few
hooks, and only what really differs:

- ``_rows(query, params)``: run one statement, return its rows as tuples
  (every reader; the one hook a reader must provide);
- ``_execute(query, params)``: run one statement, return its row count
  (every writer);
- ``_queue(query, params)``: a write whose result nobody reads; PostgreSQL
  sends it with the next statement (pipelining), SQLite at once;
- ``_rows_together(statements)``: independent reads; PostgreSQL sends them in
  one pipeline;
- ``_thread_listing(thread_id)`` and ``_wrote(thread_id, operation_id)``:
  SQLite's per-thread listing cache, kept current from its own writes.

Operations decode through ``DecodedRows`` (a row read back unchanged is not
decoded again) when the reader is given one, else afresh and column by column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar

from effectgate._recent import Recent
from effectgate.errors import LedgerError
from effectgate.ledger import _codec as codec
from effectgate.ledger._model import (
    Approval,
    Event,
    EventKind,
    Lease,
    Operation,
    OperationTombstone,
    OpState,
    ThreadEvent,
    ThreadRecord,
    ThreadTombstone,
)
from effectgate.ledger._sql import (
    EVENT_COLUMNS,
    LEASE_COLUMNS,
    THREAD_COLUMNS,
    THREAD_EVENT_COLUMNS,
    LedgerSql,
)
from effectgate.ledger._store import (
    Change,
    Expect,
    NewEvent,
    StateCount,
    WriteOnce,
)

__all__ = ["DecodedRows", "SqlReader", "SqlTransaction"]

Params = Sequence[Any] | dict[str, Any]

_PREV_STATE = codec.OPERATION_COLUMNS.index("prev_state")
_THREAD_ID = codec.OPERATION_COLUMNS.index("thread_id")


class DecodedRows:
    """Operations decoded from rows, reused while a row reads back byte for byte the same.

    Listing a thread's operations after every run decodes every row (JSON,
    times, receipt): O(thread) work per step that grew to 2 ms per side effect
    at 60 operations, benchmarks/README.md). An operation is a pure function of its row, so
    a row equal to the one decoded before yields the same frozen ``Operation``;
    any change to any column (a new state, attempt, receipt, or corruption)
    makes the row differ and it is decoded, and validated, afresh. At most
    ``limit`` rows are kept, the most recently decoded.
    """

    def __init__(self, limit: int = 20_000) -> None:
        self._by_id: Recent[str, tuple[tuple[Any, ...], Operation]] = Recent(limit)

    def operation(self, raw: tuple[Any, ...]) -> Operation:
        """The operation of a row given as a plain tuple in ``OPERATION_COLUMNS`` order."""
        key = raw[0]  # operation_id: OPERATION_COLUMNS starts with it
        hit = self._by_id.get(key)
        if hit is not None and hit[0] == raw:
            return hit[1]
        op = codec.operation_from_tuple(raw)
        self._by_id[key] = (raw, op)
        return op


def _mapping(columns: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(columns, row, strict=True))


def _thread_tombstone(row: Sequence[Any]) -> ThreadTombstone:
    return ThreadTombstone(
        thread_id=row[0], deleted_at=codec.from_ms(row[1]), deleted_by=row[2], reason=row[3]
    )


def _operation_tombstone(row: Sequence[Any]) -> OperationTombstone:
    return OperationTombstone(
        operation_id=row[0],
        thread_id=row[1],
        tool=row[2],
        intent_hash=row[3],
        state=codec.state_or_corrupt(row[4], row[0]),
        receipt=None if row[5] is None else codec.receipt_from_json(row[5]),
        finished_at=codec.from_ms(row[6]),
        compacted_at=codec.from_ms(row[7]),
    )


class SqlReader:
    """``StoreReader`` over one connection, inside a snapshot the store opened.

    Args:
        decoded: the store's decode memo; ``None`` decodes every row afresh.

    Raises (every method): as ``StoreReader``; the backend's ``_rows``
    translates its driver's errors.
    """

    sql: ClassVar[LedgerSql]
    """The statements, rendered for the backend's dialect."""
    _locking: ClassVar[bool] = False
    """Operation and lease rows are read for update (inside a write transaction)."""

    def __init__(self, decoded: DecodedRows | None) -> None:
        self._decoded = decoded

    # -- hooks ----------------------------------------------------------------

    def _rows(self, query: str, params: Params = ()) -> list[Any]:
        """Run one statement; its rows as tuples (``[]`` for none)."""
        raise NotImplementedError

    def _rows_together(self, statements: Sequence[tuple[str, Params]]) -> list[list[Any]]:
        """Run independent statements (by default one after another)."""
        return [self._rows(query, params) for query, params in statements]

    def _thread_listing(self, thread_id: str) -> list[Operation] | None:
        """A thread's operations from a cache, or ``None`` to read them (by default)."""
        return None

    # -- decoding -------------------------------------------------------------

    def _operation(self, raw: Sequence[Any]) -> Operation:
        if self._decoded is None:
            return codec.operation_from_row(_mapping(codec.OPERATION_COLUMNS, raw))
        return self._decoded.operation(tuple(raw))

    def _operations(self, rows: Iterable[Sequence[Any]]) -> list[Operation]:
        return [self._operation(raw) for raw in rows]

    # -- StoreReader ----------------------------------------------------------

    def get_operation(self, operation_id: str) -> Operation | None:
        query = self.sql.get_operation_for_update if self._locking else self.sql.get_operation
        found = self._rows(query, (operation_id,))
        return self._operation(found[0]) if found else None

    def list_operations(
        self,
        *,
        thread_id: str | None = None,
        states: Iterable[OpState] | None = None,
        tool: str | None = None,
        intent_hash: str | None = None,
    ) -> list[Operation]:
        if thread_id is not None and states is None and tool is None and intent_hash is None:
            listed = self._thread_listing(thread_id)
            if listed is not None:
                return listed
        built = self.sql.list_operations(
            thread_id=thread_id, states=states, tool=tool, intent_hash=intent_hash
        )
        if built is None:
            return []
        return self._operations(self._rows(*built))

    def approvals(self, operation_id: str) -> list[Approval]:
        rows = self._rows(self.sql.list_approvals, (operation_id,))
        return [codec.approval_from_row(_mapping(codec.APPROVAL_COLUMNS, r)) for r in rows]

    def events(
        self, *, operation_id: str | None = None, thread_id: str | None = None
    ) -> list[Event]:
        rows = self._rows(*self.sql.list_events(operation_id=operation_id, thread_id=thread_id))
        return [codec.event_from_row(_mapping(EVENT_COLUMNS, r)) for r in rows]

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        rows = self._rows(self.sql.get_thread, (thread_id,))
        return codec.thread_from_row(_mapping(THREAD_COLUMNS, rows[0])) if rows else None

    def list_threads(self) -> list[ThreadRecord]:
        rows = self._rows(self.sql.list_threads)
        return [codec.thread_from_row(_mapping(THREAD_COLUMNS, r)) for r in rows]

    def thread_ids(self) -> list[str]:
        return [str(r[0]) for r in self._rows(self.sql.thread_ids)]

    def get_lease(self, thread_id: str) -> Lease | None:
        query = self.sql.get_lease_for_update if self._locking else self.sql.get_lease
        rows = self._rows(query, (thread_id,))
        return codec.lease_from_row(_mapping(LEASE_COLUMNS, rows[0])) if rows else None

    def thread_events(self, thread_id: str | None = None) -> list[ThreadEvent]:
        rows = self._rows(*self.sql.thread_events(thread_id))
        return [codec.thread_event_from_row(_mapping(THREAD_EVENT_COLUMNS, r)) for r in rows]

    def count_operations(self) -> list[StateCount]:
        return [
            StateCount(state=codec.state_or_corrupt(s, "(aggregate)"), attempt=a, count=int(n))
            for s, a, n in self._rows(self.sql.count_operations)
        ]

    def count_events(self, kind: EventKind) -> int:
        ((count,),) = self._rows(self.sql.count_events, (kind.value,))
        return int(count)

    def oldest_updated_at(self, state: OpState) -> datetime | None:
        ((ms,),) = self._rows(self.sql.oldest_updated, (state.value,))
        return None if ms is None else codec.from_ms(ms)

    def get_thread_tombstone(self, thread_id: str) -> ThreadTombstone | None:
        found = self._rows(self.sql.get_thread_tombstone, (thread_id,))
        return _thread_tombstone(found[0]) if found else None

    def list_thread_tombstones(self) -> list[ThreadTombstone]:
        return [_thread_tombstone(r) for r in self._rows(self.sql.list_thread_tombstones)]

    def get_operation_tombstone(self, operation_id: str) -> OperationTombstone | None:
        found = self._rows(self.sql.get_operation_tombstone, (operation_id,))
        return _operation_tombstone(found[0]) if found else None

    def list_operation_tombstones(self, *, intent_hash: str) -> list[OperationTombstone]:
        rows = self._rows(self.sql.list_operation_tombstones, (intent_hash,))
        return [_operation_tombstone(r) for r in rows]

    def operation_refs(
        self,
        *,
        thread_id: str | None = None,
        operation_id: str | None = None,
        intent_hash: str | None = None,
    ) -> list[tuple[str, str]]:
        rows = self._rows(*self.sql.operation_refs(thread_id, operation_id, intent_hash))
        return [(str(r[0]), str(r[1])) for r in rows]

    def intent_neighbours(
        self, operation_id: str, intent_hash: str
    ) -> tuple[list[Operation], list[OperationTombstone]]:
        key = (operation_id, intent_hash)
        ops, tombs = self._rows_together(
            [(self.sql.intent_neighbours, key), (self.sql.intent_neighbour_tombstones, key)]
        )
        return self._operations(ops), [_operation_tombstone(r) for r in tombs]


class SqlTransaction(SqlReader):
    """``StoreTransaction`` over one connection, inside a write transaction the store opened.

    Operation and lease rows it reads are read for update (where the dialect
    needs a row lock for that); every operation row it writes is reported to
    ``_wrote``.
    """

    _locking = True

    # -- hooks ----------------------------------------------------------------

    def _execute(self, query: str, params: Params = ()) -> int:
        """Run one statement; the number of rows it changed."""
        raise NotImplementedError

    def _queue(self, query: str, params: Params) -> None:
        """A write whose result nobody reads (by default run at once)."""
        self._execute(query, params)

    def _wrote(self, thread_id: str, operation_id: str) -> None:
        """This transaction wrote (or deleted) the operation row (by default nothing to do)."""

    # -- StoreTransaction -----------------------------------------------------

    def create_or_get(self, op: Operation) -> tuple[Operation, bool]:
        rows = self._rows(self.sql.insert_operation, codec.operation_to_row(op))
        if rows:
            self._wrote(rows[0][_THREAD_ID], rows[0][0])
            return self._operation(rows[0]), True
        stored = self.get_operation(op.operation_id)
        if stored is None:  # pragma: no cover - DO NOTHING only skips an existing row
            raise LedgerError(f"operation {op.operation_id!r} vanished inside a transaction")
        return stored, False

    def compare_and_set(
        self, operation_id: str, expect: Expect, change: Change
    ) -> tuple[OpState, Operation] | None:
        if not expect.states:
            return None
        params = {
            "operation_id": operation_id,
            "state": change.state.value,
            "attempt": change.attempt,
            "receipt_json": None if change.receipt is None else codec.receipt_json(change.receipt),
            "error": change.error,
            "claimed_by": change.claimed_by,
            "next_attempt_at_ms": codec.ms_or_none(change.next_attempt_at),
            "updated_at_ms": codec.to_ms(change.updated_at),
            "expect_attempt": expect.attempt,
            "expect_intent_hash": expect.intent_hash,
            "attempts_allowed_at_least": expect.attempts_allowed_at_least,
        }
        if change.recoveries is not None:
            params["recoveries"] = change.recoveries
        query = self.sql.compare_and_set(expect.states, recoveries=change.recoveries is not None)
        rows = self._rows(query, params)
        if not rows:
            return None
        raw = rows[0]
        self._wrote(raw[_THREAD_ID], raw[0])
        op = self._operation(raw)
        return codec.state_or_corrupt(raw[_PREV_STATE], operation_id), op

    def append_event(self, event: NewEvent) -> None:
        # Nobody reads an event back inside the transaction that appends it.
        self._queue(self.sql.insert_event, codec.event_to_row(event))

    def put_approval(self, approval: Approval) -> WriteOnce:
        row = codec.approval_to_row(approval)
        if self._execute(self.sql.insert_approval, row) == 1:
            return WriteOnce.INSERTED
        key = (row[0], row[8], row[5], row[3], row[4])
        stored = self._rows(self.sql.get_approval_by_key, key)
        return WriteOnce.EXISTS if stored and tuple(stored[0]) == row else WriteOnce.CONFLICT

    def put_thread(self, record: ThreadRecord) -> ThreadRecord:
        self._execute(self.sql.insert_thread, codec.thread_to_row(record))
        stored = self.get_thread(record.thread_id)
        assert stored is not None
        return stored

    def put_lease(self, lease: Lease, *, expected: Lease | None) -> bool:
        new = (lease.owner, lease.token, codec.to_ms(lease.expires_at))
        if expected is None:
            return self._execute(self.sql.insert_lease, (lease.thread_id, *new)) == 1
        low, high = codec.lease_expiry_range(expected.expires_at)
        old = (expected.owner, expected.token, low, high)
        return self._execute(self.sql.update_lease, (*new, lease.thread_id, *old)) == 1

    def put_thread_tombstone(self, tombstone: ThreadTombstone) -> ThreadTombstone:
        self._execute(
            self.sql.insert_thread_tombstone,
            (
                tombstone.thread_id,
                codec.to_ms(tombstone.deleted_at),
                tombstone.deleted_by,
                tombstone.reason,
            ),
        )
        stored = self.get_thread_tombstone(tombstone.thread_id)
        assert stored is not None
        return stored

    def compact_operations(
        self,
        *,
        finished_before: datetime,
        now: datetime,
        thread_ids: Iterable[str] | None = None,
        keep_threads: Iterable[str] = (),
    ) -> int:
        plan = self.sql.compaction(codec.to_ms(finished_before), thread_ids, list(keep_threads))
        victims = [(str(r[0]), str(r[1])) for r in self._rows(*plan.victims)]
        if not victims:
            return 0
        for query, params in plan.writes([op_id for op_id, _ in victims], codec.to_ms(now)):
            self._execute(query, params)
        for op_id, thread_id in victims:
            self._wrote(thread_id, op_id)
        return len(victims)

    def drop_operation_tombstones(self, *, finished_before: datetime) -> int:
        return self._execute(self.sql.drop_operation_tombstones, (codec.to_ms(finished_before),))

    def append_thread_event(self, event: ThreadEvent) -> int:
        ((seq,),) = self._rows(self.sql.insert_thread_event, codec.thread_event_to_row(event))
        return int(seq)
