"""A business-keyed operation left in flight by one thread, met by another thread."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from effectgate.graph import new_worker_id
from tests.cli.conftest import eg, world

KEY = "ticket:orders-error-rate"


def _claimer(state: Path) -> str:
    with sqlite3.connect(state / "ledger.sqlite3") as conn:
        (worker,) = conn.execute(
            "SELECT claimed_by FROM operations WHERE operation_id = ?", (KEY,)
        ).fetchone()
    return str(worker)


def _set_claimer(state: Path, worker: str) -> None:
    with sqlite3.connect(state / "ledger.sqlite3") as conn:
        conn.execute("UPDATE operations SET claimed_by = ? WHERE operation_id = ?", (worker, KEY))


def test_a_thread_waits_for_a_live_worker_of_another_thread_and_recovers_a_dead_ones(
    tmp_path: Path,
) -> None:
    """Thread A dies with the shared ticket IN_FLIGHT; thread B must not retry it while
    A's worker may live (exit 5, a message naming thread A, nothing dispatched), and
    recovers it itself once that worker is proven gone: one ticket in all."""
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    crashed = eg(
        "demo", "--approve", "all", *sd, "--thread", "A", "--crash-at", "AFTER_IN_FLIGHT_COMMIT"
    )
    assert crashed.code == 137, crashed.stderr
    dead = _claimer(state)

    # Pretend A's worker is alive (this test process is): B must not touch the ticket.
    _set_claimer(state, new_worker_id())
    waiting = eg("demo", "--approve", "all", *sd, "--thread", "B", "--json")
    assert waiting.code == 5, waiting.stderr
    assert "is in flight in thread 'A'" in waiting.json["error"]
    assert "may still be running" in waiting.json["error"]
    assert world(state)["tickets"] == []
    assert waiting.json["interrupts"] == []  # no verdict asked that nobody could give

    # A's worker is gone for real: B recovers the operation (lookup, then the same key).
    _set_claimer(state, dead)
    done = eg("resume", *sd, "--thread", "B", "--approve", "all", "--json")
    assert done.code == 0, done.stderr
    assert [t["idempotency_key"] for t in world(state)["tickets"]] == [KEY]
    again = eg("resume", *sd, "--thread", "A", "--approve", "all", "--json")
    assert again.code in (0, 4), again.stderr  # A may stop at its possible-duplicate mail
    assert [t["idempotency_key"] for t in world(state)["tickets"]] == [KEY]
