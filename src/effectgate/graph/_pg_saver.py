"""``StepDurablePostgresSaver``: LangGraph's ``PostgresSaver``, every write durable, in one trip.

A task's writes (``put_writes``: one per finished task, plus resume and
interrupt writes) go out in one transaction, pipelined (BEGIN, the writes
and COMMIT in one round trip); a superstep's checkpoint (``put``) as
upstream does it. Both commit at ``synchronous_commit = on``, set on every
pooled connection whatever the server's default.

Task writes used to commit at ``synchronous_commit = off`` (the rule
``StepDurableSaver`` applies to SQLite, where only an OS crash can lose
such a commit). On PostgreSQL a crash of the database server loses an
asynchronous commit until the next WAL flush, and the worker that saw it
commit goes on: its connection is retried on the restarted server and its
next checkpoint is written on top of writes that no longer exist. The
messages channel is a delta channel (a checkpoint's history is rebuilt from
its ancestors' writes), so that checkpoint and every later one misses
them. The PostgreSQL fault campaign found 8 trials with broken checkpoint
histories in 946, each with a ``restart -m immediate`` (issue #32); lost
task writes are the likely cause, and
``tests/postgres/test_checkpoint_server_crash.py`` shows such a write lost.
The cost is one WAL flush per task write (the PostgreSQL manual,
"Asynchronous Commit", 30.4).

LangGraph's async path runs each async method's sync twin in a worker
thread (``_AsyncInThreads``, shared with ``StepDurableSaver``), so the rule
holds there too. This saver keeps no memo of checkpoint lineage (``get_delta_channel_history``
is ``PostgresSaver``'s own, done by the server), but it has ``head()``, as
``StepDurableSaver`` does: the runner's resume shortcut (answer its own last
interrupts while the thread's head is unchanged) then skips reloading the
whole state. ``head()`` reads the database each time, in one statement, so a
head moved by any other worker is seen.

Every statement effectgate sends to the PostgreSQL checkpoint tables is in
this module: the saver's head query, the tables' set-up and migrations
(``setup_checkpoint_tables``), and what retention counts, deletes, guards
and vacuums there (``PostgresCheckpoints``, a ``CheckpointStore``; its
SQLite twin is ``effectgate.graph._sqlite_checkpoints``).
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import sql as pgsql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from effectgate.errors import ConfigError
from effectgate.graph._checkpoint_stores import (
    GUARD_TABLE,
    CheckpointStore,
    Counted,
    Vacuum,
    ledger_sizes,
    vacuum_ledger,
)
from effectgate.graph._saver import _UNREADABLE, _AsyncInThreads, _checked, _damaged
from effectgate.ledger._postgres import check_connection, redacted, retry_transient
from effectgate.ledger._postgres_upkeep import pg_vacuum

__all__ = [
    "PG_GUARD_FUNCTION",
    "PostgresCheckpoints",
    "StepDurablePostgresSaver",
    "check_checkpoint_tables",
    "open_postgres_saver",
    "setup_checkpoint_tables",
]

_log = logging.getLogger(__name__)

# The latest checkpoint of a thread (the order PostgresSaver.get_tuple takes
# it in) and the writes attached to it, in one statement: one snapshot, so
# the id and its writes agree. A checkpoint without writes gives one row of NULLs.
_HEAD_SQL = """SELECT c.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.blob
FROM (SELECT checkpoint_id FROM checkpoints WHERE thread_id = %(thread_id)s
    AND checkpoint_ns = %(checkpoint_ns)s ORDER BY checkpoint_id DESC LIMIT 1) AS c
LEFT JOIN checkpoint_writes AS w ON w.thread_id = %(thread_id)s
    AND w.checkpoint_ns = %(checkpoint_ns)s AND w.checkpoint_id = c.checkpoint_id
