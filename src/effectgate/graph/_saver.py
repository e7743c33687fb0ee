"""``StepDurableSaver``: a ``SqliteSaver`` that fsyncs once per superstep, not once per write.

``SqliteSaver`` commits every ``put_writes`` (one per finished task, plus the
resume and interrupt writes) and every ``put`` (the checkpoint that ends a
superstep) on a connection at ``synchronous=FULL``: an fsync each, seven per
approved side effect in effectgate's graph (issue 8). This saver commits
``put_writes`` at ``synchronous=NORMAL`` and keeps ``put`` at ``FULL``.

Why that loses nothing that matters (SQLite, "Write-Ahead Logging" §
"Performance considerations", and the ``synchronous`` pragma documentation):

- A NORMAL commit in WAL mode is appended to the WAL and visible to every
  connection at once; it survives the death of the process (``kill -9``,
  ``os._exit``), because the bytes are in the operating system's page cache.
- Only an OS crash or power loss can lose it, and only until the next FULL
  commit on the same file: the WAL is appended in order, so the fsync of the
  superstep's checkpoint makes every earlier frame durable too.
- What such a loss costs is what LangGraph already does after any crash in the
  middle of a superstep: the tasks whose writes are lost run again. Their side
  effects cannot repeat, because an effect node claims its operation in the
  ledger (its own file, ``synchronous=FULL``) before it calls the tool and
  records the result before it returns; a re-run meets the ledger and reuses
  the receipt. A lost resume write asks the reviewer again; a lost interrupt
  write re-runs the review node, which raises the same interrupt.

The idea is the group commit of databases (one fsync for many log records);
here the group is a LangGraph superstep.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver

__all__ = ["StepDurableSaver"]


class StepDurableSaver(SqliteSaver):
    """``SqliteSaver`` whose task writes commit at ``NORMAL`` and checkpoints at ``FULL``.

    Args:
        conn: an SQLite connection (``check_same_thread=False``: LangGraph
            saves writes from its worker threads). The saver switches it to
            WAL (as ``SqliteSaver.setup`` does) and to ``synchronous=FULL``.

    Use it like ``SqliteSaver``; ``open_agent`` builds one. Every statement
    runs under the saver's lock, so the connection-wide ``synchronous``
    setting is changed and restored inside one write and no other statement
    sees it.
    """

    def __init__(self, conn: sqlite3.Connection, **kwargs: Any) -> None:
        super().__init__(conn, **kwargs)
        self._local = threading.local()

    def setup(self) -> None:
        """Create the tables (``SqliteSaver.setup``) and make commits FULL by default."""
        if self.is_setup:
            return
        super().setup()
        self.conn.execute("PRAGMA synchronous = FULL")

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        """``SqliteSaver.cursor``; a commit made for ``put_writes`` runs at ``NORMAL``."""
        normal = transaction and getattr(self._local, "writes", False)
        with self.lock:
            self.setup()
            if normal:
                self.conn.execute("PRAGMA synchronous = NORMAL")
            cur = self.conn.cursor()
            try:
                yield cur
            finally:
                try:
                    if transaction:
                        self.conn.commit()
                finally:
                    cur.close()
                    if normal:
                        self.conn.execute("PRAGMA synchronous = FULL")

    def head(self, thread_id: str, checkpoint_ns: str = "") -> tuple[str, tuple[Any, ...]] | None:
        """The latest checkpoint id of a thread and the writes attached to it, as stored.

        What ``get_tuple`` would say about the head, without deserializing
        anything: two indexed reads. Any new checkpoint, and any new or
        replaced write (resume and interrupt writes are replaced in place),
        changes the answer.

        Returns:
            ``(checkpoint_id, ((task_id, idx, channel, type, value), ...))``,
            or ``None`` for a thread without checkpoints.
        """
        with self.cursor(transaction=False) as cur:
            row = cur.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                "ORDER BY checkpoint_id DESC LIMIT 1",
                (thread_id, checkpoint_ns),
            ).fetchone()
            if row is None:
                return None
            writes = cur.execute(
                "SELECT task_id, idx, channel, type, value FROM writes WHERE thread_id = ? "
                "AND checkpoint_ns = ? AND checkpoint_id = ? ORDER BY task_id, idx",
                (thread_id, checkpoint_ns, row[0]),
            ).fetchall()
        return str(row[0]), tuple(tuple(w) for w in writes)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes (``SqliteSaver.put_writes``), committed without an fsync.

        They become durable with the next checkpoint ``put`` on this file; see
        the module docstring for why a loss before then is harmless.
        """
        self._local.writes = True
        try:
            super().put_writes(config, writes, task_id, task_path)
        finally:
            self._local.writes = False
