"""``StepDurablePostgresSaver``: LangGraph's ``PostgresSaver`` with ``StepDurableSaver``'s rule.

The rule is the one ``StepDurableSaver`` applies to SQLite: a task's writes
(``put_writes``: one per finished task, plus resume and interrupt writes) may
commit cheaply, a superstep's checkpoint (``put``) commits durably. On
PostgreSQL "cheaply" is ``SET LOCAL synchronous_commit = off`` for the
``put_writes`` transaction, and "durably" is ``synchronous_commit = on``, set
on every pooled connection whatever the server's default.

Why that loses nothing that matters (the PostgreSQL manual, "Asynchronous
Commit", 30.4, and ``synchronous_commit`` in 20.5):

- An asynchronous commit is visible to every session at once and survives the
  death of the worker process (``kill -9``): it is in the server's WAL
  buffers, which the WAL writer flushes within ``3 * wal_writer_delay``
  (600 ms by default).
- Only a crash of the database server can lose it, and only until the next
  synchronous commit on that server, which flushes the WAL up to its own
  record and so every earlier one. The superstep's checkpoint is such a
  commit; so is every ledger claim and result.
- What such a loss costs is what LangGraph already does after any crash in
  the middle of a superstep: the tasks whose writes are lost run again. Their
  side effects cannot repeat, because an effect node claims its operation in
  the ledger (a synchronous commit) before calling the tool and records the
  result before it returns; a re-run meets the ledger and reuses the receipt.
  A lost resume write asks the reviewer again; a lost interrupt write re-runs
  the review node, which raises the same interrupt.

LangGraph's async path runs each async method's sync twin in a worker
thread (``_AsyncInThreads``, shared with ``StepDurableSaver``), so the rule
holds there too. This saver keeps no memo of checkpoint lineage (``get_delta_channel_history``
is ``PostgresSaver``'s own, done by the server), but it has ``head()``, as
``StepDurableSaver`` does: the runner's resume shortcut (answer its own last
interrupts while the thread's head is unchanged) then skips reloading the
whole state. ``head()`` reads the database each time, in one statement, so a
head moved by any other worker is seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from effectgate.graph._saver import _UNREADABLE, _AsyncInThreads, _checked, _damaged

__all__ = ["StepDurablePostgresSaver", "open_postgres_saver"]

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
_SETUP_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext('effectgate.checkpoints.setup')) AS taken"
_SETUP_UNLOCK = "SELECT pg_advisory_unlock(hashtext('effectgate.checkpoints.setup'))"


class StepDurablePostgresSaver(_AsyncInThreads, PostgresSaver):
    """``PostgresSaver`` whose task writes commit asynchronously and checkpoints synchronously.

    LangGraph's async path (``graph.ainvoke``, ``graph.astream``) works on it
    too: each async method runs its sync twin in a worker thread, under the
    same rule and on the same pool (``StepDurableSaver`` does the same on
    SQLite), rather than on an ``AsyncPostgresSaver`` beside it, whose sync
    methods refuse a call from its event loop's thread and whose writes would
    follow upstream's commit rule, not this one.

    Args:
        conn: a ``psycopg_pool.ConnectionPool`` (or one connection) of
            ``autocommit=True``, ``row_factory=dict_row`` connections, as
            ``PostgresSaver`` requires; ``open_postgres_saver`` builds one.
        **kwargs: passed to ``PostgresSaver`` (e.g. ``serde``).
    """

    def __init__(self, conn: Any, **kwargs: Any) -> None:
        super().__init__(conn, **kwargs)
        self._local = threading.local()

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``PostgresSaver.put_writes`` in one transaction at ``synchronous_commit = off``."""
        self._local.writes = True
        try:
            super().put_writes(config, writes, task_id, task_path)
        finally:
            self._local.writes = False

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``PostgresSaver.get_tuple``; a row whose bytes cannot be read back is reported as damage.

        Raises:
            CheckpointCorruptError: LangGraph's deserializer failed on a stored
                row (its bytes or type tag damaged), naming the thread and the
                tables, instead of that deserializer's ``ValueError`` (e.g.
                ``invalid type Reserved``), ``TypeError`` or ``KeyError``.
        """
        try:
            return _checked(super().get_tuple(config), config, _WHERE)
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
        found = super().list(config, filter=filter, before=before, limit=limit)
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
            return super().get_delta_channel_history(config=config, channels=channels)
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
        with self._cursor() as cur:
            cur.execute(_HEAD_SQL, {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns})
            rows = cur.fetchall()
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
        with super()._cursor(pipeline=pipeline) as cur, cur.connection.transaction():
            cur.execute("SET LOCAL synchronous_commit = off")
            yield cur


_SETUP_POLL_S = 0.05
_SETUP_TIMEOUT_S = 120.0


def _lock_setup(conn: psycopg.Connection[Any]) -> None:
    """Take the setup lock, polling with ``pg_try_advisory_lock`` between idle pauses.

    Not ``pg_advisory_lock``: a session blocked in it sits in an open
    transaction, and ``PostgresSaver.setup``'s ``CREATE INDEX CONCURRENTLY``
    in the holder waits for every open transaction to end, so holder and
    waiter would deadlock (the server then fails one of them). Between polls
    this connection is idle (autocommit), which that statement does not wait for.

    Raises:
        psycopg.OperationalError: the lock stayed taken for ``_SETUP_TIMEOUT_S`` seconds.
    """
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    while True:
        row = conn.execute(_SETUP_TRY_LOCK).fetchone()  # a dict_row connection
        if row is not None and row["taken"]:
            return
        if time.monotonic() > deadline:
            raise psycopg.OperationalError(
                f"the checkpoint tables' setup lock stayed taken for {_SETUP_TIMEOUT_S:.0f} s"
            )
        time.sleep(_SETUP_POLL_S)


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET synchronous_commit = on")


@contextmanager
def open_postgres_saver(dsn: str, *, pool_size: int = 2) -> Iterator[StepDurablePostgresSaver]:
    """Open a ``StepDurablePostgresSaver`` on a pool, with its tables set up; close the pool after.

    ``PostgresSaver.setup`` (create or migrate the checkpoint tables) runs
    under an advisory lock, so workers starting together do not race on it;
    the lock is polled, never waited for in a transaction (``_lock_setup``).

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        pool_size: the most connections the pool opens (the saver serialises
            its calls under one lock, so a few suffice).

    Yields:
        The saver.

    Raises:
        psycopg.Error: the server cannot be reached or refuses the setup.
    """
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        _lock_setup(conn)
        try:
            PostgresSaver(conn).setup()
        finally:
            conn.execute(_SETUP_UNLOCK)
    pool: ConnectionPool[psycopg.Connection[DictRow]] = ConnectionPool(
        dsn,
        min_size=1,
        max_size=max(1, pool_size),
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        configure=_configure,
        open=False,
        name="effectgate-checkpoints",
    )
    pool.open(wait=True, timeout=30.0)
    try:
        yield StepDurablePostgresSaver(pool)
    finally:
        pool.close()
