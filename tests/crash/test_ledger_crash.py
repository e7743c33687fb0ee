"""Processes die around the claim commit; a new process finds exactly what was committed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from effectgate.ledger import Budget, OpState, SqliteLedger
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_request

pytestmark = pytest.mark.crash

OP = "t1:c1"

CLAIM_THEN_DIE = """
import os, sys
from effectgate.ledger import SqliteLedger
ledger = SqliteLedger(sys.argv[1])
{before_claim}
ledger.claim("t1:c1", attempt=1, worker="doomed")
{after_claim}
"""

RECOVER = """
import json, sys
from effectgate.ledger import Budget, SqliteLedger
from effectgate.testing.ledger_conformance import make_request
with SqliteLedger(sys.argv[1]) as ledger:
    recovered = [op.operation_id for op in ledger.recover_in_flight(thread_id="t1")]
    # the caller now asks for 50 attempts: the stored budget wins
    req = make_request(budget=Budget(max_attempts=50))
    op = ledger.open(**{f: getattr(req, f) for f in req.__dataclass_fields__})
    last = ledger.events(operation_id=op.operation_id)[-1]
    print(json.dumps({
        "recovered": recovered, "state": op.state.value, "attempt": op.attempt,
        "max_attempts": op.budget.max_attempts,
        "deadline_at": op.budget.deadline_at.isoformat() if op.budget.deadline_at else None,
        "last_event": [last.src, last.dst, last.detail],
    }))
"""


@pytest.fixture
def approved_ledger(tmp_path: Path) -> tuple[Path, str]:
    """A ledger file with one approved operation (2 attempts, a deadline), closed."""
    path = tmp_path / "ledger.sqlite3"
    clock = FakeClock()
    deadline = clock.now().replace(year=2030)
    with SqliteLedger(path, clock=clock) as ledger:
        req = make_request(OP, budget=Budget(max_attempts=2, deadline_at=deadline))
        ledger.record_review([req], [make_approval(req, clock)])
    return path, deadline.isoformat()


def _python(code: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def _recover_in_new_process(path: Path) -> dict[str, object]:
    proc = _python(RECOVER, str(path))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_exit_right_after_in_flight_commit_recovers_as_unknown(
    approved_ledger: tuple[Path, str],
) -> None:
    """os._exit after the IN_FLIGHT commit: a new process sees UNKNOWN, attempt 1 kept."""
    path, deadline = approved_ledger
    code = CLAIM_THEN_DIE.format(before_claim="", after_claim="os._exit(137)")
    proc = _python(code, str(path))
    proc.communicate(timeout=60)
    assert proc.returncode == 137
    seen = _recover_in_new_process(path)
    assert seen == {
        "recovered": [OP],
        "state": "UNKNOWN",
        "attempt": 1,
        "max_attempts": 2,
        "deadline_at": deadline,
        "last_event": ["IN_FLIGHT", "UNKNOWN", {"reason": "found IN_FLIGHT on recovery"}],
    }


def test_sigkill_while_in_flight_recovers_as_unknown(approved_ledger: tuple[Path, str]) -> None:
    """SIGKILL of a process blocked inside its side effect: the claim it committed survives."""
    path, _ = approved_ledger
    code = CLAIM_THEN_DIE.format(
        before_claim="", after_claim="print('claimed', flush=True)\nimport time; time.sleep(600)"
    )
    proc = _python(code, str(path))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "claimed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    seen = _recover_in_new_process(path)
    assert (seen["recovered"], seen["state"], seen["attempt"]) == ([OP], "UNKNOWN", 1)


def test_exit_before_the_claim_commits_leaves_no_trace(approved_ledger: tuple[Path, str]) -> None:
    """Dying after the UPDATE but before COMMIT leaves the operation APPROVED with attempt 0."""
    path, _ = approved_ledger
    with SqliteLedger(path) as ledger:
        before = [(e.seq, e.dst) for e in ledger.events()]
    hook = (
        "ledger.store._conn.set_trace_callback("
        "lambda sql: os._exit(137) if sql == 'COMMIT' else None)"
    )
    proc = _python(CLAIM_THEN_DIE.format(before_claim=hook, after_claim=""), str(path))
    proc.communicate(timeout=60)
    assert proc.returncode == 137
    seen = _recover_in_new_process(path)
    assert (seen["recovered"], seen["state"], seen["attempt"]) == ([], "APPROVED", 0)
    with SqliteLedger(path) as ledger:
        assert [(e.seq, e.dst) for e in ledger.events()] == before
        assert ledger.claim(OP, attempt=1, worker="next").state is OpState.IN_FLIGHT
