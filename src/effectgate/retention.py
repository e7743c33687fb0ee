"""Retention: prune checkpoints, delete threads behind tombstones, compact the ledger.

Months of threads need three things a checkpointer and a ledger do not do by
themselves:

- **Keep the last N checkpoints of a thread**, with everything their state
  depends on. effectgate's messages channel is a LangGraph ``DeltaChannel``:
  a checkpoint stores only the messages its superstep added, and reading it
  replays the writes of its ancestors back to the last full snapshot. The
  recipe often used with LangGraph (keep only the latest checkpoint of each
  thread, then VACUUM) therefore empties a thread: its latest checkpoint does
  not hold the history. Here every kept checkpoint keeps its ancestors back
  to a snapshot of every delta channel, and the writes of all of them (its
  pending writes, and the deltas its reads replay).
- **Delete whole threads** (named ones, or finished ones idle for longer than
  a duration), never one that still waits for a review or a verdict, has
  unfinished tasks, or has an operation that is not terminal. The deletion is
  recorded first, as a tombstone in the ledger (when, by whom, why): the
  thread is listed as deleted and a resume refuses. Then the checkpoints go,
  and the checkpoint file gets a guard: a trigger that refuses any new
  checkpoint or write for that thread, so a worker that was parked between an
  external commit and its checkpoint cannot bring the thread back with a late
  write (a stale writer recreating a thread after ``delete_thread`` is a
  public LangGraph report). The thread runs under its lease while it goes.
- **Compact the ledger.** A terminal operation last updated before the
  retention window becomes an operation tombstone (id, thread, tool, intent
  hash, outcome, receipt); its arguments, approvals and events go. The
  tombstone answers "this id was used, for this intent, with this receipt"
  until the deduplication window has passed too, and is then removed. A
  replay that reaches a compacted or removed operation finds no operation
  under its id, so the review asks a person again: never a silent
  re-execution (see docs/retention.md).

A run ends with ``PRAGMA wal_checkpoint(TRUNCATE)`` and a VACUUM of both
files, and reports their sizes before and after; ``dry_run`` only reports
what would go.

The same holds on PostgreSQL (``StepDurablePostgresSaver`` and
``PostgresLedger``): the late-writer guard is a table of deleted threads and a
``BEFORE INSERT`` trigger on ``checkpoints``, ``checkpoint_writes`` and
``checkpoint_blobs``; ``keep_last`` also removes the channel blobs no kept
checkpoint names; sizes are ``pg_total_relation_size`` of the tables, and the
run ends with ``VACUUM (FULL, ANALYZE)`` (``vacuum="full"``) or ``VACUUM
(ANALYZE)`` (``"incremental"``) of the tables it touched.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from effectgate.errors import ConfigError, ThreadBusyError
from effectgate.ledger import UNFINISHED, Ledger
from effectgate.ledger._model import ThreadTombstone

if TYPE_CHECKING:
    from effectgate.graph import Agent

__all__ = [
    "PrunePolicy",
    "PruneReport",
    "ThreadDeletedError",
    "deleted_threads",
    "prune",
    "refuse_deleted",
    "tombstone_of",
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


class ThreadDeletedError(ConfigError):
    """The thread was deleted (``prune``); it cannot be resumed or started again.

    Attributes:
        tombstone: when, by whom and why it was deleted.
    """

    def __init__(self, tombstone: ThreadTombstone) -> None:
        self.tombstone = tombstone
        super().__init__(
            f"thread {tombstone.thread_id!r} was deleted at "
            f"{tombstone.deleted_at.isoformat(timespec='seconds')} by {tombstone.deleted_by}: "
            f"{tombstone.reason}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunePolicy:
    """What ``prune`` removes. Every field is off unless set, except the ledger windows.

    Attributes:
        keep_last: keep this many latest checkpoints of every thread (at
            least 1), with the ancestors and writes their state needs.
        finished_older_than: delete finished threads whose latest checkpoint
            is older than this.
        delete_threads: delete these threads (refused, and reported, for one
            that is not finished).
        operations_after: compact terminal operations last updated longer ago
            than this (default 30 days; ``None``: never).
        tombstones_after: remove operation tombstones whose operation finished
            longer ago than this (default 90 days; ``None``: never). Must not
            be shorter than ``operations_after``.
        deleted_by: recorded on each thread tombstone.
        reason: recorded on each thread tombstone (default: the policy that
            chose the thread).
        vacuum: ``"full"`` (VACUUM), ``"incremental"`` (switch the file to
            ``auto_vacuum=INCREMENTAL`` once, then ``incremental_vacuum``) or
            ``"none"``.
        vacuum_wait: how long the VACUUM waits for a lock another
            connection holds (the SQLite busy timeout; PostgreSQL's
            ``lock_timeout``), default 30 seconds, the ledger's own busy
            timeout. Past it the VACUUM is skipped, the rows already removed
            stay removed, and the report's ``vacuum_skipped`` says so.
    """

    keep_last: int | None = None
    finished_older_than: timedelta | None = None
    delete_threads: Sequence[str] = ()
    operations_after: timedelta | None = timedelta(days=30)
    tombstones_after: timedelta | None = timedelta(days=90)
    deleted_by: str = "effectgate prune"
    reason: str | None = None
    vacuum: Vacuum = "full"
    vacuum_wait: timedelta = timedelta(seconds=30)

    def check(self) -> None:
        """Raise ``ConfigError`` for an impossible policy (nothing is touched then)."""
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError("keep_last must be at least 1 (the latest checkpoint is the thread)")
        for name in ("finished_older_than", "operations_after", "tombstones_after"):
            value = getattr(self, name)
            if value is not None and value < timedelta(0):
                raise ConfigError(f"{name} must not be negative")
        if (
            self.operations_after is not None
            and self.tombstones_after is not None
            and self.tombstones_after < self.operations_after
        ):
            raise ConfigError("tombstones_after must not be shorter than operations_after")
        if self.vacuum not in ("full", "incremental", "none"):
            raise ConfigError(f"vacuum must be full, incremental or none, not {self.vacuum!r}")
        if self.vacuum_wait <= timedelta(0):
            raise ConfigError("vacuum_wait must be positive")


@dataclass(slots=True, kw_only=True)
class PruneReport:
    """What a prune removed (or, with ``dry_run``, would remove).

    Byte counts: ``payload_bytes`` is the size of the rows removed (checkpoint
    and metadata blobs, write values; on PostgreSQL also the channel blobs no
    kept checkpoint names). ``files`` holds, under ``checkpoints`` and
    ``ledger``, the sizes before and after: of the SQLite files on disk
    (database plus WAL), or of the PostgreSQL tables (``pg_total_relation_size``:
    heap, TOAST and indexes). In a dry run ``after`` equals ``before``.
    """

    dry_run: bool
    threads_deleted: list[str] = field(default_factory=list)
    threads_kept: dict[str, str] = field(default_factory=dict)
    """Threads asked for or matching the age policy that stay, with why."""
    checkpoints_removed: int = 0
    writes_removed: int = 0
    payload_bytes: int = 0
    operations_compacted: int = 0
    operation_tombstones_removed: int = 0
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    vacuum_skipped: str | None = None
    """Why the closing VACUUM did not run (a lock held past ``vacuum_wait``); ``None``: it ran."""

    def as_json(self) -> dict[str, Any]:
        """The report as a JSON-compatible dict."""
        return {
            "dry_run": self.dry_run,
            "threads_deleted": list(self.threads_deleted),
            "threads_kept": dict(self.threads_kept),
            "checkpoints_removed": self.checkpoints_removed,
            "writes_removed": self.writes_removed,
            "payload_bytes": self.payload_bytes,
            "operations_compacted": self.operations_compacted,
            "operation_tombstones_removed": self.operation_tombstones_removed,
            "files": {k: dict(v) for k, v in self.files.items()},
            "seconds": round(self.seconds, 3),
            "vacuum_skipped": self.vacuum_skipped,
        }


# ------------------------------------------------------------------ tombstones


def tombstone_of(ledger: Ledger, thread_id: str) -> ThreadTombstone | None:
    """Return the tombstone of a deleted thread, or ``None`` if it was not deleted."""
    with ledger.store.read(single=True) as r:
        return r.get_thread_tombstone(thread_id)


def deleted_threads(ledger: Ledger) -> dict[str, ThreadTombstone]:
    """Return every deleted thread's tombstone, by thread id."""
    with ledger.store.read(single=True) as r:
        return {t.thread_id: t for t in r.list_thread_tombstones()}