ORDER BY w.task_id, w.idx"""
_WHERE = "the PostgreSQL tables checkpoints, checkpoint_blobs, checkpoint_writes"


class StepDurablePostgresSaver(_AsyncInThreads, PostgresSaver):
    """``PostgresSaver`` whose task writes commit asynchronously and checkpoints synchronously.

    LangGraph's async path (``graph.ainvoke``, ``graph.astream``) works on it
    too: each async method runs its sync twin in a worker thread, under the
    same rule and on the same pool (``StepDurableSaver`` does the same on
    SQLite), rather than on an ``AsyncPostgresSaver`` beside it, whose sync
    methods refuse a call from its event loop's thread and whose writes would
    follow upstream's commit rule, not this one.

    A transient database error (``is_transient``: a terminated backend, a
    restart, a lost connection) is retried on a fresh pooled connection,
    with full-jitter backoff, for ``retry_for`` seconds
    (``retry_transient``); then ``DatabaseUnavailableError`` (exit 75). Every
    call may run again safely: reads, and LangGraph's writes, which are
    upserts of rows keyed by thread, checkpoint and task (a write that
    committed before its answer was lost writes the same row again).

    Args:
        conn: a ``psycopg_pool.ConnectionPool`` (or one connection) of
            ``autocommit=True``, ``row_factory=dict_row`` connections, as
            ``PostgresSaver`` requires; ``open_postgres_saver`` builds one.
        retry_for: seconds of retrying a transient error (``None``: the
            ledger's default, ``EFFECTGATE_DB_RETRY_S`` or 5 s).
        where: the server named in messages (never a password).
        **kwargs: passed to ``PostgresSaver`` (e.g. ``serde``).
    """

    def __init__(
        self, conn: Any, *, retry_for: float | None = None, where: str = "", **kwargs: Any
    ) -> None:
        from effectgate.ledger._postgres import _retry_budget

        super().__init__(conn, **kwargs)
        self._local = threading.local()
        self._retry_s = _retry_budget(retry_for)
        self._where = f"{where} (checkpoints)".strip()

    def _retrying(self, call: Any) -> Any:
        return retry_transient(call, where=self._where, budget_s=self._retry_s)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Any,
        metadata: Any,
        new_versions: Any,
    ) -> RunnableConfig:
        """``PostgresSaver.put``, retried on a transient error (its upserts repeat harmlessly)."""
        return self._retrying(  # type: ignore[no-any-return]
            lambda: super(StepDurablePostgresSaver, self).put(
                config, checkpoint, metadata, new_versions
            )
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``PostgresSaver.put_writes`` in one durable transaction (one round trip, pipelined)."""

        def put() -> None:
            self._local.writes = True
            try:
                super(StepDurablePostgresSaver, self).put_writes(config, writes, task_id, task_path)
            finally:
                self._local.writes = False

        self._retrying(put)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread for good: its rows, and a late writer's next write (the guard).

        As ``StepDurableSaver.delete_thread``: the thread is recorded in the
        late-writer guard, so a run still at work cannot bring it back.
        Retried on a transient error (recording the guard and deleting the
        rows again is harmless).
        """
        self._retrying(
            lambda: PostgresCheckpoints(self, None).delete_thread(  # type: ignore[arg-type]
                thread_id, datetime.now(UTC)
            )
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``PostgresSaver.get_tuple``; a row whose bytes cannot be read back is reported as damage.

        Raises:
            CheckpointCorruptError: LangGraph's deserializer failed on a stored
                row (its bytes or type tag damaged), naming the thread and the
                tables, instead of that deserializer's ``ValueError`` (e.g.
                ``invalid type Reserved``), ``TypeError`` or ``KeyError``.
        """
        try:
            found = self._retrying(lambda: super(StepDurablePostgresSaver, self).get_tuple(config))
            return _checked(found, config, _WHERE)
        except _UNREADABLE as exc:
            raise _damaged(config, exc, _WHERE) from exc

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """``PostgresSaver.list``; a row whose bytes cannot be read back is reported as damage.

        Raises:
            CheckpointCorruptError: as ``get_tuple``.
        """

        # Upstream reads every row before it yields the first: read them all
        # here, so a transient error is retried before anything was handed out.
        def read() -> builtins.list[CheckpointTuple]:
            rows = PostgresSaver.list(self, config, filter=filter, before=before, limit=limit)
            return [*rows]

        try:
            found = self._retrying(read)
        except _UNREADABLE as exc:
            raise _damaged(config, exc, _WHERE) from exc
        try:
            for item in found:
                _checked(item, config, _WHERE)
                yield item
        except _UNREADABLE as exc:
            raise _damaged(config, exc, _WHERE) from exc

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """``PostgresSaver.get_delta_channel_history``; damaged bytes are reported as damage.

        Raises:
            CheckpointCorruptError: as ``get_tuple`` (a write's blob, e.g. of
                ``messages``, in ``checkpoint_writes`` cannot be read back).
        """
        try:
            return self._retrying(  # type: ignore[no-any-return]
                lambda: super(StepDurablePostgresSaver, self).get_delta_channel_history(
                    config=config, channels=channels
                )
            )
        except _UNREADABLE as exc:
            raise _damaged(config, exc, _WHERE) from exc

    def head(self, thread_id: str, checkpoint_ns: str = "") -> tuple[str, tuple[Any, ...]] | None:
        """The latest checkpoint id of a thread and the writes attached to it, as stored.

        ``StepDurableSaver.head`` on PostgreSQL: what ``get_tuple`` would say
        about the head, without deserializing anything, in one statement (one
        round trip). Any new checkpoint, and any new or replaced write (resume
        and interrupt writes are replaced in place), changes the answer.

        Returns:
            ``(checkpoint_id, ((task_id, idx, channel, type, blob), ...))``,
            writes ordered by ``(task_id, idx)``, or ``None`` for a thread
            without checkpoints.
        """

        def read() -> list[DictRow]:
            with self._cursor() as cur:
                cur.execute(_HEAD_SQL, {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns})
                return cur.fetchall()

        rows = self._retrying(read)
        if not rows:
            return None
        writes = tuple(
            (r["task_id"], r["idx"], r["channel"], r["type"], bytes(r["blob"]))
            for r in rows
            if r["task_id"] is not None
        )
        return str(rows[0]["checkpoint_id"]), writes

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[psycopg.Cursor[DictRow]]:
        if not getattr(self._local, "writes", False):
            with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        with super()._cursor(pipeline=pipeline) as cur:
            if cur.connection._pipeline is None:
                with cur.connection.transaction():
                    yield cur
                return
            # In the pipeline upstream opened: BEGIN, its writes and
            # COMMIT go out together and come back at its one sync (one round
            # trip). ``Connection.transaction()`` here would nest pipelines,
            # whose every enter and exit syncs (four more round trips). If a
            # statement fails, the server skips the rest (COMMIT included) up
            # to the sync and the transaction is rolled back: the pool rolls
            # back a connection handed back inside a transaction.
            cur.execute("BEGIN")
            yield cur
            cur.execute("COMMIT")


_SETUP_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtext('effectgate.checkpoints:' "
    "|| COALESCE(current_schema(), '')))"
)
_TABLES = ("checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes")
_COLUMNS = {
    "checkpoint_migrations": {"v"},
    "checkpoints": {"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint", "metadata"},
    "checkpoint_blobs": {"thread_id", "checkpoint_ns", "channel", "version", "type", "blob"},
    "checkpoint_writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "blob"},
}
"""The columns LangGraph's checkpoint tables have had since their first version."""
_EXISTING_COLUMNS = (
    "SELECT table_name AS t, column_name AS c FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = ANY(%s)"
)
_INVALID_INDEXES = (
    "SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND NOT i.indisvalid AND t.relname = ANY(%s)"
)


def check_checkpoint_tables(conn: psycopg.Connection[Any]) -> None:
    """Refuse tables with the checkpoint tables' names that LangGraph did not make.

    Run before anything is created (``open_postgres_stores`` calls it before
    the ledger is opened), so a refused schema is left as it was.

    Raises:
        ConfigError: such a table lacks a column LangGraph's has, or a
            checkpoint table exists without ``checkpoint_migrations``.
    """
    found: dict[str, set[str]] = {}
    for row in conn.execute(_EXISTING_COLUMNS, (list(_TABLES),)).fetchall():
        found.setdefault(row["t"] if isinstance(row, dict) else row[0], set()).add(
            row["c"] if isinstance(row, dict) else row[1]
        )
    for table, columns in found.items():
        missing = _COLUMNS[table] - columns
        if missing:
            raise ConfigError(
                f"a table {table!r} that LangGraph's checkpointer did not make is in this "
                f"schema (no column {', '.join(sorted(missing))}); use another schema "
                "(search_path) or database"
            )
    if found and "checkpoint_migrations" not in found:
        raise ConfigError(
            f"checkpoint tables ({', '.join(sorted(found))}) without checkpoint_migrations are "
            "in this schema; they were not made by LangGraph's checkpointer: use another schema"
        )


def setup_checkpoint_tables(conn: psycopg.Connection[Any]) -> list[str]:
    """Create or migrate LangGraph's checkpoint tables in one transaction; rebuild invalid indexes.

    ``PostgresSaver.setup`` runs each migration on its own, its indexes as
    ``CREATE INDEX CONCURRENTLY IF NOT EXISTS``: a start-up killed during one
    leaves an invalid index that every later start skips while recording the
    migration done. Here every pending migration (upstream's statements,
    indexes built without ``CONCURRENTLY``) and its ``checkpoint_migrations``
    row commit together, under a transaction-scoped advisory lock (it works
    behind PgBouncer in transaction mode; workers starting together wait
    for the first and then find nothing to do), so a kill at any moment
    leaves the tables at one recorded version. An index of these tables left
    invalid by an earlier build is rebuilt (``REINDEX``) in that transaction.

    Args:
        conn: an autocommit connection (any row factory).

    Returns:
        The invalid indexes that were rebuilt (usually none).

    Raises:
        ConfigError: the tables are not LangGraph's (``check_checkpoint_tables``),
            or ``checkpoint_migrations`` records a version newer than this
            build's LangGraph knows.
    """
    migrations = PostgresSaver.MIGRATIONS
    with conn.transaction():
        conn.execute(_SETUP_LOCK)
        check_checkpoint_tables(conn)
        conn.execute(migrations[0])
        row = conn.execute("SELECT MAX(v) FROM checkpoint_migrations").fetchone()
        value = (
            None if row is None else (next(iter(row.values())) if isinstance(row, dict) else row[0])
        )
        version = -1 if value is None else int(value)
        if version >= len(migrations):
            raise ConfigError(
                f"the checkpoint tables are at migration {version}, newer than this "
                f"installation knows ({len(migrations) - 1}): a newer effectgate / "
                "langgraph-checkpoint-postgres migrated them; upgrade this one"
            )
        for v in range(version + 1, len(migrations)):
            conn.execute(migrations[v].replace("CONCURRENTLY ", ""))
            conn.execute("INSERT INTO checkpoint_migrations (v) VALUES (%s)", (v,))
        rebuilt = []
        for row in conn.execute(_INVALID_INDEXES, (list(_TABLES),)).fetchall():
            name = row["name"] if isinstance(row, dict) else row[0]
            conn.execute(pgsql.SQL("REINDEX INDEX {}").format(pgsql.Identifier(name)))
            rebuilt.append(str(name))
    return rebuilt


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET synchronous_commit = on")


@contextmanager
def open_postgres_saver(
    dsn: str, *, pool_size: int = 2, retry_for: float | None = None
) -> Iterator[StepDurablePostgresSaver]:
    """Open a ``StepDurablePostgresSaver`` on a pool, with its tables set up; close the pool after.

    The checkpoint tables are created or migrated first, in one transaction
    (``setup_checkpoint_tables``), so workers starting together do not race on it.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        pool_size: the most connections the pool opens (the saver serialises
            its calls under one lock, so a few suffice).
        retry_for: seconds of retrying a transient error (see the saver).

    Yields:
        The saver.

    Raises:
        psycopg.Error: the server cannot be reached or refuses the setup (a refused
            login or database at once: ``connection_refusal``; else after the retries).
    """
    from effectgate.ledger._postgres import _retry_budget, retry_transient

    def setup() -> None:
        with psycopg.connect(
            dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None
        ) as conn:
            for name in setup_checkpoint_tables(conn):
                _log.warning(
                    "checkpoint index %s was invalid (a start-up killed mid-build): rebuilt", name
                )

    retry_s = _retry_budget(retry_for)
    # Opened after the ledger, on the same server: a failure to connect now is
    # the server restarting (the set-up is one transaction, safe to repeat).
    retry_transient(setup, where=redacted(dsn), budget_s=retry_s)
    pool: ConnectionPool[psycopg.Connection[DictRow]] = ConnectionPool(
        dsn,
        min_size=1,
        max_size=max(1, pool_size),
        # No server-side prepared statements (upstream's own choice is to
        # prepare every one): behind a transaction pooler the next statement
        # may meet another server session, which never saw it prepared.
        kwargs={"autocommit": True, "prepare_threshold": None, "row_factory": dict_row},
        configure=_configure,
        check=check_connection,
        timeout=max(1.0, retry_s),
        reconnect_timeout=max(1.0, retry_s),
        open=False,
        name="effectgate-checkpoints",
    )
    pool.open(wait=True, timeout=30.0)
    try:
        yield StepDurablePostgresSaver(pool, retry_for=retry_s, where=redacted(dsn))
    finally:
        pool.close()


# ------------------------------------------------------------------ retention

PG_GUARD_FUNCTION = "effectgate_refuse_deleted_thread"
"""The trigger function, in the checkpoint database, behind the late-writer guard."""

_PG_CHECKPOINT_TABLES = ("checkpoints", "checkpoint_writes", "checkpoint_blobs")
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


class PostgresCheckpoints(CheckpointStore):
    """The checkpoint tables of a ``PostgresSaver`` (``checkpoints``, ``_writes``, ``_blobs``).

    Sizes are ``pg_total_relation_size`` (table, TOAST and indexes) of the
    tables in the connection's schema. ``vacuum="full"`` ends with ``VACUUM
    (FULL, ANALYZE)`` of the touched tables (it rewrites them and gives the
    space back to the operating system, under an exclusive lock while it
    runs); ``"incremental"`` with ``VACUUM (ANALYZE)`` (the space is reused by
    later rows, no exclusive lock); ``"none"`` with nothing.
    """

    @contextmanager
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
        return {"checkpoints": int(total)} | ledger_sizes(self.ledger)

    def vacuum(self, mode: Vacuum, wait_s: float) -> None:
        if mode != "none":
            with self._conn() as conn:
                pg_vacuum(conn, mode, _PG_CHECKPOINT_TABLES, wait_s)
        vacuum_ledger(self.ledger, mode, wait_s)
