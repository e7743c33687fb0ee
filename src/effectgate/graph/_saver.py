"""``StepDurableSaver``: a ``SqliteSaver`` that fsyncs once per superstep, not once per write.

``SqliteSaver`` commits every ``put_writes`` (one per finished task, plus the
resume and interrupt writes) and every ``put`` (the checkpoint that ends a
superstep) on a connection at ``synchronous=FULL``: an fsync each, seven per
approved side effect in effectgate's graph (benchmarks/README.md). This saver commits
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

The saver also reads the history of a ``DeltaChannel`` (effectgate's
``messages``) faster than ``SqliteSaver``: that one walks the ancestors of the
checkpoint being loaded back to the channel's last snapshot and deserializes
every ancestor's whole blob only to learn whether it holds a snapshot (about
75 blobs per load in a typical thread, measured at 1.9 ms per resume against
1.0 ms for the plain channel's single blob; benchmarks/README.md). A checkpoint's parent
and the channels it holds do not change once written, so the saver remembers
them per checkpoint id (when it writes the checkpoint, or the first time it
reads it) and deserializes only the snapshot it seeds from. It forgets
whenever another connection has written the file (a delete or a re-put there
could change them), and on its own ``delete_thread``.
"""

from __future__ import annotations

import asyncio
import builtins
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph._internal._typing import MISSING
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
)
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite._delta import (
    build_delta_channels_writes_history,
    build_delta_stage2_sql,
)
from langgraph.pregel._algo import prepare_next_tasks
from langgraph.pregel._checkpoint import channels_from_checkpoint
from langgraph.pregel.debug import tasks_w_writes
from langgraph.types import Interrupt, PregelTask

from effectgate._recent import Recent
from effectgate.errors import CheckpointCorruptError
from effectgate.graph._sqlite_checkpoints import SqliteCheckpoints

__all__ = ["HeadState", "StepDurableSaver", "head_state"]


