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
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
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
    """

    keep_last: int | None = None
    finished_older_than: timedelta | None = None
    delete_threads: Sequence[str] = ()
    operations_after: timedelta | None = timedelta(days=30)
    tombstones_after: timedelta | None = timedelta(days=90)
    deleted_by: str = "effectgate prune"
    reason: str | None = None
    vacuum: Vacuum = "full"

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


@dataclass(slots=True, kw_only=True)
class PruneReport:
    """What a prune removed (or, with ``dry_run``, would remove).

    Byte counts: ``payload_bytes`` is the size of the rows removed (checkpoint
    and metadata blobs, write values); ``files`` are the files' sizes on disk
    (database plus WAL) before and after, the ``after`` equal to ``before`` in
    a dry run.
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
        }


# ------------------------------------------------------------------ tombstones


def tombstone_of(ledger: Ledger, thread_id: str) -> ThreadTombstone | None:
    """Return the tombstone of a deleted thread, or ``None`` if it was not deleted."""
    with ledger.store.read() as r:
        return r.get_thread_tombstone(thread_id)


def deleted_threads(ledger: Ledger) -> dict[str, ThreadTombstone]:
    """Return every deleted thread's tombstone, by thread id."""
    with ledger.store.read() as r:
        return {t.thread_id: t for t in r.list_thread_tombstones()}


def refuse_deleted(ledger: Ledger, thread_id: str) -> None:
    """Raise ``ThreadDeletedError`` if ``thread_id`` was deleted."""
    found = tombstone_of(ledger, thread_id)
    if found is not None:
        raise ThreadDeletedError(found)


# ------------------------------------------------------------------ the prune