def refuse_deleted(ledger: Ledger, thread_id: str) -> None:
    """Raise ``ThreadDeletedError`` if ``thread_id`` was deleted."""
    found = tombstone_of(ledger, thread_id)
    if found is not None:
        raise ThreadDeletedError(found)


# ------------------------------------------------------------------ the prune


def prune(agent: Agent, policy: PrunePolicy, *, dry_run: bool = False) -> PruneReport:
    """Apply ``policy`` to the agent's checkpoints and ledger.

    Args:
        agent: an agent over the state to prune. Its checkpointer is a
            ``SqliteSaver`` (``StepDurableSaver``: the file's sizes, a WAL
            checkpoint and a VACUUM end the run) or a ``PostgresSaver``
            (``StepDurablePostgresSaver``: ``pg_total_relation_size`` of the
            tables before and after, and a VACUUM of the touched tables);
            its ledger an SQLite or a PostgreSQL one.
        policy: what to remove (``PrunePolicy``).
        dry_run: report what would go and touch nothing.

    Returns:
        The ``PruneReport``.

    Raises:
        ConfigError: the policy is impossible, or the agent's saver is neither
            an SQLite nor a PostgreSQL one.
    """
    policy.check()
    store = _checkpoint_store(agent)
    started = time.perf_counter()
    report = PruneReport(dry_run=dry_run)
    before = store.sizes()
    now = agent.ledger.clock.now()
    victims = _threads_to_delete(agent, store, policy, now, report)
    for thread_id, reason in victims.items():
        _delete_thread(
            agent, store, thread_id, reason=reason, policy=policy, report=report, dry_run=dry_run
        )
    if policy.keep_last is not None:
        skip = set(report.threads_deleted)
        _keep_last(agent, store, policy.keep_last, report, skip=skip, dry_run=dry_run)
    _compact_ledger(agent, store, policy, now, report, dry_run=dry_run)
    forget = getattr(store.saver, "forget_lineage", None)
    if callable(forget) and not dry_run:
        forget()
    if not dry_run:
        try:
            store.vacuum(policy.vacuum, policy.vacuum_wait.total_seconds())
        except Exception as exc:
            if not _is_lock_timeout(exc):
                raise
            # The deletes are committed; only the space is not given back yet.
            report.vacuum_skipped = (
                f"vacuum skipped: table busy (a lock held past "
                f"{policy.vacuum_wait.total_seconds():g} s: {exc}); "
                "run again"
            ).replace("\n", " ")
    after = before if dry_run else store.sizes()
    report.files = {name: {"before": before[name], "after": after[name]} for name in before}
    report.seconds = time.perf_counter() - started
    return report


