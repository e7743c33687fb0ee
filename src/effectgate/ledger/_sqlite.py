"""``SqliteLedgerStore``: the embedded ledger backend (one file, WAL, fsync'd commits).

One connection per store, guarded by a ``threading.Lock``: several Python
threads may share a store, and several OS processes may open the same file
(SQLite's own locks serialise them; writers use ``BEGIN IMMEDIATE`` so a
write lock is taken up front and a transaction never fails half-way on an
upgrade from reader to writer). Every ``sqlite3`` error is translated here,
by error *code*, never by message text (which changes between SQLite versions).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from effectgate._clock import to_seconds
from effectgate._recent import Recent
from effectgate.errors import (
    ConfigError,
    LedgerBusyError,
    LedgerCorruptError,
    LedgerError,
    SchemaVersionError,
)
from effectgate.ledger import _codec as codec
from effectgate.ledger._migrations import (
    APPLICATION_ID,
    LATEST_VERSION,
    MIGRATIONS,
    UNFINISHED_STATES_SQL,
)
from effectgate.ledger._model import (
    TERMINAL,
    UNFINISHED,
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
from effectgate.ledger._store import (
    Change,
    Expect,
    NewEvent,
    StateCount,
    StoreReader,
    StoreTransaction,
    WriteOnce,
)

__all__ = ["SqliteLedgerStore"]

_OP_COLUMNS = ", ".join(codec.OPERATION_COLUMNS)
_OP_PARAMS = ", ".join("?" * len(codec.OPERATION_COLUMNS))
_APPROVAL_COLUMNS = ", ".join(codec.APPROVAL_COLUMNS)
_EVENT_COLUMNS = "seq, operation_id, kind, src, dst, attempt, at_ms, detail_json"


def _in_list(states: Iterable[OpState]) -> str:
    # OpState values are fixed identifiers, so inlining them is injection-safe
    # and gives one cached statement per state set.
    return ",".join(f"'{OpState(s).value}'" for s in sorted(states))


_UNFINISHED_SQL = UNFINISHED_STATES_SQL
_KNOWN = _in_list(OpState)

SQL_INSERT_OPERATION = (
    f"INSERT INTO operations ({_OP_COLUMNS}) VALUES ({_OP_PARAMS}) "
    f"ON CONFLICT (operation_id) DO NOTHING RETURNING {_OP_COLUMNS}"
)
SQL_GET_OPERATION = f"SELECT {_OP_COLUMNS} FROM operations WHERE operation_id = ?"
# SET expressions see the *old* row, so ``prev_state = state`` records the
# state being left and RETURNING hands it back: the transition event needs it,
# and this saves a read per claim (SQLite's RETURNING only shows new values).
SQL_COMPARE_AND_SET = f"""UPDATE operations SET
    prev_state = state, state = :state,
    attempt = COALESCE(:attempt, attempt),
    receipt_json = COALESCE(:receipt_json, receipt_json),
    error = COALESCE(:error, error),
    claimed_by = :claimed_by,
    next_attempt_at_ms = :next_attempt_at_ms,
    {{recoveries}}
    updated_at_ms = :updated_at_ms
WHERE operation_id = :operation_id AND state IN ({{states}})
    AND (:expect_attempt IS NULL OR attempt = :expect_attempt)
    AND (:expect_intent_hash IS NULL OR intent_hash = :expect_intent_hash)
    AND (:attempts_allowed_at_least IS NULL
        OR max_attempts + recoveries >= :attempts_allowed_at_least)
