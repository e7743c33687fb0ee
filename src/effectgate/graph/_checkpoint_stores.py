"""Where ``prune`` finds a checkpoint database's rows, sizes and guard: SQLite and PostgreSQL.

``CheckpointStore`` is what the prune (``effectgate.graph._prune``) asks of a
checkpoint database: its threads and lineages, counts, deletes, the
late-writer guard of a deleted thread (a trigger that refuses any new
checkpoint or write of it), sizes and VACUUM. ``_SqliteCheckpoints`` and
``_PostgresCheckpoints`` are the two dialects; the ledger's own sizes and
VACUUM on PostgreSQL are here too, as the prune reports and compacts both.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from effectgate.errors import ConfigError
from effectgate.ledger import Ledger

__all__ = [
    "GUARD_TABLE",
    "CheckpointStore",
    "Counted",
    "Vacuum",
    "checkpoint_store",
    "deleted_for_good",
    "is_lock_timeout",
]

Vacuum = Literal["full", "incremental", "none"]

GUARD_TABLE = "effectgate_deleted_threads"
"""The table, in the checkpoint file, of threads no checkpoint or write may be stored for."""

_GUARD_SQL = (
    f"CREATE TABLE IF NOT EXISTS {GUARD_TABLE} "
    "(thread_id TEXT PRIMARY KEY, deleted_at TEXT NOT NULL)",
    *(
        f"CREATE TRIGGER IF NOT EXISTS {GUARD_TABLE}_{table} BEFORE INSERT ON {table} "
        f"WHEN EXISTS (SELECT 1 FROM {GUARD_TABLE} d WHERE d.thread_id = NEW.thread_id) "
        "BEGIN SELECT RAISE(ABORT, 'effectgate: this thread was deleted'); END"
        for table in ("checkpoints", "writes")
    ),
)


Counted = tuple[int, int, int]
"""Checkpoints, writes, and the bytes of every row counted (checkpoints, writes, blobs)."""


class CheckpointStore:
    """What ``prune`` needs of a checkpoint database, for SQLite and for PostgreSQL."""

    def __init__(self, saver: Any, ledger: Ledger) -> None:
        self.saver = saver
        self.ledger = ledger

    def threads(self) -> list[str]:
        """Every thread that has a checkpoint."""
        raise NotImplementedError

    def groups(self) -> list[tuple[str, str]]:
        """Every (thread, namespace) that has a checkpoint."""
        raise NotImplementedError

    def lineage(self, thread_id: str, ns: str) -> list[tuple[str, str | None]]:
        """``(checkpoint_id, parent_checkpoint_id)`` of one thread and namespace, newest first."""
        raise NotImplementedError

    def self_contained(self, thread_id: str, ns: str, cid: str, channels: set[str]) -> set[str]:
        """Which of ``channels`` this checkpoint holds in full, or never had (nothing to replay)."""
        raise NotImplementedError

    def count_thread(self, thread_id: str) -> Counted:
        """What deleting the thread removes."""
        raise NotImplementedError

    def delete_thread(self, thread_id: str, at: datetime) -> None:
        """Guard the thread against late writes, then delete all its rows (one transaction)."""
        raise NotImplementedError

    def drop(self, thread_id: str, ns: str, ids: Sequence[str], *, dry_run: bool) -> Counted:
        """Delete these checkpoints of one thread and namespace, with their writes."""
        raise NotImplementedError

    def sizes(self) -> dict[str, int]:
        """Bytes on disk, by ``checkpoints`` and ``ledger``."""
        raise NotImplementedError

    def vacuum(self, mode: Vacuum, wait_s: float) -> None:
        """Give the space of the deleted rows back (``mode``), waiting ``wait_s`` for locks."""
        raise NotImplementedError


def deleted_for_good(saver: Any, thread_id: str) -> None:
    """Delete ``thread_id``'s checkpoints and writes and record it in the late-writer guard.

    The checkpointer's own ``delete_thread`` (the LangGraph server's
    ``threads.delete``) goes through here, as ``prune`` does: a run of the
    thread still at work cannot put a checkpoint or a write for it afterwards
    (the guard's trigger refuses it). ``saver``: an SQLite or PostgreSQL saver.

    Raises:
        ConfigError: ``saver`` is neither.
    """
    from datetime import UTC

    checkpoint_store(saver, None).delete_thread(thread_id, datetime.now(UTC))  # type: ignore[arg-type]


def checkpoint_store(saver: Any, ledger: Ledger) -> CheckpointStore:
    """The store of ``saver``'s checkpoints: SQLite or PostgreSQL.

    Raises:
        ConfigError: ``saver`` is neither an SQLite nor a PostgreSQL saver.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    if isinstance(saver, SqliteSaver):
        return _SqliteCheckpoints(saver, ledger)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:  # pragma: no cover - without the postgres extra
        PostgresSaver = None  # type: ignore[assignment,misc]
    if PostgresSaver is not None and isinstance(saver, PostgresSaver):
        return _PostgresCheckpoints(saver, ledger)
    raise ConfigError(
        "prune needs an SQLite (StepDurableSaver) or PostgreSQL (StepDurablePostgresSaver) "
        f"checkpointer, not {type(saver).__name__}"
    )


class _SqliteCheckpoints(CheckpointStore):
    """The checkpoint file of a state directory (``SqliteSaver``)."""

    def threads(self) -> list[str]:
        with self.saver.cursor(transaction=False) as cur:
            return [r[0] for r in cur.execute("SELECT DISTINCT thread_id FROM checkpoints")]

    def groups(self) -> list[tuple[str, str]]:
        with self.saver.cursor(transaction=False) as cur:
            rows = cur.execute("SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints")
            return [(r[0], r[1]) for r in rows.fetchall()]

    def lineage(self, thread_id: str, ns: str) -> list[tuple[str, str | None]]:
        with self.saver.cursor(transaction=False) as cur:
            rows = cur.execute(
                "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? ORDER BY checkpoint_id DESC",
                (thread_id, ns),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def self_contained(self, thread_id: str, ns: str, cid: str, channels: set[str]) -> set[str]:
        if not channels:
            return set()
        with self.saver.cursor(transaction=False) as cur:
            row = cur.execute(
                "SELECT type, checkpoint FROM checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (thread_id, ns, cid),
            ).fetchone()
        if row is None:
            return set()
        ckpt = self.saver.serde.loads_typed((row[0], row[1]))
        values = ckpt.get("channel_values") or {}
        versions = ckpt.get("channel_versions") or {}
        return {ch for ch in channels if ch in values or ch not in versions}

    def _count(self, where: str, params: Sequence[Any]) -> Counted:
        with self.saver.cursor(transaction=False) as cur:
            n_c, b_c = cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) "
                f"FROM checkpoints WHERE {where}",
                params,
            ).fetchone()
            n_w, b_w = cur.execute(
                f"SELECT COUNT(*), COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE {where}",
                params,
            ).fetchone()
        return int(n_c), int(n_w), int(b_c) + int(b_w)

    def count_thread(self, thread_id: str) -> Counted:
        return self._count("thread_id = ?", (thread_id,))

    def delete_thread(self, thread_id: str, at: datetime) -> None:
        with self.saver.cursor() as cur:
            for sql in _GUARD_SQL:
                cur.execute(sql)
            cur.execute(
                f"INSERT OR IGNORE INTO {GUARD_TABLE} (thread_id, deleted_at) VALUES (?, ?)",
                (thread_id, at.isoformat()),
            )
            cur.execute("DELETE FROM writes WHERE thread_id = ?", (thread_id,))
            cur.execute("DELETE FROM checkpoints WHERE thread_id = ?", (thread_id,))

    def drop(self, thread_id: str, ns: str, ids: Sequence[str], *, dry_run: bool) -> Counted:
        marks = ", ".join("?" * len(ids))
        where = f"thread_id = ? AND checkpoint_ns = ? AND checkpoint_id IN ({marks})"
        params = (thread_id, ns, *ids)
        counted = self._count(where, params)
        if not dry_run:
            with self.saver.cursor() as cur:
                cur.execute(f"DELETE FROM writes WHERE {where}", params)
                cur.execute(f"DELETE FROM checkpoints WHERE {where}", params)
        return counted

    def _files(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        with self.saver.cursor(transaction=False) as cur:
            (row,) = [r for r in cur.execute("PRAGMA database_list") if r[1] == "main"]
        if row[2]:
            out["checkpoints"] = Path(row[2])
        path = getattr(self.ledger, "path", None)
        if isinstance(path, Path):
            out["ledger"] = path
        return out

    def sizes(self) -> dict[str, int]:
        out = {name: _disk_bytes(path) for name, path in self._files().items()}
        ledger_sizes = _postgres_ledger_sizes(self.ledger)
        return out | ledger_sizes

    def vacuum(self, mode: Vacuum, wait_s: float) -> None:
        for path in self._files().values():
            _vacuum(path, mode, wait_s)
        _vacuum_postgres_ledger(self.ledger, mode, wait_s)


def _disk_bytes(path: Path) -> int:
    total = 0
    for p in (path, Path(f"{path}-wal")):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(p).st_size
    return total


# ------------------------------------------------------------------ PostgreSQL

PG_GUARD_FUNCTION = "effectgate_refuse_deleted_thread"
"""The trigger function, in the checkpoint database, behind the late-writer guard."""

_PG_CHECKPOINT_TABLES = ("checkpoints", "checkpoint_writes", "checkpoint_blobs")
_PG_LEDGER_TABLES = (
    "ledger_operations",
    "ledger_approvals",
    "ledger_events",
    "ledger_operation_tombstones",
    "ledger_thread_tombstones",
)
"""The ledger tables a prune deletes from or writes to (VACUUMed after it)."""

_PG_GUARD_SQL = (
    "SELECT pg_advisory_xact_lock(hashtext('effectgate.prune.guard'))",
    f"CREATE TABLE IF NOT EXISTS {GUARD_TABLE} "
    "(thread_id text PRIMARY KEY, deleted_at text NOT NULL)",
    f"""CREATE OR REPLACE FUNCTION {PG_GUARD_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM {GUARD_TABLE} d WHERE d.thread_id = NEW.thread_id) THEN
                RAISE EXCEPTION 'effectgate: this thread was deleted (%)', NEW.thread_id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$""",
    *(
        f"CREATE OR REPLACE TRIGGER {GUARD_TABLE}_{table} BEFORE INSERT ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {PG_GUARD_FUNCTION}()"
        for table in _PG_CHECKPOINT_TABLES
    ),
)
"""The late-writer guard on PostgreSQL: the SQLite triggers' equivalent, on all three tables.

A ``BEFORE INSERT`` row trigger also fires for ``INSERT ... ON CONFLICT DO
UPDATE``, the upsert ``PostgresSaver`` writes with.
"""

_PG_RELATION_BYTES = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname = ANY(%s)"
)


