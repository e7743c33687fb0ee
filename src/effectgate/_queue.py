"""Threads recorded for workers: ``submit`` one, read its ``readiness``.

A worker (``effectgate worker``, ``effectgate.cli._workers``) takes the
threads that ``submit`` recorded in the ledger, and the unfinished ones, by
what ``readiness`` says of each. This is the library side of that queue; the
worker process, its loop and its reports are the CLI's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from effectgate._process import owner_is_gone
from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from effectgate.graph import Agent

__all__ = ["Readiness", "readiness", "submit"]


class Readiness(enum.StrEnum):
    """What a worker can do with a thread now."""

    NEW = "new"
    UNFINISHED = "unfinished"
    REVIEW = "review"
    """Waiting at a review interrupt (a worker's review policy may answer it)."""
    RECONCILIATION = "reconciliation"
    """Waiting for a person's reconciliation verdict: no worker policy gives one."""
    DONE = "done"
    HELD = "held"
    """Another worker's lease is live."""


def submit(
    agent: Agent, task: str, *, thread_id: str, metadata: Mapping[str, Any] | None = None
) -> None:
    """Record a new thread for workers to start (nothing runs here).

    A worker (``effectgate worker`` against the same state directory or
    ``--store``) starts it on its next scan. Submitting the same thread with
    the same task again changes nothing (an idempotent enqueue).

    Args:
        agent: an open agent on the ledger the workers read.
        task: what the agent should do (the thread's first human message).
        thread_id: the thread's id, chosen by the caller.
        metadata: stored with the thread, e.g. ``{"agent": "module:factory"}``
            for workers that load your own agent (docs/postgres.md).

    Raises:
        ConfigError: the task is blank, or the thread exists with another task.
    """
    if not task.strip():
        raise ConfigError("the task is empty: say what the agent should do")
    existing = agent.ledger.get_thread(thread_id)
    if existing is not None and dict(existing.input) != {"task": task}:
        raise ConfigError(f"thread {thread_id!r} already exists with another task")
    agent.ledger.record_thread(thread_id, {"task": task}, dict(metadata or {}))


def readiness(agent: Agent, thread_id: str) -> Readiness:
    """Classify one thread for a worker (see ``Readiness``); reads the lease, then ``Agent.status``.

    A review whose answer is recorded but not yet applied (its runner died in
    between) is ``UNFINISHED``: a worker resumes it, the answer stands.
    """
    ledger = agent.ledger
    with ledger.store.read(single=True) as r:
        lease = r.get_lease(thread_id)
    if (
        lease is not None
        and lease.owner != agent.worker
        and lease.expires_at > ledger.clock.now()
        and not owner_is_gone(lease.owner)  # a dead holder's lease is taken over at once
    ):
        return Readiness.HELD
    from effectgate.graph import RunStatus

    # ``Agent.status`` is the one reading of where a thread stands: an
    # interrupt whose answer is already recorded (a runner died between
    # recording it and writing the next checkpoint) is not pending any more,
    # and a follow-up turn recorded but not run leaves the thread unfinished.
    status = agent.status(thread_id).status
    if status is RunStatus.NOT_STARTED:
        return Readiness.NEW
    if status is RunStatus.WAITING_REVIEW:
        return Readiness.REVIEW
    if status is RunStatus.WAITING_RECONCILIATION:
        return Readiness.RECONCILIATION
    return Readiness.DONE if status is RunStatus.DONE else Readiness.UNFINISHED