Counted = tuple[int, int, int]
"""Checkpoints, writes, and the bytes of every row counted (checkpoints, writes, blobs)."""


class _CheckpointStore:
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


def _checkpoint_store(agent: Agent) -> _CheckpointStore:
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = agent.graph.checkpointer
    if isinstance(saver, SqliteSaver):
        return _SqliteCheckpoints(saver, agent.ledger)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:  # pragma: no cover - without the postgres extra
        PostgresSaver = None  # type: ignore[assignment,misc]
    if PostgresSaver is not None and isinstance(saver, PostgresSaver):
        return _PostgresCheckpoints(saver, agent.ledger)
    raise ConfigError(
        "prune needs an SQLite (StepDurableSaver) or PostgreSQL (StepDurablePostgresSaver) "
        f"checkpointer, not {type(saver).__name__}"
    )


class _SqliteCheckpoints(_CheckpointStore):
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


def _why_not(agent: Agent, thread_id: str) -> str | None:
    """Why a thread must not be deleted now; ``None``: it may go."""
    from effectgate.graph import RunStatus

    open_ops = agent.ledger.list(thread_id=thread_id, states=UNFINISHED)
    if open_ops:
        states = sorted({op.state.value for op in open_ops})
        return f"operation {open_ops[0].operation_id!r} is {'/'.join(states)} (not terminal)"
    status = agent.status(thread_id)
    if status.status in (RunStatus.WAITING_REVIEW, RunStatus.WAITING_RECONCILIATION):
        return f"it waits ({status.status.value})"
    if status.status is RunStatus.INCOMPLETE:
        return "it has unfinished tasks (resume it first)"
    return None