RETURNING {_OP_COLUMNS}"""
SQL_LIST_OPERATIONS = f"SELECT {_OP_COLUMNS} FROM operations"
SQL_LIST_ORDER = " ORDER BY created_at_ms, operation_id"
SQL_COUNT_OPERATIONS = "SELECT state, attempt, COUNT(*) FROM operations GROUP BY state, attempt"
SQL_OLDEST_UPDATED = (
    f"SELECT MIN(updated_at_ms) FROM operations WHERE {_UNFINISHED_SQL} AND state = ?"
)
SQL_INSERT_APPROVAL = (
    f"INSERT INTO approvals ({_APPROVAL_COLUMNS}) VALUES ({', '.join('?' * 10)}) "
    "ON CONFLICT DO NOTHING"
)
SQL_GET_APPROVAL_BY_KEY = (
    f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE operation_id = ? AND decided_at_ms = ? "
    "AND reviewer = ? AND decision = ? AND intent_hash = ?"
)
SQL_LIST_APPROVALS = f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE operation_id = ? ORDER BY id"
SQL_INSERT_EVENT = (
    "INSERT INTO events (operation_id, kind, src, dst, attempt, at_ms, detail_json) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SQL_LIST_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events"
SQL_LIST_EVENTS_BY_THREAD = (
    f"SELECT {', '.join('e.' + c for c in _EVENT_COLUMNS.split(', '))} FROM events e "
    "JOIN operations o ON o.operation_id = e.operation_id WHERE o.thread_id = ?"
)
SQL_COUNT_EVENTS = "SELECT COUNT(*) FROM events WHERE kind = ?"
SQL_INSERT_THREAD = (
    "INSERT INTO threads (thread_id, input_json, metadata_json, created_at_ms) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) DO NOTHING"
)
SQL_GET_THREAD = (
    "SELECT thread_id, input_json, metadata_json, created_at_ms FROM threads WHERE thread_id = ?"
)
SQL_LIST_THREADS = (
    "SELECT thread_id, input_json, metadata_json, created_at_ms FROM threads "
    "ORDER BY created_at_ms, thread_id"
)
SQL_GET_LEASE = (
    "SELECT thread_id, owner, token, expires_at_ms FROM thread_leases WHERE thread_id = ?"
)
SQL_INSERT_LEASE = (
    "INSERT INTO thread_leases (thread_id, owner, token, expires_at_ms) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (thread_id) DO NOTHING"
)
SQL_UPDATE_LEASE = (
    "UPDATE thread_leases SET owner = ?, token = ?, expires_at_ms = ? "
    "WHERE thread_id = ? AND owner = ? AND token = ? AND expires_at_ms BETWEEN ? AND ?"
)
SQL_INSERT_THREAD_EVENT = (
    "INSERT INTO thread_events (thread_id, kind, actor, at_ms, detail_json) VALUES (?, ?, ?, ?, ?)"
)
SQL_LIST_THREAD_EVENTS = "SELECT seq, thread_id, kind, actor, at_ms, detail_json FROM thread_events"
SQL_SCHEMA_VERSION = "SELECT MAX(version) FROM schema_version"
SQL_HAS_SCHEMA_TABLE = (
    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
)
SQL_COUNT_OBJECTS = "SELECT COUNT(*) FROM sqlite_master"
SQL_RECORD_VERSION = "INSERT INTO schema_version (version, applied_at_ms) VALUES (?, ?)"

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT})
_OPEN_CODES = frozenset({sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY})


def _translate_error(exc: sqlite3.Error, path: Path) -> Exception:
    """Map an ``sqlite3`` error to the ledger's taxonomy by its primary result code."""
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", "unknown")
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _BUSY_CODES:
        return LedgerBusyError(f"ledger {path} stayed locked past the busy timeout ({name})")
    if primary in _CORRUPT_CODES:
        return LedgerCorruptError(f"{path} is not a usable ledger database ({name})")
    if primary in _OPEN_CODES:
        return ConfigError(f"cannot open ledger {path} ({name}): {exc}")
    return LedgerError(f"ledger {path}: sqlite error {name}: {exc}")


