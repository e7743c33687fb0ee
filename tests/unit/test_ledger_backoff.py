"""Full-jitter backoff and ``Ledger.next_attempt_at``: bounds, Retry-After, deadlines."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from effectgate.ledger import Budget, Operation, OpState, SqliteLedger, full_jitter_delay
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_request


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (500, 30.0)]
)
def test_delay_stays_within_the_doubling_ceiling(attempt: int, ceiling: float) -> None:
    """Attempt n waits uniform(0, min(cap, base * 2**(n-1))) and covers that range."""
    rng = random.Random(7)
    samples = [full_jitter_delay(attempt, base_s=0.5, cap_s=30.0, rng=rng) for _ in range(400)]
    assert all(0.0 <= s <= ceiling for s in samples)
    assert max(samples) > 0.9 * ceiling and min(samples) < 0.1 * ceiling


def test_delay_is_reproducible_with_a_seeded_rng() -> None:
    """The same seed gives the same delays (tests inject the rng)."""
    a = [full_jitter_delay(3, base_s=1, cap_s=9, rng=random.Random(1)) for _ in range(3)]
    b = [full_jitter_delay(3, base_s=1, cap_s=9, rng=random.Random(1)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(
    ("attempt", "base", "cap"), [(0, 1.0, 1.0), (1, -1.0, 1.0), (1, 1.0, float("inf"))]
)
def test_delay_refuses_nonsense(attempt: int, base: float, cap: float) -> None:
    """A zero attempt or a negative or infinite bound raises ValueError."""
    with pytest.raises(ValueError):
        full_jitter_delay(attempt, base_s=base, cap_s=cap, rng=random.Random())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "l.sqlite3", clock=clock, rng=random.Random(3)) as led:
        yield led


def _after_attempts(ledger: SqliteLedger, clock: FakeClock, n: int, budget: Budget) -> Operation:
    req = make_request(budget=budget)
    ledger.record_review([req], [make_approval(req, clock)])
    for attempt in range(1, n + 1):
        ledger.claim(req.operation_id, attempt=attempt, worker="w")
        op = ledger.record_result(req.operation_id, attempt=attempt, state=OpState.RETRY_WAIT)
    return op


def test_next_attempt_uses_the_stored_budget(ledger: SqliteLedger, clock: FakeClock) -> None:
    """After 2 attempts with base 2 s the wait is within [0, 4] s of now."""
    budget = Budget(max_attempts=5, backoff_base_s=2.0, backoff_cap_s=60.0)
    op = _after_attempts(ledger, clock, 2, budget)
    at = ledger.next_attempt_at(op)
    assert at is not None and clock.now() <= at <= clock.now() + timedelta(seconds=4)


@pytest.mark.parametrize("hint", [timedelta(seconds=120), 120.0])
def test_retry_after_is_a_floor(ledger: SqliteLedger, clock: FakeClock, hint: object) -> None:
    """A server's Retry-After (timedelta or seconds) is never undercut by the jitter."""
    op = _after_attempts(ledger, clock, 1, Budget(max_attempts=3))
    at = ledger.next_attempt_at(op, retry_after=hint)  # type: ignore[arg-type]
    assert at == clock.now() + timedelta(seconds=120)


def test_no_next_attempt_past_the_deadline(ledger: SqliteLedger, clock: FakeClock) -> None:
    """A wait that would end after the deadline gives None."""
    deadline = clock.now() + timedelta(seconds=60)
    op = _after_attempts(ledger, clock, 1, Budget(max_attempts=3, deadline_at=deadline))
    assert ledger.next_attempt_at(op, retry_after=timedelta(seconds=61)) is None
    assert ledger.next_attempt_at(op, retry_after=timedelta(seconds=59)) is not None


def test_no_next_attempt_when_attempts_are_spent(ledger: SqliteLedger, clock: FakeClock) -> None:
    """After max_attempts attempts there is no next attempt."""
    op = _after_attempts(ledger, clock, 2, Budget(max_attempts=2))
    assert ledger.next_attempt_at(op) is None
