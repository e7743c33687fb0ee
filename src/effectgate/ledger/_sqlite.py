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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
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
from effectgate.ledger._migrations import APPLICATION_ID, LATEST_VERSION, MIGRATIONS
from effectgate.ledger._model import Lease, Operation
from effectgate.ledger._sql import (
    SQLITE,
    SQLITE_COUNT_OBJECTS,
    SQLITE_DATA_VERSION,
    SQLITE_HAS_SCHEMA_TABLE,
)
from effectgate.ledger._sql_store import DecodedRows, SqlReader, SqlTransaction
from effectgate.ledger._store import StoreReader, StoreTransaction

__all__ = ["SqliteLedgerStore"]

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
        self, conn: sqlite3.Connection, thread_id: str, decoded: DecodedRows
    ) -> list[Operation]:
        (version,) = conn.execute(SQLITE_DATA_VERSION).fetchone()
        entry = self._by_thread.get(thread_id)
        if entry is None or entry.data_version != version:
            listing = SQLITE.list_operations(thread_id=thread_id)
            assert listing is not None
            raws = _tuples(conn, *listing)
            rows = {raw[0]: (raw, decoded.operation(raw)) for raw in raws}
            self._by_thread[thread_id] = _Listing(version, rows)
            return [op for _, op in rows.values()]
        if entry.dirty:
            rows = entry.rows
            for op_id in sorted(entry.dirty):
                found = _tuples(conn, SQLITE.get_operation, (op_id,))
                if not found or found[0][1] != thread_id:
                    rows.pop(op_id, None)
                else:
                    rows[op_id] = (found[0], decoded.operation(found[0]))
            entry.dirty.clear()
            order = sorted(rows.items(), key=lambda kv: (kv[1][0][_CREATED], kv[0]))
            entry.rows = dict(order)
        return [op for _, op in entry.rows.values()]


class _Reader(SqlReader):
    """Reads on one connection; the caller holds the store lock and a transaction."""

    sql = SQLITE

    def __init__(
        self,
        conn: sqlite3.Connection,
        decoded: DecodedRows | None = None,
        listings: _ThreadListings | None = None,
    ) -> None:
        super().__init__(decoded)
        self._conn = conn
        self._listings = listings

    def _rows(self, query: str, params: Any = ()) -> list[Any]:
        return _tuples(self._conn, query, params)

    def _thread_listing(self, thread_id: str) -> list[Operation] | None:
        if self._listings is None or self._decoded is None:
            return None
        return self._listings.list(self._conn, thread_id, self._decoded)


class _Transaction(_Reader, SqlTransaction):
    """Reads and writes inside one ``BEGIN IMMEDIATE`` transaction.

    Every operation row it writes is reported to ``listings`` (see ``_ThreadListings``).
    """

    def _execute(self, query: str, params: Any = ()) -> int:
        return self._conn.execute(query, params).rowcount

    def _wrote(self, thread_id: str, operation_id: str) -> None:
        if self._listings is not None:
            self._listings.wrote(thread_id, operation_id)


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

    THREADS_TABLE = SQLITE.threads
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
        self._decoded = DecodedRows()
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
            if conn.execute(SQLITE_HAS_SCHEMA_TABLE).fetchone()[0] == 0:
                raise LedgerCorruptError(f"{self.path}: ledger file without a schema_version table")
            (version,) = conn.execute(SQLITE.schema_version).fetchone()
            return int(version or 0)
        if app_id == 0 and conn.execute(SQLITE_COUNT_OBJECTS).fetchone()[0] == 0:
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
                conn.execute(SQLITE.record_version, (target, now_ms))
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
