"""Eight OS processes race to claim one operation, round after round: exactly one wins.

On SQLite (one file) and on PostgreSQL (one schema, a connection pool per process).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from effectgate.errors import ClaimLostError
from effectgate.ledger import Ledger, OpState, SqliteLedger
from effectgate.ledger._postgres import is_postgres_url
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_request

pytestmark = pytest.mark.crash

WORKERS = 8
ROUNDS = 20


def _open(store: str, clock: FakeClock | None = None) -> Ledger:
    if is_postgres_url(store):
        from effectgate.ledger import PostgresLedger

        return PostgresLedger(store, clock=clock, pool_size=1)
    return SqliteLedger(store, clock=clock)


def _racer(store: str, name: str, barrier: Barrier, results: Any) -> None:
    # Each process has its own connection; they meet only in the database.
    with _open(store) as ledger:
        for round_no in range(ROUNDS):
            barrier.wait()
            try:
                ledger.claim(f"race:{round_no}", attempt=1, worker=name)
                results.put((round_no, name, "won"))
            except ClaimLostError as exc:
                results.put((round_no, name, f"lost:{exc.current_state}:{exc.current_attempt}"))
            except Exception as exc:  # noqa: BLE001 - reported; the parent fails on it
                results.put((round_no, name, f"error:{type(exc).__name__}:{exc}"))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the racers meet: an SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite3")
    return str(request.getfixturevalue("postgres_url"))


def test_exactly_one_of_eight_processes_wins_every_round(store: str) -> None:
    """Over 20 rounds of 8 concurrent claimers, each round has one winner and 7 ClaimLostErrors."""
    path = store
    clock = FakeClock()
    with _open(path, clock) as ledger:
        reqs = [make_request(f"race:{n}", thread_id="race") for n in range(ROUNDS)]
        ledger.record_review(reqs, [make_approval(r, clock) for r in reqs])

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(path, f"p{i}", barrier, results)) for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in range(WORKERS * ROUNDS)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    with _open(path) as ledger:
        for round_no in range(ROUNDS):
            mine = [o for r, _, o in outcomes if r == round_no]
            winners = [n for r, n, o in outcomes if r == round_no and o == "won"]
            assert len(winners) == 1, (round_no, mine)
            assert sorted(mine) == ["lost:IN_FLIGHT:1"] * (WORKERS - 1) + ["won"]
            op = ledger.get(f"race:{round_no}")
            assert op is not None
            assert (op.state, op.attempt, op.claimed_by) == (OpState.IN_FLIGHT, 1, winners[0])
            claims = [
                e for e in ledger.events(operation_id=op.operation_id) if e.dst is OpState.IN_FLIGHT
            ]
            assert len(claims) == 1