class _PostgresCheckpoints(CheckpointStore):
    """The checkpoint tables of a ``PostgresSaver`` (``checkpoints``, ``_writes``, ``_blobs``).

    Sizes are ``pg_total_relation_size`` (table, TOAST and indexes) of the
    tables in the connection's schema. ``vacuum="full"`` ends with ``VACUUM
    (FULL, ANALYZE)`` of the touched tables (it rewrites them and gives the
    space back to the operating system, under an exclusive lock while it
    runs); ``"incremental"`` with ``VACUUM (ANALYZE)`` (the space is reused by
    later rows, no exclusive lock); ``"none"`` with nothing.
    """

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        conn = self.saver.conn
        if hasattr(conn, "connection"):  # a pool
            with conn.connection() as own:
                yield own
        else:
            with self.saver.lock:
                yield conn

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        from psycopg.rows import tuple_row

        with self._conn() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def threads(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT DISTINCT thread_id FROM checkpoints")]

    def groups(self) -> list[tuple[str, str]]:
        rows = self._rows("SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints")
        return [(r[0], r[1]) for r in rows]

    def lineage(self, thread_id: str, ns: str) -> list[tuple[str, str | None]]:
        rows = self._rows(
            "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints "
            "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC",
            (thread_id, ns),
        )
        return [(r[0], r[1]) for r in rows]

    def self_contained(self, thread_id: str, ns: str, cid: str, channels: set[str]) -> set[str]:
        # PostgresSaver keeps a primitive value, and the marker of a delta
        # channel's snapshot, inline; other values in a blob at the channel's
        # version. A delta channel's plain step has neither: its reads replay.
        if not channels:
            return set()
        found = self._rows(
            "SELECT c.checkpoint -> 'channel_values', c.checkpoint -> 'channel_versions', "
            "ARRAY(SELECT b.channel FROM checkpoint_blobs b "
            "      WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns "
            "      AND b.channel = ANY(%s) AND b.type <> 'empty' "
            "      AND b.version = c.checkpoint -> 'channel_versions' ->> b.channel) "
            "FROM checkpoints c "
            "WHERE c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = %s",
            (sorted(channels), thread_id, ns, cid),
        )
        if not found:
            return set()
        values, versions, blobs = found[0]
        values, versions = values or {}, versions or {}
        return {ch for ch in channels if ch in values or ch in blobs or ch not in versions}

    def _count(self, thread_id: str, ns: str | None, ids: Sequence[str] | None) -> Counted:
        where = "thread_id = %s"
        params: list[Any] = [thread_id]
        if ns is not None and ids is not None:
            where += " AND checkpoint_ns = %s AND checkpoint_id = ANY(%s)"
            params += [ns, list(ids)]
        ((n_c, b_c),) = self._rows(
            "SELECT COUNT(*), COALESCE(SUM(pg_column_size(checkpoint) "
            f"+ pg_column_size(metadata)), 0) FROM checkpoints WHERE {where}",
            params,
        )
        ((n_w, b_w),) = self._rows(
            "SELECT COUNT(*), COALESCE(SUM(octet_length(blob)), 0) FROM checkpoint_writes "
            f"WHERE {where}",
            params,
        )
        return int(n_c), int(n_w), int(b_c) + int(b_w)

    def count_thread(self, thread_id: str) -> Counted:
        n_c, n_w, b = self._count(thread_id, None, None)
        ((b_b,),) = self._rows(
            "SELECT COALESCE(SUM(octet_length(blob)), 0) FROM checkpoint_blobs "
            "WHERE thread_id = %s",
            (thread_id,),
        )
        return n_c, n_w, b + int(b_b)

    _guarded = False
    """Whether this prune has set up the guard (once: it is DDL, and locks each table)."""

    def delete_thread(self, thread_id: str, at: datetime) -> None:
        with self._conn() as conn, conn.transaction():
            if not self._guarded:
                for sql in _PG_GUARD_SQL:
                    conn.execute(sql)
            conn.execute(
                f"INSERT INTO {GUARD_TABLE} (thread_id, deleted_at) VALUES (%s, %s) "
                "ON CONFLICT (thread_id) DO NOTHING",
                (thread_id, at.isoformat()),
            )
            for table in _PG_CHECKPOINT_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))
        self._guarded = True

    def drop(self, thread_id: str, ns: str, ids: Sequence[str], *, dry_run: bool) -> Counted:
        n_c, n_w, b = self._count(thread_id, ns, ids)
        # Blobs are shared by version: one goes when no kept checkpoint of the
        # namespace names it in its channel_versions.
        garbage = (
            "SELECT b.channel, b.version, COALESCE(octet_length(b.blob), 0) "
            "FROM checkpoint_blobs b WHERE b.thread_id = %s AND b.checkpoint_ns = %s "
            "AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id "
            "  AND c.checkpoint_ns = b.checkpoint_ns AND c.checkpoint_id = ANY(%s) "
            "  AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version) "
            "AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id "
            "  AND c.checkpoint_ns = b.checkpoint_ns AND c.checkpoint_id <> ALL(%s) "
            "  AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)"
        )
        params = (thread_id, ns, list(ids), list(ids))
        if dry_run:
            freed = self._rows(garbage, params)
            return n_c, n_w, b + sum(int(r[2]) for r in freed)
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            from psycopg.rows import tuple_row

            cur.row_factory = tuple_row  # type: ignore[assignment]
            cur.execute(garbage, params)
            freed = list(cur.fetchall())
            for channel, version, _ in freed:
                cur.execute(
                    "DELETE FROM checkpoint_blobs WHERE thread_id = %s AND checkpoint_ns = %s "
                    "AND channel = %s AND version = %s",
                    (thread_id, ns, channel, version),
                )
            cur.execute(
                "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = %s "
                "AND checkpoint_id = ANY(%s)",
                (thread_id, ns, list(ids)),
            )
            cur.execute(
                "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s "
                "AND checkpoint_id = ANY(%s)",
                (thread_id, ns, list(ids)),
            )
        return n_c, n_w, b + sum(int(r[2]) for r in freed)

    def sizes(self) -> dict[str, int]:
        ((total,),) = self._rows(_PG_RELATION_BYTES, ([*_PG_CHECKPOINT_TABLES, GUARD_TABLE],))
        out = {"checkpoints": int(total)}
        path = getattr(self.ledger, "path", None)
        if isinstance(path, Path):
            out["ledger"] = _disk_bytes(path)
        return out | _postgres_ledger_sizes(self.ledger)

    def vacuum(self, mode: Vacuum, wait_s: float) -> None:
        if mode != "none":
            with self._conn() as conn:
                _pg_vacuum(conn, mode, _PG_CHECKPOINT_TABLES, wait_s)
        path = getattr(self.ledger, "path", None)
        if isinstance(path, Path):
            _vacuum(path, mode, wait_s)
        _vacuum_postgres_ledger(self.ledger, mode, wait_s)