def _latest_ts(store: _CheckpointStore, thread_id: str) -> datetime | None:
    found = store.saver.get_tuple({"configurable": {"thread_id": thread_id}})
    return None if found is None else datetime.fromisoformat(found.checkpoint["ts"])


def _threads_to_delete(
    agent: Agent, store: _CheckpointStore, policy: PrunePolicy, now: datetime, report: PruneReport
) -> dict[str, str]:
    gone = deleted_threads(agent.ledger)
    victims: dict[str, str] = {}
    checkpointed = store.threads()
    # A deletion that stopped after its tombstone: finish it.
    for thread_id in checkpointed:
        if thread_id in gone:
            victims[thread_id] = gone[thread_id].reason
    for thread_id in policy.delete_threads:
        if thread_id in gone:
            continue
        known = agent.ledger.get_thread(thread_id) is not None or _latest_ts(store, thread_id)
        if not known:
            report.threads_kept[thread_id] = "unknown thread"
            continue
        why = _why_not(agent, thread_id)
        if why is None:
            victims[thread_id] = policy.reason or "deleted on request"
        else:
            report.threads_kept[thread_id] = why
    if policy.finished_older_than is not None:
        _finished_past(
            agent,
            store,
            checkpointed=checkpointed,
            policy=policy,
            now=now,
            victims=victims,
            gone=gone,
            report=report,
        )
    return victims


def _finished_past(
    agent: Agent,
    store: _CheckpointStore,
    *,
    checkpointed: Sequence[str],
    policy: PrunePolicy,
    now: datetime,
    victims: dict[str, str],
    gone: Mapping[str, ThreadTombstone],
    report: PruneReport,
) -> None:
    """Add the finished threads idle longer than ``policy.finished_older_than`` to ``victims``."""
    assert policy.finished_older_than is not None
    cutoff = now - policy.finished_older_than
    for thread_id in checkpointed:
        if thread_id in victims or thread_id in gone:
            continue
        ts = _latest_ts(store, thread_id)
        if ts is None or ts >= cutoff:
            continue
        why = _why_not(agent, thread_id)
        if why is None:
            victims[thread_id] = policy.reason or (
                f"finished, idle longer than {policy.finished_older_than}"
            )
        else:
            report.threads_kept[thread_id] = why