class _AsyncInThreads:
    """LangGraph's async saver methods, each running its sync twin in a worker thread.

    ``SqliteSaver`` and ``PostgresSaver`` raise ``NotImplementedError`` for
    ``aget_tuple``, ``alist``, ``aput`` and ``aput_writes`` (upstream sends
    async users to ``AsyncSqliteSaver`` and ``AsyncPostgresSaver``, whose
    durability rules are upstream's). Mixed into ``StepDurableSaver`` and
    ``StepDurablePostgresSaver``, each async method runs the sync one in a
    worker thread (``asyncio.to_thread``): the same connection or pool, the
    same cheap task writes and durable checkpoints, the same lineage memory,
    and the event loop never waits on the database. The sync methods never
    touch an event loop, so calling them from the loop's own thread cannot
    deadlock, as a sync call on ``AsyncSqliteSaver`` from its own loop does
    (``AsyncPostgresSaver`` refuses such a call outright).
    """

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple`` in a worker thread."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        return await asyncio.to_thread(saver.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """``list`` in a worker thread (read in full, then yielded)."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        found = await asyncio.to_thread(
            lambda: list(saver.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """``put`` (a durable commit) in a worker thread."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        return await asyncio.to_thread(saver.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """``put_writes`` (a cheap commit) in a worker thread."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        await asyncio.to_thread(saver.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread`` in a worker thread."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        await asyncio.to_thread(saver.delete_thread, thread_id)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """``get_delta_channel_history`` (remembered lineage) in a worker thread."""
        saver = cast("BaseCheckpointSaver[Any]", self)
        return await asyncio.to_thread(
            lambda: saver.get_delta_channel_history(config=config, channels=channels)
        )


class StepDurableSaver(_AsyncInThreads, SqliteSaver):
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

    _LINEAGE_MEMO = 20_000
    """Checkpoints whose lineage is remembered (about 250 bytes each; a thread's
    walk back to its snapshot visits at most a few hundred)."""

    def __init__(self, conn: sqlite3.Connection, **kwargs: Any) -> None:
        super().__init__(conn, **kwargs)
        self._local = threading.local()
        self._lineage: Recent[tuple[str, str, str], _Lineage] = Recent(self._LINEAGE_MEMO)
        self._lineage_version: int | None = None
        """``PRAGMA data_version`` when the memory was last known to match the file."""
        self._name_sets: Recent[frozenset[str], frozenset[str]] = Recent(256)

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

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``SqliteSaver.get_tuple``; a row whose bytes cannot be read back is reported as damage.

        Raises:
            CheckpointCorruptError: LangGraph's deserializer failed on a stored
                row (its bytes or type tag damaged), instead of that
                deserializer's ``TypeError``, ``KeyError`` or ``ValueError``.
        """
        try:
            return _checked(super().get_tuple(config), config)
        except _UNREADABLE as exc:
            raise _damaged(config, exc) from exc

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """``SqliteSaver.list``; a row whose bytes cannot be read back is reported as damage.

        Raises:
            CheckpointCorruptError: as ``get_tuple``.
        """
        found = super().list(config, filter=filter, before=before, limit=limit)
        try:
            for item in found:
                _checked(item, config)
                yield item
        except _UNREADABLE as exc:
            raise _damaged(config, exc) from exc

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

    def raw_mentions(
        self, thread_id: str, channel: str, marker: bytes
    ) -> builtins.list[bytes] | None:
        """The stored blobs of a thread that may hold ``channel``'s values and contain ``marker``.

        A byte-level superset, read without deserializing anything: the
        writes to ``channel`` and the checkpoints (whose ``channel_values``
        hold the channel's snapshots) of every namespace and branch of the
        thread, kept only when their bytes contain ``marker`` (SQLite's
        ``instr``). A value that reaches the channel's current value is in one
        of those blobs, as msgpack stores strings as their UTF-8 bytes.

        Returns:
            The matching blobs (checkpoints, then writes), or ``None`` when a
            candidate row is not plain msgpack (another serializer, an
            encrypted one): its bytes say nothing about its strings.
        """
        with self.cursor(transaction=False) as cur:
            rows = cur.execute(
                "SELECT type, checkpoint FROM checkpoints WHERE thread_id = ? "
                "AND (type IS NOT 'msgpack' OR instr(checkpoint, ?) > 0)",
                (thread_id, marker),
            ).fetchall()
            rows += cur.execute(
                "SELECT type, value FROM writes WHERE thread_id = ? AND channel = ? "
                "AND (type IS NOT 'msgpack' OR instr(value, ?) > 0)",
                (thread_id, channel, marker),
            ).fetchall()
        if any(kind != "msgpack" or not isinstance(blob, bytes) for kind, blob in rows):
            return None
        return [bytes(blob) for _, blob in rows]

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

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (``SqliteSaver.put``, an fsync'd commit) and remember its lineage."""
        saved = super().put(config, checkpoint, metadata, new_versions)
        conf = config["configurable"]
        key = (str(conf["thread_id"]), conf.get("checkpoint_ns", ""), checkpoint["id"])
        self._lineage[key] = _Lineage(
            conf.get("checkpoint_id"), self._names(checkpoint.get("channel_values") or ())
        )
        return saved

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread for good and forget the lineage remembered.

        Unlike ``SqliteSaver.delete_thread``, the thread is also recorded in
        the late-writer guard (``GUARD_TABLE``, as ``prune`` does): a run of
        the thread still at work (an effect in flight when the LangGraph
        server's ``threads.delete`` came) cannot bring it back with its next
        checkpoint or task write; that write raises instead. The thread id is
        not usable again.
        """
        SqliteCheckpoints(self, None).delete_thread(thread_id, datetime.now(UTC))  # type: ignore[arg-type]
        self._lineage.clear()

    def forget_lineage(self) -> None:
        """Forget the lineage remembered; call after deleting checkpoints on this connection.

        Another connection's deletes are noticed (``PRAGMA data_version``);
        this connection's own are not, so whoever deletes through it (e.g.
        ``effectgate.retention.prune``) says so.
        """
        self._lineage.clear()

    def _names(self, channels: Iterable[str]) -> frozenset[str]:
        # A graph's checkpoints hold a handful of distinct channel sets: share them.
        names = frozenset(channels)
        shared = self._name_sets.get(names)
        if shared is None:
            self._name_sets[names] = shared = names
        return shared

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """``SqliteSaver.get_delta_channel_history``, deserializing only the seeds.

        Same result as the upstream method (langgraph-checkpoint-sqlite 3.1):
        follow ``parent_checkpoint_id`` from the target back to the checkpoint
        holding each channel's snapshot (its seed), then read the channels'
        writes on that chain. Upstream walks the chain in SQL and deserializes
        every ancestor to learn whether it holds a snapshot. Here the walk
        follows remembered lineage (parent id and channel names, facts that
        never change once a checkpoint is written) and deserializes only the
        seeds; a checkpoint this saver has not seen yet sends the walk to SQL,
        as upstream, and is remembered on the way. The memory holds only while
        no other connection has written the file (``PRAGMA data_version``
        unchanged; this saver's own ``delete_thread`` forgets too): a delete,
        a prune or a re-put from elsewhere would make it wrong, so any other
        writer's commit clears it. A seed found missing where one was
        remembered also falls back to the SQL walk.

        Args:
            config: the target checkpoint's config (``thread_id``,
                ``checkpoint_ns``, ``checkpoint_id``; without an id, the
                thread's latest checkpoint).
            channels: the delta channels to reconstruct.

        Returns:
            ``{channel: {"writes": [(task_id, channel, value), ...], "seed": value}}``,
            writes oldest first; ``seed`` absent when no snapshot was found.
        """
        if not channels:
            return {}
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            return super().get_delta_channel_history(config=config, channels=channels)
        conf = config["configurable"]
        where = (str(conf["thread_id"]), conf.get("checkpoint_ns", ""))
        channels = list(channels)
        with self.cursor(transaction=False) as cur:
            (version,) = cur.execute("PRAGMA data_version").fetchone()
            if version != self._lineage_version:
                # Another connection committed (another process or saver on this
                # file): it may have deleted or rewritten checkpoints. Forget,
                # and learn again from the SQL walk.
                self._lineage.clear()
                self._lineage_version = version
            walk = self._remembered_walk(where, checkpoint_id, channels)
            seeds = None if walk is None else self._read_seeds(cur, where, walk[1])
            if walk is None or seeds is None:
                chain_by_ch, seeds = self._sql_walk(cur, where, checkpoint_id, channels)
            else:
                chain_by_ch = walk[0]
            with_chain = [ch for ch in channels if chain_by_ch[ch]]
            stage2_sql = build_delta_stage2_sql(
                has_task_path=self._has_task_path,
                chain_lens=[len(chain_by_ch[ch]) for ch in with_chain],
            )
            stage2_rows: builtins.list[Any] = []
            if stage2_sql:
                params: builtins.list[Any] = []
                for ch in with_chain:
                    params.extend([*where, ch, *chain_by_ch[ch]])
                stage2_rows = cur.execute(stage2_sql, params).fetchall()
        return build_delta_channels_writes_history(
            channels=channels,
            chain_by_ch=chain_by_ch,
            seed_val_by_ch=seeds,
            seeded=set(seeds),
            stage2_rows=stage2_rows,
            serde=self.serde,
        )

    def _remembered_walk(
        self, where: tuple[str, str], target: str, channels: builtins.list[str]
    ) -> tuple[dict[str, builtins.list[str]], dict[str, str]] | None:
        """Chains and seed checkpoint ids from remembered lineage; ``None``: something unknown."""
        node = self._lineage.get((*where, target))
        if node is None:
            return None
        chain_by_ch: dict[str, builtins.list[str]] = {ch: [] for ch in channels}
        seed_cids: dict[str, str] = {}
        active = set(channels)
        walked = {target}
        cid = node.parent
        while cid is not None and active and cid not in walked:
            walked.add(cid)
            node = self._lineage.get((*where, cid))
            if node is None or node.channels is None:
                return None
            for ch in active:
                chain_by_ch[ch].append(cid)
            for ch in active & node.channels:
                seed_cids[ch] = cid
            active -= node.channels
            cid = node.parent
        return chain_by_ch, seed_cids

    def _read_seeds(
        self, cur: sqlite3.Cursor, where: tuple[str, str], seed_cids: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """The snapshot values at ``seed_cids``; ``None`` if one is not there after all."""
        seeds: dict[str, Any] = {}
        for cid in set(seed_cids.values()):
            row = cur.execute(
                "SELECT type, checkpoint FROM checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (*where, cid),
            ).fetchone()
            if row is None:
                return None
            values = self.serde.loads_typed((row[0], row[1])).get("channel_values") or {}
            for ch, at in seed_cids.items():
                if at == cid:
                    if ch not in values:
                        return None
                    seeds[ch] = values[ch]
        return seeds

    def _sql_walk(
        self, cur: sqlite3.Cursor, where: tuple[str, str], target: str, channels: builtins.list[str]
    ) -> tuple[dict[str, builtins.list[str]], dict[str, Any]]:
        """Upstream's stage 1 (``_delta.step_walk_with_row``), remembering each row's lineage."""
        chain_by_ch: dict[str, builtins.list[str]] = {ch: [] for ch in channels}
        seeds: dict[str, Any] = {}
        active = set(channels)
        walked: set[str] = set()
        cur.execute(_ANCESTORS_SQL, (*where, target, *where))
        for cid, parent, type_tag, blob in cur:
            if not walked:
                # The target comes first; its own writes and seed are not part of its history.
                if cid == target:
                    walked.add(cid)
                    old = self._lineage.get((*where, cid))
                    known = None if old is None else old.channels
                    self._lineage[(*where, cid)] = _Lineage(parent, known)
                continue
            if cid in walked:  # INSERT OR REPLACE can make the chain a loop: stop, as upstream
                break
            walked.add(cid)
            for ch in active:
                chain_by_ch[ch].append(cid)
            values = self.serde.loads_typed((type_tag, blob)).get("channel_values") or {}
            self._lineage[(*where, cid)] = _Lineage(parent, self._names(values))
            for ch in [ch for ch in active if ch in values]:
                seeds[ch] = values[ch]
                active.discard(ch)
            if not active:
                break
        return chain_by_ch, seeds


_FILE_WHERE = "the checkpoint file (tables checkpoints, writes)"
"""Where ``StepDurableSaver`` keeps checkpoints, as a damage report names it."""

_UNREADABLE = (TypeError, KeyError, ValueError, AttributeError, IndexError)
"""What LangGraph's deserializer raises on damaged bytes (msgpack and JSON errors are
``ValueError``s); ``sqlite3.DatabaseError`` is left as it is (a damaged file)."""


@dataclass(frozen=True, slots=True)
class HeadState:
    """What runs next at a thread's head checkpoint, read without its ``DeltaChannel`` values."""

    checkpoint: Checkpoint
    """The head checkpoint as stored (its ``DeltaChannel`` values not rebuilt)."""
    tasks: tuple[PregelTask, ...]
    """``StateSnapshot.tasks`` of ``get_state`` (names, errors, pending interrupts, in order);
    their ``state`` and ``result`` are not filled in."""
    interrupts: tuple[Interrupt, ...]
    """``StateSnapshot.interrupts`` of ``get_state``: the interrupts still waiting, in order."""


def head_state(graph: Any, saver: StepDurableSaver, config: RunnableConfig) -> HeadState | None:
    """The tasks and pending interrupts ``graph.get_state(config)`` would report, read cheaply.

    ``get_state`` rebuilds every channel, and a ``DeltaChannel`` (effectgate's
    ``messages``) by deserializing its history: most of its cost, O(thread
    length). Which tasks run next and what they wait for do not depend on
    those values when no node is triggered by such a channel: task ids and
    names come from the checkpoint's versions and its ``TASKS`` (``Send``)
    list, errors and interrupts from the head's pending writes. This runs
    LangGraph's own steps of ``get_state`` (``prepare_next_tasks``,
    ``tasks_w_writes`` in its live mode) on the other channels.

    Args:
        graph: the compiled graph (a ``Pregel``) whose checkpointer is ``saver``.
        saver: the thread's saver.
        config: ``{"configurable": {"thread_id": ...}}`` of the thread's root
            namespace, with no ``checkpoint_id`` (the head).

    Returns:
        The head's ``HeadState``, or ``None`` when this reading is not known
        to match ``get_state`` (no checkpoint, a ``checkpoint_id`` or
        namespace in ``config``, subgraphs, a node triggered by a skipped
        channel, a checkpoint older than format 4): use ``get_state``.

    Raises:
        CheckpointCorruptError: as ``StepDurableSaver.get_tuple``.
    """
    conf = config.get("configurable", {})
    if conf.get("checkpoint_id") or conf.get("checkpoint_ns") or graph.config:
        return None
    skip = {k for k, spec in graph.channels.items() if isinstance(spec, DeltaChannel)}
    for node in graph.nodes.values():
        # A node triggered by a skipped channel, or reading only that one
        # channel, runs or not depending on its value: only get_state can say.
        if skip.intersection(node.triggers) or (
            isinstance(node.channels, str) and node.channels in skip
        ):
            return None
    if next(iter(graph.get_subgraphs()), None) is not None:
        return None  # subgraph tasks and namespaces: get_state's own path
    saved = saver.get_tuple(config)
    if saved is None or saved.checkpoint.get("v", 0) < 4:
        return None  # older layouts are migrated by get_state (``_migrate_checkpoint``)
    specs = {k: v for k, v in graph.channels.items() if k not in skip}
    loaded, managed = channels_from_checkpoint(
        specs, saved.checkpoint, saver=saver, config=saved.config
    )
    # An empty stand-in for each skipped channel: a node reading several
    # channels gets a task whatever their values (its input is a mapping).
    channels = {**loaded, **{k: graph.channels[k].from_checkpoint(MISSING) for k in skip}}
    step = saved.metadata.get("step", -1) + 1
    next_tasks = prepare_next_tasks(
        saved.checkpoint,
        saved.pending_writes or [],
        graph.nodes,
        channels,
        managed,
        saved.config,
        step,
        step + 2,
        for_execution=False,
    )
    tasks = tasks_w_writes(
        next_tasks.values(), saved.pending_writes, None, graph.stream_channels_asis, live=True
    )
    return HeadState(
        checkpoint=saved.checkpoint,
        tasks=tasks,
        interrupts=tuple(i for task in tasks for i in task.interrupts),
    )


_CHECKPOINT_MAPS = ("channel_values", "channel_versions", "versions_seen")


def _checked(
    item: CheckpointTuple | None,
    config: RunnableConfig | None,
    where: str = _FILE_WHERE,
) -> CheckpointTuple | None:
    """``item`` if its checkpoint has the shape LangGraph reads; damage raises.

    A deserializer may turn damaged bytes into some other value without an
    error (random bytes that happen to decode as an integer); LangGraph would
    then fail later, far from the cause.
    """
    if item is None:
        return None
    cp: Any = item.checkpoint
    if not isinstance(cp, dict) or not isinstance(cp.get("id"), str):
        raise _damaged(config, TypeError(f"a checkpoint that is a {type(cp).__name__}"), where)
    for key in _CHECKPOINT_MAPS:
        if not isinstance(cp.get(key), dict):
            raise _damaged(config, TypeError(f"a checkpoint whose {key!r} is not a mapping"), where)
    return item


def _damaged(
    config: RunnableConfig | None,
    exc: BaseException,
    where: str = _FILE_WHERE,
) -> CheckpointCorruptError:
    """The error naming the thread, where its checkpoint is stored, and what is wrong."""
    thread = (config or {}).get("configurable", {}).get("thread_id")
    return CheckpointCorruptError(
        f"a stored checkpoint cannot be read back ({type(exc).__name__}: {exc}); "
        f"damaged bytes in {where}. The ledger is kept apart: `effectgate ledger "
        "list` still shows every operation and its outcome",
        thread_id=None if thread is None else str(thread),
    )


@dataclass(frozen=True, slots=True)
class _Lineage:
    """What never changes about a written checkpoint, once it is written."""

    parent: str | None
    channels: frozenset[str] | None
    """Names in its ``channel_values`` (a delta channel named: a snapshot); ``None``: not read."""


# Upstream's DELTA_STAGE1_SQL (langgraph.checkpoint.sqlite._delta), with the parent id.
_ANCESTORS_SQL = (
    "WITH RECURSIVE ancestors(checkpoint_id, parent_checkpoint_id, type, checkpoint) AS ("
    "SELECT checkpoint_id, parent_checkpoint_id, type, checkpoint FROM checkpoints "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
    "UNION ALL "
    "SELECT c.checkpoint_id, c.parent_checkpoint_id, c.type, c.checkpoint "
    "FROM ancestors a CROSS JOIN checkpoints c ON c.checkpoint_id = a.parent_checkpoint_id "
    "WHERE c.thread_id = ? AND c.checkpoint_ns = ?"
    ") "
    "SELECT checkpoint_id, parent_checkpoint_id, type, checkpoint FROM ancestors"
)
