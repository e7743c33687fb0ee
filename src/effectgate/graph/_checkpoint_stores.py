"""What ``prune`` asks of a checkpoint database, and what both dialects share.

``CheckpointStore`` is what the prune (``effectgate.graph._prune``) asks of a
checkpoint database: its threads and lineages, counts, deletes, the
late-writer guard of a deleted thread (a trigger that refuses any new
checkpoint or write of it), sizes and VACUUM. The dialects are
``SqliteCheckpoints`` (``effectgate.graph._sqlite_checkpoints``) and
``PostgresCheckpoints`` (``effectgate.graph._pg_saver``, beside the
PostgreSQL saver: every statement sent to the PostgreSQL checkpoint tables is
there); ``_prune.checkpoint_store`` picks one for a saver.

Shared here, as both dialects use them: the guard table's name, the ledger's
half of the sizes and the VACUUM (a ledger file, or a PostgreSQL ledger's
tables through ``effectgate.ledger._postgres_upkeep``, whichever dialect the
checkpoints use), an SQLite file's VACUUM (the checkpoint file, or the
ledger's), and what a lock wait that timed out looks like.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from effectgate.ledger import Ledger

__all__ = [
    "GUARD_TABLE",
    "CheckpointStore",
    "Counted",
    "Vacuum",
    "disk_bytes",
    "is_lock_timeout",
    "ledger_sizes",
    "vacuum_file",
    "vacuum_ledger",
]

Vacuum = Literal["full", "incremental", "none"]

GUARD_TABLE = "effectgate_deleted_threads"
"""The table, in the checkpoint database, of threads no checkpoint or write may be stored for."""

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


def ledger_sizes(ledger: Ledger) -> dict[str, int]:
    """``{"ledger": bytes}``: an SQLite ledger's file and WAL, or a PostgreSQL ledger's tables.

    ``{}`` for a ledger that is neither (e.g. in memory).
    """
    out: dict[str, int] = {}
    path = getattr(ledger, "path", None)
    if isinstance(path, Path):
        out["ledger"] = disk_bytes(path)
    if isinstance(getattr(ledger.store, "dsn", None), str):
        from effectgate.ledger._postgres_upkeep import postgres_ledger_sizes

        out |= postgres_ledger_sizes(ledger)
    return out


def vacuum_ledger(ledger: Ledger, mode: Vacuum, wait_s: float) -> None:
    """Compact the ledger after a prune: its SQLite file (``vacuum_file``) or PostgreSQL tables.

    Raises:
        sqlite3.OperationalError, psycopg.Error: a lock was not had within
            ``wait_s`` (``is_lock_timeout`` tells), or the database failed.
    """
    path = getattr(ledger, "path", None)
    if isinstance(path, Path):
        vacuum_file(path, mode, wait_s)
    if isinstance(getattr(ledger.store, "dsn", None), str):
        from effectgate.ledger._postgres_upkeep import vacuum_postgres_ledger

        vacuum_postgres_ledger(ledger, mode, wait_s)


def disk_bytes(path: Path) -> int:
    """Bytes of an SQLite file and its ``-wal`` (a missing one counts 0)."""
    total = 0
    for p in (path, Path(f"{path}-wal")):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(p).st_size
    return total


def vacuum_file(path: Path, mode: Vacuum, wait_s: float) -> None:
    """Checkpoint the WAL into the file, VACUUM, and truncate the WAL (busy timeout ``wait_s``).

    ``mode="none"`` still folds the WAL into the file and truncates it.

    Raises:
        sqlite3.OperationalError: the file stayed locked past ``wait_s``.
    """
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


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that timed out (SQLite busy/locked, PostgreSQL 55P03)."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    return getattr(exc, "sqlstate", None) == "55P03"