@contextmanager
def _translated(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise _translate_error(exc, path) from exc


def _ref_filter(
    thread_id: str | None, operation_id: str | None, intent_hash: str | None, mark: str
) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause of ``operation_refs`` (``mark``: the driver's placeholder)."""
    where: list[str] = []
    params: list[Any] = []
    if thread_id is not None:
        where.append(f"thread_id = {mark}")
        params.append(thread_id)
    near = []
    for column, value in (("operation_id", operation_id), ("intent_hash", intent_hash)):
        if value is not None:
            near.append(f"{column} = {mark}")
            params.append(value)
    if near:
        where.append("(" + " OR ".join(near) + ")")
    return (" WHERE " + " AND ".join(where) if where else ""), params


class _DecodedRows:
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


_CREATED = codec.OPERATION_COLUMNS.index("created_at_ms")


def _tuples(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Rows as plain tuples, not the connection's ``sqlite3.Row``.

    The decode memo compares them as they are and decodes only a row it has not seen.
    """
    cur = conn.cursor()
    cur.row_factory = None
    try:
        return cur.execute(sql, params).fetchall()
    finally:
        cur.close()


class _Listing:
    """One thread's operations as last read, in listing order, and what changed since."""

    __slots__ = ("data_version", "dirty", "rows")

    def __init__(self, data_version: int, rows: dict[str, tuple[tuple[Any, ...], Operation]]):
        self.data_version = data_version
        self.rows = rows
        """operation id -> (row as read, its operation), in listing order."""
        self.dirty: set[str] = set()
        """Operations this connection wrote since the listing was read."""


class _ThreadListings:
    """Per-thread listings kept current from this connection's own writes.

    ``RunResult.operations`` lists the thread's operations after every run: a
    full read is O(operations of the thread), 0.22 ms at 55 and 0.56 ms at
    150 operations (benchmarks/README.md), for a run that changed one or two. SQLite's
    ``PRAGMA data_version`` changes exactly when *another* connection (another
    process, or another store on the same file) has committed; this
    connection's own writes to ``operations`` go through ``_Transaction``,
    which reports each row it changed. So while the data version stands, a
    listing is brought up to date by re-reading only the rows this connection
    wrote; otherwise it is read afresh. The pragma, run first in the read
    transaction, also fixes that transaction's snapshot, so the version and
    the rows read belong together.
    """

    def __init__(self, limit: int = 256) -> None:
        self._by_thread: Recent[str, _Listing] = Recent(limit)

    def wrote(self, thread_id: str, operation_id: str) -> None:
        entry = self._by_thread.get(thread_id)
        if entry is not None:
            entry.dirty.add(operation_id)

    def list(
        self, conn: sqlite3.Connection, thread_id: str, decoded: _DecodedRows
    ) -> list[Operation]:
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        entry = self._by_thread.get(thread_id)
        if entry is None or entry.data_version != version:
            raws = _tuples(
                conn, SQL_LIST_OPERATIONS + " WHERE thread_id = ?" + SQL_LIST_ORDER, (thread_id,)
            )
            rows = {raw[0]: (raw, decoded.operation(raw)) for raw in raws}
            self._by_thread[thread_id] = _Listing(version, rows)
            return [op for _, op in rows.values()]
        if entry.dirty:
            rows = entry.rows
            for op_id in sorted(entry.dirty):
                found = _tuples(conn, SQL_GET_OPERATION, (op_id,))
                if not found or found[0][1] != thread_id:
                    rows.pop(op_id, None)
                else:
                    rows[op_id] = (found[0], decoded.operation(found[0]))
            entry.dirty.clear()
            order = sorted(rows.items(), key=lambda kv: (kv[1][0][_CREATED], kv[0]))
            entry.rows = dict(order)
        return [op for _, op in entry.rows.values()]


_SQL_THREAD_TOMBSTONE = "SELECT thread_id, deleted_at_ms, deleted_by, reason FROM thread_tombstones"
_SQL_OP_TOMBSTONE = (
    "SELECT operation_id, thread_id, tool, intent_hash, state, receipt_json, finished_at_ms, "
    "compacted_at_ms FROM operation_tombstones"
)


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


class _Reader:
    """Reads on one connection; the caller holds the store lock and a transaction."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        decoded: _DecodedRows | None = None,
        listings: _ThreadListings | None = None,
    ) -> None:
        self._conn = conn
        self._decoded = decoded
        self._listings = listings

    def get_operation(self, operation_id: str) -> Operation | None:
        if self._decoded is None:
            row = self._conn.execute(SQL_GET_OPERATION, (operation_id,)).fetchone()
            return None if row is None else codec.operation_from_row(row)
        found = _tuples(self._conn, SQL_GET_OPERATION, (operation_id,))
        return self._decoded.operation(found[0]) if found else None

    def list_operations(
        self,
        *,
        thread_id: str | None = None,
        states: Iterable[OpState] | None = None,
        tool: str | None = None,
        intent_hash: str | None = None,
    ) -> list[Operation]:
        if (
            self._listings is not None
            and self._decoded is not None
            and thread_id is not None
            and states is None
            and tool is None
            and intent_hash is None
        ):
            return self._listings.list(self._conn, thread_id, self._decoded)
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            wanted = frozenset(OpState(s) for s in states)
            if not wanted:
                return []
            if intent_hash is not None:
                # A duplicate check, served by the intent index: a row whose
                # state this build does not know (a damaged file) matches too,
                # so decoding reports it instead of the check silently missing it.
                where.append(f"(state IN ({_in_list(wanted)}) OR state NOT IN ({_KNOWN}))")
            else:
                if wanted <= UNFINISHED:
                    where.append(_UNFINISHED_SQL)  # lets the planner use the partial index
                where.append(f"state IN ({_in_list(wanted)})")
        if thread_id is not None:
            where.append("thread_id = ?")
            params.append(thread_id)
        if tool is not None:
            where.append("tool = ?")
            params.append(tool)
        if intent_hash is not None:
            where.append("intent_hash = ?")  # operations_by_intent (schema v2)
            params.append(intent_hash)
        sql = SQL_LIST_OPERATIONS + (" WHERE " + " AND ".join(where) if where else "")
        if self._decoded is None:
            rows = self._conn.execute(sql + SQL_LIST_ORDER, params).fetchall()
            return [codec.operation_from_row(row) for row in rows]
        return [
            self._decoded.operation(raw)
            for raw in _tuples(self._conn, sql + SQL_LIST_ORDER, params)
        ]

    def approvals(self, operation_id: str) -> list[Approval]:
        rows = self._conn.execute(SQL_LIST_APPROVALS, (operation_id,)).fetchall()
        return [codec.approval_from_row(row) for row in rows]

    def events(
        self, *, operation_id: str | None = None, thread_id: str | None = None
    ) -> list[Event]:
        params: list[Any] = []
        if thread_id is not None:
            sql = SQL_LIST_EVENTS_BY_THREAD
            params.append(thread_id)
            if operation_id is not None:
                sql += " AND e.operation_id = ?"
                params.append(operation_id)
            sql += " ORDER BY e.seq"
        elif operation_id is not None:
            sql = SQL_LIST_EVENTS + " WHERE operation_id = ? ORDER BY seq"
            params.append(operation_id)
        else:
            sql = SQL_LIST_EVENTS + " ORDER BY seq"
        return [codec.event_from_row(row) for row in self._conn.execute(sql, params)]

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        row = self._conn.execute(SQL_GET_THREAD, (thread_id,)).fetchone()
        return None if row is None else codec.thread_from_row(row)

    def list_threads(self) -> list[ThreadRecord]:
        return [codec.thread_from_row(row) for row in self._conn.execute(SQL_LIST_THREADS)]

    def thread_ids(self) -> list[str]:
        rows = self._conn.execute("SELECT thread_id FROM threads ORDER BY created_at_ms, thread_id")
        return [str(r[0]) for r in rows]

    def get_lease(self, thread_id: str) -> Lease | None:
        row = self._conn.execute(SQL_GET_LEASE, (thread_id,)).fetchone()
        return None if row is None else codec.lease_from_row(row)

    def thread_events(self, thread_id: str | None = None) -> list[ThreadEvent]:
        if thread_id is None:
            rows = self._conn.execute(SQL_LIST_THREAD_EVENTS + " ORDER BY seq")
        else:
            sql = SQL_LIST_THREAD_EVENTS + " WHERE thread_id = ? ORDER BY seq"
            rows = self._conn.execute(sql, (thread_id,))
        return [codec.thread_event_from_row(row) for row in rows]

    def count_operations(self) -> list[StateCount]:
        rows = self._conn.execute(SQL_COUNT_OPERATIONS).fetchall()
        return [
            StateCount(state=codec.state_or_corrupt(s, "(aggregate)"), attempt=a, count=n)
            for s, a, n in rows
        ]

    def count_events(self, kind: EventKind) -> int:
        (count,) = self._conn.execute(SQL_COUNT_EVENTS, (kind.value,)).fetchone()
        return int(count)

    def oldest_updated_at(self, state: OpState) -> datetime | None:
        (ms,) = self._conn.execute(SQL_OLDEST_UPDATED, (state.value,)).fetchone()
        return None if ms is None else codec.from_ms(ms)

    def get_thread_tombstone(self, thread_id: str) -> ThreadTombstone | None:
        row = self._conn.execute(_SQL_THREAD_TOMBSTONE + " WHERE thread_id = ?", (thread_id,))
        found = row.fetchone()
        return None if found is None else _thread_tombstone(found)

    def list_thread_tombstones(self) -> list[ThreadTombstone]:
        rows = self._conn.execute(_SQL_THREAD_TOMBSTONE + " ORDER BY deleted_at_ms, thread_id")
        return [_thread_tombstone(row) for row in rows]

    def get_operation_tombstone(self, operation_id: str) -> OperationTombstone | None:
        found = self._conn.execute(
            _SQL_OP_TOMBSTONE + " WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if found is None else _operation_tombstone(found)

    def list_operation_tombstones(self, *, intent_hash: str) -> list[OperationTombstone]:
        rows = self._conn.execute(
            _SQL_OP_TOMBSTONE + " WHERE intent_hash = ? ORDER BY finished_at_ms, operation_id",
            (intent_hash,),
        )
        return [_operation_tombstone(row) for row in rows]

    def operation_refs(
        self,
        *,
        thread_id: str | None = None,
        operation_id: str | None = None,
        intent_hash: str | None = None,
    ) -> list[tuple[str, str]]:
        where, params = _ref_filter(thread_id, operation_id, intent_hash, "?")
        rows = self._conn.execute(
            "SELECT operation_id, thread_id FROM operations" + where + SQL_LIST_ORDER, params
        ).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def intent_neighbours(
        self, operation_id: str, intent_hash: str
    ) -> tuple[list[Operation], list[OperationTombstone]]:
        query = SQL_LIST_OPERATIONS + " WHERE operation_id = ? OR intent_hash = ?" + SQL_LIST_ORDER
        key = (operation_id, intent_hash)
        if self._decoded is None:
            ops = [codec.operation_from_row(r) for r in self._conn.execute(query, key).fetchall()]
        else:
            ops = [self._decoded.operation(raw) for raw in _tuples(self._conn, query, key)]
        tombs = self._conn.execute(
            _SQL_OP_TOMBSTONE
            + " WHERE operation_id = ? OR intent_hash = ? ORDER BY finished_at_ms, operation_id",
            key,
        )
        return ops, [_operation_tombstone(t) for t in tombs]


class _Transaction(_Reader):
    """Reads and writes inside one ``BEGIN IMMEDIATE`` transaction.

    Every operation row it writes is reported to ``listings`` (see ``_ThreadListings``).
    """

    def _wrote(self, row: sqlite3.Row) -> None:
        if self._listings is not None:
            self._listings.wrote(row["thread_id"], row["operation_id"])

    def create_or_get(self, op: Operation) -> tuple[Operation, bool]:
        rows = self._conn.execute(SQL_INSERT_OPERATION, codec.operation_to_row(op)).fetchall()
        if rows:
            self._wrote(rows[0])
            return codec.operation_from_row(rows[0]), True
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
        # Only a given-back attempt names ``recoveries``, so the guard trigger on
        # that column runs for it alone, not for every claim and result.
        recoveries = ""
        if change.recoveries is not None:
            params["recoveries"] = change.recoveries
            recoveries = "recoveries = :recoveries,"
        sql = SQL_COMPARE_AND_SET.format(states=_in_list(expect.states), recoveries=recoveries)
        rows = self._conn.execute(sql, params).fetchall()  # fetchall: finish the statement
        if not rows:
            return None
        self._wrote(rows[0])
        op = codec.operation_from_row(rows[0])
        return codec.state_or_corrupt(rows[0]["prev_state"], operation_id), op

    def append_event(self, event: NewEvent) -> None:
        self._conn.execute(SQL_INSERT_EVENT, codec.event_to_row(event))

    def put_approval(self, approval: Approval) -> WriteOnce:
        row = codec.approval_to_row(approval)
        if self._conn.execute(SQL_INSERT_APPROVAL, row).rowcount == 1:
            return WriteOnce.INSERTED
        key = (row[0], row[8], row[5], row[3], row[4])
        stored = self._conn.execute(SQL_GET_APPROVAL_BY_KEY, key).fetchone()
        return (
            WriteOnce.EXISTS if stored is not None and tuple(stored) == row else WriteOnce.CONFLICT
        )

    def put_thread(self, record: ThreadRecord) -> ThreadRecord:
        self._conn.execute(SQL_INSERT_THREAD, codec.thread_to_row(record))
        stored = self.get_thread(record.thread_id)
        assert stored is not None
        return stored

    def put_lease(self, lease: Lease, *, expected: Lease | None) -> bool:
        new = (lease.owner, lease.token, codec.to_ms(lease.expires_at))
        if expected is None:
            cur = self._conn.execute(SQL_INSERT_LEASE, (lease.thread_id, *new))
        else:
            low, high = codec.lease_expiry_range(expected.expires_at)
            old = (expected.owner, expected.token, low, high)
            cur = self._conn.execute(SQL_UPDATE_LEASE, (*new, lease.thread_id, *old))
        return cur.rowcount == 1

    def put_thread_tombstone(self, tombstone: ThreadTombstone) -> ThreadTombstone:
        self._conn.execute(
            "INSERT INTO thread_tombstones (thread_id, deleted_at_ms, deleted_by, reason) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (thread_id) DO NOTHING",
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
        cutoff = codec.to_ms(finished_before)
        where = f"state IN ({_in_list(TERMINAL)}) AND updated_at_ms < ?"
        params: list[Any] = [cutoff]
        if thread_ids is not None:
            ids = list(thread_ids)
            where += f" AND thread_id IN ({', '.join('?' * len(ids))})"
            params.extend(ids)
        kept = list(keep_threads)
        if kept:
            where += f" AND thread_id NOT IN ({', '.join('?' * len(kept))})"
            params.extend(kept)
        victims = self._conn.execute(
            f"SELECT operation_id, thread_id FROM operations WHERE {where}", params
        ).fetchall()
        if not victims:
            return 0
        self._conn.execute(
            "INSERT OR REPLACE INTO operation_tombstones (operation_id, thread_id, tool, "
            "intent_hash, state, receipt_json, finished_at_ms, compacted_at_ms) "
            "SELECT operation_id, thread_id, tool, intent_hash, state, receipt_json, "
            f"updated_at_ms, ? FROM operations WHERE {where}",
            [codec.to_ms(now), *params],
        )
        sub = f"SELECT operation_id FROM operations WHERE {where}"
        self._conn.execute(f"DELETE FROM approvals WHERE operation_id IN ({sub})", params)
        self._conn.execute(f"DELETE FROM events WHERE operation_id IN ({sub})", params)
        self._conn.execute(f"DELETE FROM operations WHERE {where}", params)
        if self._listings is not None:
            for op_id, thread_id in victims:
                self._listings.wrote(thread_id, op_id)
        return len(victims)

    def drop_operation_tombstones(self, *, finished_before: datetime) -> int:
        cur = self._conn.execute(
            "DELETE FROM operation_tombstones WHERE finished_at_ms < ?",
            (codec.to_ms(finished_before),),
        )
        return cur.rowcount

    def append_thread_event(self, event: ThreadEvent) -> int:
        cur = self._conn.execute(SQL_INSERT_THREAD_EVENT, codec.thread_event_to_row(event))
        assert cur.lastrowid is not None
        return cur.lastrowid


class SqliteLedgerStore:
    """The ledger's tables in one SQLite file: WAL, ``synchronous=FULL``, fsync per commit.

    Opening checks the file before writing anything: a file that is not an
    SQLite database, or an SQLite database that is not a ledger, or a ledger
    whose schema is newer than this build, is refused and left untouched.

    Args:
        path: the database file; created (with its directory's permission) if missing.
        migrate: bring an older schema up to date; with ``False`` an older
            schema (or a new empty file) is refused instead.
        busy_timeout: how long a statement waits for another connection's
            lock before giving up; ``timedelta`` or float seconds.

    Raises:
        ConfigError: the path is a directory or cannot be opened, or WAL is unavailable.
        LedgerCorruptError: the file is not a ledger database.
        SchemaVersionError: the schema is newer than this build, or older with
            ``migrate=False``.
        LedgerBusyError: another process held the lock past ``busy_timeout``.
    """

    THREADS_TABLE = "threads"
    """The table of thread records (named when one of them is damaged)."""

    def __init__(
        self,
        path: str | Path,
        *,
        migrate: bool = True,
        busy_timeout: timedelta | float = 30.0,
    ) -> None:
        self.path = Path(path)
        """The database file."""
        if self.path.is_dir():
            raise ConfigError(f"ledger path {self.path} is a directory, not a file")
        self._lock = threading.Lock()
        self._decoded = _DecodedRows()
        self._listings = _ThreadListings()
        self._busy_timeout_s = to_seconds(busy_timeout)
        with _translated(self.path):
            conn = sqlite3.connect(
                str(self.path),
                timeout=to_seconds(busy_timeout),
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # shared by threads under self._lock
            )
        self._conn: sqlite3.Connection | None = conn
        try:
            with _translated(self.path):
                self._prepare(conn, migrate=migrate)
        except BaseException:
            conn.close()
            self._conn = None
            raise
        conn.row_factory = sqlite3.Row

    def _prepare(self, conn: sqlite3.Connection, *, migrate: bool) -> None:
        # Look before touching: switching to WAL or migrating writes to the
        # file, and a foreign or future file must be left exactly as it was.
        conn.execute("BEGIN")  # one snapshot: another process may be migrating right now
        try:
            version = self._inspect(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        self._check_version(version, migrate=migrate)
        mode = self._switch_to_wal(conn)
        if str(mode).lower() != "wal":
            raise ConfigError(f"ledger {self.path}: the file system refused WAL (got {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        if version < LATEST_VERSION:
            self._migrate(conn)

    def _switch_to_wal(self, conn: sqlite3.Connection) -> str:
        # Switching a new file to WAL needs an exclusive lock, and SQLite may
        # answer SQLITE_BUSY at once instead of calling the busy handler
        # while other connections open the same new file (seen with four
        # threads on a loaded machine). Retry until the busy timeout.
        deadline = time.monotonic() + self._busy_timeout_s
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _inspect(self, conn: sqlite3.Connection) -> int:
        """Return the schema version of a ledger file; 0 for an empty file."""
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        if app_id == APPLICATION_ID:
            if conn.execute(SQL_HAS_SCHEMA_TABLE).fetchone()[0] == 0:
                raise LedgerCorruptError(f"{self.path}: ledger file without a schema_version table")
            (version,) = conn.execute(SQL_SCHEMA_VERSION).fetchone()
            return int(version or 0)
        if app_id == 0 and conn.execute(SQL_COUNT_OBJECTS).fetchone()[0] == 0:
            return 0
        raise LedgerCorruptError(
            f"{self.path} is an SQLite database but not an effectgate ledger "
            f"(application_id {app_id:#x}, expected {APPLICATION_ID:#x})"
        )

    def _check_version(self, version: int, *, migrate: bool) -> None:
        if version > LATEST_VERSION or (version < LATEST_VERSION and not migrate):
            raise SchemaVersionError(found=version, expected=LATEST_VERSION, path=str(self.path))

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated.
            version = self._inspect(conn)
            self._check_version(version, migrate=True)
            now_ms = time.time_ns() // 1_000_000
            for target in range(version + 1, LATEST_VERSION + 1):
                for statement in MIGRATIONS[target]:
                    conn.execute(statement)
                conn.execute(SQL_RECORD_VERSION, (target, now_ms))
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"ledger {self.path} is closed")
        return self._conn

    @contextmanager
    def read(self, *, single: bool = False) -> Iterator[StoreReader]:
        """Open a consistent read snapshot (a deferred transaction), under the store lock.

        Args:
            single: accepted for the seam and ignored: an SQLite ``BEGIN`` is
                no round trip, so every block keeps its snapshot.
        """
        with self._lock, _translated(self.path):
            conn = self._live()
            conn.execute("BEGIN")
            try:
                yield _Reader(conn, self._decoded, self._listings)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")  # read-only: nothing to keep

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[StoreTransaction]:
        """Open a ``BEGIN IMMEDIATE`` transaction, committed when the block exits normally.

        Args:
            durable: ``True`` commits with ``synchronous=FULL`` (the WAL is
                fsync'd before return). ``False`` commits with ``NORMAL``: the
                frames reach the WAL but the fsync waits for the next FULL
                commit, which makes them durable too (WAL frames are
                appended in order).

        Raises:
            LedgerBusyError: another connection held the write lock past the busy timeout.
        """
        with self._lock, _translated(self.path):
            conn = self._live()
            if not durable:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield _Transaction(conn, listings=self._listings)
                    conn.execute("COMMIT")
                finally:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
            finally:
                if not durable:
                    conn.execute("PRAGMA synchronous = FULL")

    def compare_and_set_lease(self, lease: Lease, *, expected: Lease) -> bool:
        """``put_lease(lease, expected=expected)`` in a ``transaction(durable=False)`` of its own.

        See ``LedgerStore.compare_and_set_lease``. On SQLite reading the row
        first costs no round trip, so this only spares the caller the read.
        """
        with self.transaction(durable=False) as tx:
            return tx.put_lease(lease, expected=expected)

    def close(self) -> None:
        """Close the connection; idempotent. Later calls raise ``LedgerError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