def _delete_thread(
    agent: Agent,
    store: _CheckpointStore,
    thread_id: str,
    *,
    reason: str,
    policy: PrunePolicy,
    report: PruneReport,
    dry_run: bool,
) -> None:
    counted = store.count_thread(thread_id)
    if dry_run:
        report.threads_deleted.append(thread_id)
        _add(report, counted)
        return
    owner = f"prune:{os.getpid()}"
    try:
        lease = agent.ledger.acquire_lease(thread_id, owner, 60.0)
    except ThreadBusyError as exc:
        report.threads_kept[thread_id] = f"busy: {exc}"
        return
    try:
        if tombstone_of(agent.ledger, thread_id) is None:
            # Under the lease nobody runs it: look once more, then record the deletion.
            why = _why_not(agent, thread_id)
            if why is not None:
                report.threads_kept[thread_id] = why
                return
            with agent.ledger.store.transaction() as tx:
                tx.put_thread_tombstone(
                    ThreadTombstone(
                        thread_id=thread_id,
                        deleted_at=agent.ledger.clock.now(),
                        deleted_by=policy.deleted_by,
                        reason=reason,
                    )
                )
        store.delete_thread(thread_id, agent.ledger.clock.now())
    finally:
        agent.ledger.release_lease(lease)
    report.threads_deleted.append(thread_id)
    _add(report, counted)


def _add(report: PruneReport, counted: Counted) -> None:
    report.checkpoints_removed += counted[0]
    report.writes_removed += counted[1]
    report.payload_bytes += counted[2]


def _delta_channels(agent: Agent) -> frozenset[str]:
    from langgraph.channels.delta import DeltaChannel

    return frozenset(k for k, ch in agent.graph.channels.items() if isinstance(ch, DeltaChannel))


def _keep_last(
    agent: Agent,
    store: _CheckpointStore,
    n: int,
    report: PruneReport,
    *,
    skip: set[str],
    dry_run: bool,
) -> None:
    deltas = _delta_channels(agent)
    for thread_id, ns in store.groups():
        if thread_id in skip:
            continue  # deleted whole (a dry run still sees its rows)
        drop = _droppable(store, thread_id, ns, n, deltas)
        for chunk in _chunks(drop, 500):
            _add(report, store.drop(thread_id, ns, chunk, dry_run=dry_run))


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _droppable(
    store: _CheckpointStore, thread_id: str, ns: str, n: int, deltas: frozenset[str]
) -> list[str]:
    """Checkpoint ids of one thread and namespace that no kept checkpoint depends on.

    Kept: the ``n`` latest, and for each of them its ancestors back to the
    nearest one that holds every delta channel it has (a snapshot, or an old
    full-list blob), which its reads replay from.
    """
    rows = store.lineage(thread_id, ns)
    if len(rows) <= n:
        return []
    parent = dict(rows)
    keep: set[str] = set()
    for cid, _ in rows[:n]:
        # A node already kept had its walk go on to a snapshot: stop there.
        node: str | None = cid
        need = set(deltas)
        while node is not None and node in parent and node not in keep:
            keep.add(node)
            need -= store.self_contained(thread_id, ns, node, need)
            if not need:
                break
            node = parent[node]
    return [cid for cid, _ in rows if cid not in keep]


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


class _PostgresCheckpoints(_CheckpointStore):
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


def _is_lock_timeout(exc: BaseException) -> bool:
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


def _compact_ledger(
    agent: Agent,
    store: _CheckpointStore,
    policy: PrunePolicy,
    now: datetime,
    report: PruneReport,
    *,
    dry_run: bool,
) -> None:
    """Compact old terminal operations, except those of threads that are not finished.

    A thread that waits (a review whose decisions are recorded but not yet
    applied after a crash, a verdict) or has work left reads its operations
    back when it goes on: compacting them would reopen a decided review, and
    a recorded reject would be lost. Their operations wait until it finishes.
    """
    if policy.operations_after is None and policy.tombstones_after is None:
        return
    ledger = agent.ledger
    busy = [t for t in store.threads() if _why_not(agent, t) is not None]
    try:
        with ledger.store.transaction() as tx:
            if policy.operations_after is not None:
                report.operations_compacted = tx.compact_operations(
                    finished_before=now - policy.operations_after, now=now, keep_threads=busy
                )
            if policy.tombstones_after is not None:
                report.operation_tombstones_removed = tx.drop_operation_tombstones(
                    finished_before=now - policy.tombstones_after
                )
            if dry_run:
                raise _Rollback  # counted, not kept
    except _Rollback:
        pass


class _Rollback(Exception):
    pass


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