def prune(agent: Agent, policy: PrunePolicy, *, dry_run: bool = False) -> PruneReport:
    """Apply ``policy`` to the agent's checkpoint file and ledger.

    Args:
        agent: an agent over the state to prune; its checkpointer must be a
            ``SqliteSaver`` (``StepDurableSaver``) and its ledger an SQLite one
            for the sizes and the VACUUM.
        policy: what to remove (``PrunePolicy``).
        dry_run: report what would go and touch nothing.

    Returns:
        The ``PruneReport``.

    Raises:
        ConfigError: the policy is impossible, or the agent's saver is not an SQLite one.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    policy.check()
    saver = agent.graph.checkpointer
    if not isinstance(saver, SqliteSaver):
        raise ConfigError("prune needs an SQLite checkpointer (StepDurableSaver)")
    started = time.perf_counter()
    files = _files(saver, agent.ledger)
    report = PruneReport(dry_run=dry_run)
    before = {name: _disk_bytes(path) for name, path in files.items()}
    now = agent.ledger.clock.now()
    victims = _threads_to_delete(agent, saver, policy, now, report)
    for thread_id, reason in victims.items():
        _delete_thread(
            agent, saver, thread_id, reason=reason, policy=policy, report=report, dry_run=dry_run
        )
    if policy.keep_last is not None:
        skip = set(report.threads_deleted)
        _keep_last(agent, saver, policy.keep_last, report, skip=skip, dry_run=dry_run)
    _compact_ledger(agent.ledger, policy, now, report, dry_run=dry_run)
    forget = getattr(saver, "forget_lineage", None)
    if callable(forget) and not dry_run:
        forget()
    if not dry_run:
        for path in files.values():
            _vacuum(path, policy.vacuum)
    report.files = {
        name: {"before": before[name], "after": before[name] if dry_run else _disk_bytes(path)}
        for name, path in files.items()
    }
    report.seconds = time.perf_counter() - started
    return report


def _files(saver: Any, ledger: Ledger) -> dict[str, Path]:
    out: dict[str, Path] = {}
    with saver.cursor(transaction=False) as cur:
        (row,) = [r for r in cur.execute("PRAGMA database_list") if r[1] == "main"]
    if row[2]:
        out["checkpoints"] = Path(row[2])
    path = getattr(ledger, "path", None)
    if isinstance(path, Path):
        out["ledger"] = path
    return out


def _disk_bytes(path: Path) -> int:
    total = 0
    for p in (path, Path(f"{path}-wal")):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(p).st_size
    return total


def _checkpointed_threads(saver: Any) -> list[str]:
    with saver.cursor(transaction=False) as cur:
        return [r[0] for r in cur.execute("SELECT DISTINCT thread_id FROM checkpoints")]


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


def _latest_ts(saver: Any, thread_id: str) -> datetime | None:
    found = saver.get_tuple({"configurable": {"thread_id": thread_id}})
    return None if found is None else datetime.fromisoformat(found.checkpoint["ts"])


def _threads_to_delete(
    agent: Agent, saver: Any, policy: PrunePolicy, now: datetime, report: PruneReport
) -> dict[str, str]:
    gone = deleted_threads(agent.ledger)
    victims: dict[str, str] = {}
    # A deletion that stopped after its tombstone: finish it.
    leftover = [t for t in _checkpointed_threads(saver) if t in gone]
    for thread_id in leftover:
        victims[thread_id] = gone[thread_id].reason
    for thread_id in policy.delete_threads:
        if thread_id in gone:
            continue
        known = agent.ledger.get_thread(thread_id) is not None or _latest_ts(saver, thread_id)
        if not known:
            report.threads_kept[thread_id] = "unknown thread"
            continue
        why = _why_not(agent, thread_id)
        if why is None:
            victims[thread_id] = policy.reason or "deleted on request"
        else:
            report.threads_kept[thread_id] = why
    if policy.finished_older_than is not None:
        cutoff = now - policy.finished_older_than
        for thread_id in _checkpointed_threads(saver):
            if thread_id in victims or thread_id in gone:
                continue
            ts = _latest_ts(saver, thread_id)
            if ts is None or ts >= cutoff:
                continue
            why = _why_not(agent, thread_id)
            if why is None:
                victims[thread_id] = policy.reason or (
                    f"finished, idle longer than {policy.finished_older_than}"
                )
            else:
                report.threads_kept[thread_id] = why
    return victims


def _delete_thread(
    agent: Agent,
    saver: Any,
    thread_id: str,
    *,
    reason: str,
    policy: PrunePolicy,
    report: PruneReport,
    dry_run: bool,
) -> None:
    counted = _count(saver, "thread_id = ?", (thread_id,))
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
        with saver.cursor() as cur:
            for sql in _GUARD_SQL:
                cur.execute(sql)
            cur.execute(
                f"INSERT OR IGNORE INTO {GUARD_TABLE} (thread_id, deleted_at) VALUES (?, ?)",
                (thread_id, agent.ledger.clock.now().isoformat()),
            )
            cur.execute("DELETE FROM writes WHERE thread_id = ?", (thread_id,))
            cur.execute("DELETE FROM checkpoints WHERE thread_id = ?", (thread_id,))
    finally:
        agent.ledger.release_lease(lease)
    report.threads_deleted.append(thread_id)
    _add(report, counted)


def _count(saver: Any, where: str, params: Sequence[Any]) -> tuple[int, int, int]:
    with saver.cursor(transaction=False) as cur:
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


def _add(report: PruneReport, counted: tuple[int, int, int]) -> None:
    report.checkpoints_removed += counted[0]
    report.writes_removed += counted[1]
    report.payload_bytes += counted[2]


def _delta_channels(agent: Agent) -> frozenset[str]:
    from langgraph.channels.delta import DeltaChannel

    return frozenset(k for k, ch in agent.graph.channels.items() if isinstance(ch, DeltaChannel))


def _keep_last(
    agent: Agent, saver: Any, n: int, report: PruneReport, *, skip: set[str], dry_run: bool
) -> None:
    deltas = _delta_channels(agent)
    with saver.cursor(transaction=False) as cur:
        groups = cur.execute("SELECT DISTINCT thread_id, checkpoint_ns FROM checkpoints").fetchall()
    for thread_id, ns in groups:
        if thread_id in skip:
            continue  # deleted whole (a dry run still sees its rows)
        drop = _droppable(saver, thread_id, ns, n, deltas)
        if not drop:
            continue
        for chunk in _chunks(drop, 500):
            marks = ", ".join("?" * len(chunk))
            where = f"thread_id = ? AND checkpoint_ns = ? AND checkpoint_id IN ({marks})"
            params = (thread_id, ns, *chunk)
            _add(report, _count(saver, where, params))
            if not dry_run:
                with saver.cursor() as cur:
                    cur.execute(f"DELETE FROM writes WHERE {where}", params)
                    cur.execute(f"DELETE FROM checkpoints WHERE {where}", params)


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _droppable(saver: Any, thread_id: str, ns: str, n: int, deltas: frozenset[str]) -> list[str]:
    """Checkpoint ids of one thread and namespace that no kept checkpoint depends on.

    Kept: the ``n`` latest, and for each of them its ancestors back to the
    nearest one that holds every delta channel it has (a snapshot, or an old
    full-list blob), which its reads replay from.
    """
    with saver.cursor(transaction=False) as cur:
        rows = cur.execute(
            "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints "
            "WHERE thread_id = ? AND checkpoint_ns = ? ORDER BY checkpoint_id DESC",
            (thread_id, ns),
        ).fetchall()
    if len(rows) <= n:
        return []
    parent = {cid: p for cid, p in rows}
    keep: set[str] = set()
    for cid, _ in rows[:n]:
        # A node already kept had its walk go on to a snapshot: stop there.
        node: str | None = cid
        need = set(deltas)
        while node is not None and node in parent and node not in keep:
            keep.add(node)
            need -= _self_contained(saver, thread_id, ns, node, need)
            if not need:
                break
            node = parent[node]
    return [cid for cid, _ in rows if cid not in keep]


def _self_contained(
    saver: Any, thread_id: str, ns: str, checkpoint_id: str, channels: set[str]
) -> set[str]:
    """Which of ``channels`` this checkpoint holds in full, or never had (nothing to replay)."""
    if not channels:
        return set()
    with saver.cursor(transaction=False) as cur:
        row = cur.execute(
            "SELECT type, checkpoint FROM checkpoints "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        ).fetchone()
    if row is None:
        return set()
    ckpt = saver.serde.loads_typed((row[0], row[1]))
    values = ckpt.get("channel_values") or {}
    versions = ckpt.get("channel_versions") or {}
    return {ch for ch in channels if ch in values or ch not in versions}


def _compact_ledger(
    ledger: Ledger, policy: PrunePolicy, now: datetime, report: PruneReport, *, dry_run: bool
) -> None:
    if policy.operations_after is None and policy.tombstones_after is None:
        return
    try:
        with ledger.store.transaction() as tx:
            if policy.operations_after is not None:
                report.operations_compacted = tx.compact_operations(
                    finished_before=now - policy.operations_after, now=now
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


def _vacuum(path: Path, mode: Vacuum) -> None:
    """Checkpoint the WAL into the file, VACUUM, and truncate the WAL."""
    own = sqlite3.connect(path, isolation_level=None, timeout=30.0)
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
