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

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from effectgate.errors import ConfigError, ThreadBusyError
from effectgate.graph._checkpoint_stores import (
    CheckpointStore,
    Counted,
    Vacuum,
    is_lock_timeout,
)
from effectgate.graph._state import RunStatus
from effectgate.ledger import UNFINISHED, Ledger
from effectgate.ledger._model import ThreadTombstone
from effectgate.ledger._tombstones import deleted_threads, tombstone_of

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph


class Agent(Protocol):
    """What ``prune`` needs of an agent (``effectgate.graph.Agent`` is one).

    Written as a protocol so that this module does not import the agent,
    which imports it (``Agent.prune``).
    """

    @property
    def ledger(self) -> Ledger:
        """The agent's operation ledger."""
        ...

    @property
    def graph(self) -> CompiledStateGraph[Any, Any, Any, Any]:
        """The compiled graph: its checkpointer and its channels."""
        ...

    def status(self, thread_id: str) -> Any:
        """The thread's ``ThreadStatus`` (its ``status`` a ``RunStatus``)."""
        ...


__all__ = ["PrunePolicy", "PruneReport", "Vacuum", "prune"]


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
    store = checkpoint_store(agent.graph.checkpointer, agent.ledger)
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
            if not is_lock_timeout(exc):
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


def checkpoint_store(saver: Any, ledger: Ledger) -> CheckpointStore:
    """The store of ``saver``'s checkpoints: SQLite or PostgreSQL.

    The PostgreSQL one (``effectgate.graph._pg_saver``) is imported only for a
    PostgreSQL saver, so an SQLite run never loads psycopg.

    Raises:
        ConfigError: ``saver`` is neither an SQLite nor a PostgreSQL saver.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    if isinstance(saver, SqliteSaver):
        from effectgate.graph._sqlite_checkpoints import SqliteCheckpoints

        return SqliteCheckpoints(saver, ledger)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:  # pragma: no cover - without the postgres extra
        PostgresSaver = None  # type: ignore[assignment,misc]
    if PostgresSaver is not None and isinstance(saver, PostgresSaver):
        from effectgate.graph._pg_saver import PostgresCheckpoints

        return PostgresCheckpoints(saver, ledger)
    raise ConfigError(
        "prune needs an SQLite (StepDurableSaver) or PostgreSQL (StepDurablePostgresSaver) "
        f"checkpointer, not {type(saver).__name__}"
    )


def _why_not(agent: Agent, thread_id: str) -> str | None:
    """Why a thread must not be deleted now; ``None``: it may go."""
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


def _latest_ts(store: CheckpointStore, thread_id: str) -> datetime | None:
    found = store.saver.get_tuple({"configurable": {"thread_id": thread_id}})
    return None if found is None else datetime.fromisoformat(found.checkpoint["ts"])


def _threads_to_delete(
    agent: Agent, store: CheckpointStore, policy: PrunePolicy, now: datetime, report: PruneReport
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
    store: CheckpointStore,
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
    store: CheckpointStore,
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
    store: CheckpointStore,
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
    store: CheckpointStore, thread_id: str, ns: str, n: int, deltas: frozenset[str]
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


def _compact_ledger(
    agent: Agent,
    store: CheckpointStore,
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
