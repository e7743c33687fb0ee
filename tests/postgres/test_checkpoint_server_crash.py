"""A task's checkpoint writes on PostgreSQL survive a crash of the database server.

A crash of the server (``pg_ctl stop -m immediate``, then crash recovery)
loses every transaction committed at ``synchronous_commit = off`` since the
last WAL flush, while the worker that saw it commit goes on: its pool
reconnects to the restarted server and its next checkpoint is written on top
of the lost writes. effectgate's messages channel is rebuilt from the writes
of a checkpoint's ancestors, so that checkpoint and every later one misses
them (the PostgreSQL fault campaign: 8 trials with broken histories in 946,
each with a ``restart -m immediate``; this is the likely cause). The test
crashes a private cluster right after a task's writes and reads them back
after recovery.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from effectgate.graph._pg_saver import open_postgres_saver
from effectgate.testing.postgres import PrivateCluster
from tests.postgres._private import late_wal_cluster

pytestmark = pytest.mark.crash


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A private server that keeps asynchronous commits unflushed (``late_wal_cluster``)."""
    with late_wal_cluster("checkpoints") as server:
        yield server


def test_a_task_write_survives_a_server_crash(cluster: PrivateCluster) -> None:
    """put_writes, then the server crashes: after recovery the write is there.

    Failed before task writes were durable on PostgreSQL: the pending writes
    read back empty after recovery, and a worker that went on would have
    checkpointed the next superstep without them.
    """
    url = cluster.url("checkpoints")
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with open_postgres_saver(url) as saver:
        saved = saver.put(config, empty_checkpoint(), {"source": "input", "step": 0}, {})
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the checkpoint is on disk, as a busy run's would be
        saver.put_writes(saved, [("messages", "the tool's result")], task_id="task-1")
    cluster.restart("immediate")
    with open_postgres_saver(url) as saver:
        tup = saver.get_tuple(saved)
    assert tup is not None
    assert tup.pending_writes == [("task-1", "messages", "the tool's result")]
