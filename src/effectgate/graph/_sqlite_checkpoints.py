"""The SQLite checkpoint store: what ``prune`` reads, deletes and vacuums in the file.

``SqliteCheckpoints`` is ``CheckpointStore`` (``effectgate.graph._checkpoint_stores``)
on LangGraph's ``SqliteSaver`` tables, ``checkpoints`` and ``writes``, with the
SQLite form of the late-writer guard (``GUARD_TABLE`` and a ``BEFORE INSERT``
trigger on each table). ``StepDurableSaver.delete_thread`` deletes through it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from effectgate.graph._checkpoint_stores import (
    GUARD_TABLE,
    CheckpointStore,
    Counted,
    Vacuum,
    disk_bytes,
    ledger_sizes,
    vacuum_file,
    vacuum_ledger,
)

__all__ = ["SqliteCheckpoints"]

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
"""The late-writer guard on SQLite: its table and one trigger on each checkpoint table."""


class SqliteCheckpoints(CheckpointStore):
    """The checkpoint file of a state directory (``SqliteSaver``: ``checkpoints``, ``writes``).

    Sizes are the bytes of the file and its WAL; ``vacuum`` folds the WAL into
    the file and VACUUMs it (``vacuum_file``). The ledger's half of both is
    the shared one (``ledger_sizes``, ``vacuum_ledger``).
    """

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

    def _file(self) -> Path | None:
        """The checkpoint file (``None`` for an in-memory database)."""
        with self.saver.cursor(transaction=False) as cur:
            (row,) = [r for r in cur.execute("PRAGMA database_list") if r[1] == "main"]
        return Path(row[2]) if row[2] else None

    def sizes(self) -> dict[str, int]:
        path = self._file()
        out = {} if path is None else {"checkpoints": disk_bytes(path)}
        return out | ledger_sizes(self.ledger)

    def vacuum(self, mode: Vacuum, wait_s: float) -> None:
        path = self._file()
        if path is not None:
            vacuum_file(path, mode, wait_s)
        vacuum_ledger(self.ledger, mode, wait_s)
