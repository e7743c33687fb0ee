"""``Ledger.release_claim``: a tool that stopped at a question gives its attempt back.

On both stores: the claim returns to the state it was claimed from, with the
attempt count it had, and only the live claim of that attempt is released.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate._clock import FakeClock
from effectgate.errors import ClaimLostError
from effectgate.ledger import Budget, Ledger, OpState, PostgresLedger, SqliteLedger
from effectgate.testing.ledger_conformance import make_approval, make_request


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    clock = FakeClock()
    if request.param == "sqlite":
        opened: Ledger = SqliteLedger(tmp_path / "l.sqlite3", clock=clock)
    else:
        opened = PostgresLedger(request.getfixturevalue("postgres_url"), clock=clock)
    with opened:
        yield opened


def test_a_released_claim_gives_the_attempt_back(ledger: Ledger) -> None:
    req = make_request("t1:c1", budget=Budget(max_attempts=2))
    ledger.record_review([req], [make_approval(req, ledger.clock)])  # type: ignore[arg-type]
    ledger.claim("t1:c1", attempt=1, worker="w")
    back = ledger.release_claim("t1:c1", attempt=1, reason="asked a question")
    assert (back.state, back.attempt, back.claimed_by) == (OpState.APPROVED, 0, None)
    with pytest.raises(ClaimLostError):
        ledger.release_claim("t1:c1", attempt=1, reason="again")  # no live claim left
    # The budget is whole: both attempts can still run.
    ledger.claim("t1:c1", attempt=1, worker="w")
    ledger.record_result("t1:c1", attempt=1, state=OpState.RETRY_WAIT, error="429")
    ledger.claim("t1:c1", attempt=2, worker="w")
    later = ledger.release_claim("t1:c1", attempt=2, reason="asked a question")
    assert (later.state, later.attempt) == (OpState.RETRY_WAIT, 1)
    moves = [(e.src, e.dst) for e in ledger.events(operation_id="t1:c1")]
    assert moves.count((OpState.IN_FLIGHT, OpState.APPROVED)) == 1
    assert (OpState.IN_FLIGHT, OpState.RETRY_WAIT) in moves