def _pg_vacuum_options(mode: Vacuum) -> str:
    return "FULL, ANALYZE" if mode == "full" else "ANALYZE"


def _pg_vacuum(conn: Any, mode: Vacuum, tables: Sequence[str], wait_s: float) -> None:
    """VACUUM ``tables`` with a bounded ``lock_timeout``, restored afterwards.

    ``VACUUM FULL`` needs an ACCESS EXCLUSIVE lock: unbounded, it would wait
    behind any open transaction on the table, and every worker would then
    queue behind its own lock request. ``lock_timeout`` bounds that wait
    (PostgreSQL documentation, "Client Connection Defaults"); past it the
    server raises ``lock_not_available`` (SQLSTATE 55P03).
    """
    conn.execute(f"SET lock_timeout = '{max(1, round(wait_s * 1000))}ms'")
    try:
        conn.execute(f"VACUUM ({_pg_vacuum_options(mode)}) {', '.join(tables)}")
    finally:
        conn.execute("RESET lock_timeout")


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that timed out (SQLite busy/locked, PostgreSQL 55P03)."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    return getattr(exc, "sqlstate", None) == "55P03"


@contextlib.contextmanager
def _postgres_ledger_conn(ledger: Ledger) -> Iterator[Any | None]:
    """A connection to a PostgreSQL ledger's schema, or ``None`` for another ledger."""
    dsn = getattr(ledger.store, "dsn", None)
    if not isinstance(dsn, str):
        yield None
        return
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        schema = getattr(ledger.store, "schema", None)
        if schema:
            conn.execute(pgsql.SQL("SET search_path = {}").format(pgsql.Identifier(schema)))
        yield conn


