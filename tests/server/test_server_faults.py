"""What a server does to a run, under the effectgate agent: kills, double texts, cancels, deletes.

LangGraph's Agent Server runs are at-least-once: a run can be killed at any
seam, sent twice, interrupted by a second run (``multitask_strategy``),
cancelled or have its thread deleted while an effect is in flight. Every test
counts the effect in the external system's own storage (the demo ticket
service's tickets), never in effectgate's logs.

The first tests need no server: they drive effectgate's own checkpointers
(what ``open_agent`` and a self-hosted server with effectgate's saver use) the
way the server's ``threads.delete`` does. The rest share one ``langgraph dev``
per module (in-memory runtime, the state directory's ledger).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate._app import StateDir, open_agent
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.graph import RunStatus
from effectgate.ledger import OpState
from tests.answers._bind import bound

APPROVE: dict[str, Any] = {"decisions": [{"type": "approve"}], "reviewer": "t"}
DEADLINE_S = 20.0


def _until(what: str, condition: Any, timeout: float = DEADLINE_S) -> Any:
    """Poll ``condition()`` until it is truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"not within {timeout} s: {what}")


def _checkpoint_rows(sd: StateDir, thread_id: str, store: str | None) -> int:
    if store is not None:
        with psycopg.connect(store) as pg:
            row = pg.execute(
                "SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchone()
            assert row is not None
            return int(row[0])
    conn = sqlite3.connect(sd.checkpoints)
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        return int(n)
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str | None:
    """``None`` (the SQLite files of the state directory) or a ``postgresql://`` URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


def test_delete_thread_while_an_effect_runs_stays_deleted(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """``delete_thread`` of effectgate's saver while the approved ticket is being created.

    The worker's late checkpoint is refused (the late-writer guard), so the
    thread stays deleted: no checkpoint comes back and no next review is
    raised on it. The ticket is created at most once and its operation stays
    in the ledger, ended honestly.
    """
    sd = state_dir
    with open_agent(sd, endpoints=services.endpoints, store=store) as agent:
        tid = "deleted-mid-effect"
        assert agent.start("Check the orders error rate", thread_id=tid).status is (
            RunStatus.WAITING_REVIEW
        )
        services.set_fault("tickets", "slow", delay_s=2.0)
        answer = bound(agent, tid, APPROVE)
        outcome: dict[str, Any] = {}

        def approve() -> None:
            try:
                outcome["result"] = agent.resume(tid, decisions=answer)
            except Exception as exc:  # the refused late write may surface here
                outcome["error"] = exc

        worker = threading.Thread(target=approve)
        worker.start()
        _until(
            "the ticket operation is IN_FLIGHT",
            lambda: any(
                op.tool == "create_ticket" and op.state is OpState.IN_FLIGHT
                for op in agent.ledger.list()
            ),
        )
        saver = agent.graph.checkpointer
        assert saver is not None
        saver.delete_thread(tid)
        worker.join(timeout=DEADLINE_S)
        assert not worker.is_alive()
        services.set_fault("tickets", "normal")
        assert _checkpoint_rows(sd, tid, store) == 0
        [ticket_op] = [op for op in agent.ledger.list() if op.tool == "create_ticket"]
        assert ticket_op.state in (OpState.SUCCEEDED, OpState.IN_FLIGHT, OpState.UNKNOWN)
    assert len(read_tickets(sd.services)) <= 1