def _postgres_ledger_sizes(ledger: Ledger) -> dict[str, int]:
    """``{"ledger": bytes}`` of a PostgreSQL ledger's tables; ``{}`` for another ledger."""
    with _postgres_ledger_conn(ledger) as conn:
        if conn is None:
            return {}
        (total,) = conn.execute(
            _PG_RELATION_BYTES.replace("c.relname = ANY(%s)", "c.relname LIKE %s"),
            ("ledger\\_%",),
        ).fetchone()
        return {"ledger": int(total)}


def _vacuum_postgres_ledger(ledger: Ledger, mode: Vacuum, wait_s: float) -> None:
    """VACUUM the ledger tables a prune touched, for a PostgreSQL ledger."""
    if mode == "none":
        return
    with _postgres_ledger_conn(ledger) as conn:
        if conn is not None:
            _pg_vacuum(conn, mode, _PG_LEDGER_TABLES, wait_s)


def _vacuum(path: Path, mode: Vacuum, wait_s: float) -> None:
    """Checkpoint the WAL into the file, VACUUM, and truncate the WAL (busy timeout ``wait_s``)."""
    own = sqlite3.connect(path, isolation_level=None, timeout=wait_s)
    try:
        own.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if mode == "full":
            own.execute("VACUUM")
        elif mode == "incremental":
            (auto,) = own.execute("PRAGMA auto_vacuum").fetchone()
            if auto != 2:
                own.execute("PRAGMA auto_vacuum = INCREMENTAL")
                own.execute("VACUUM")  # the switch takes effect with a full VACUUM
            else:
                own.execute("PRAGMA incremental_vacuum")
        own.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        own.close()
