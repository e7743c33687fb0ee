"""Kill a real worker at every seam with its ledger and checkpoints in PostgreSQL; resume anew.

The seams, the oracle and the assertions are the SQLite crash tests' own
(``tests/crash/test_graph_crash.py``); only the store differs.
"""

from __future__ import annotations

import pytest

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.testing import Failpoint
from tests.conftest import run_worker
from tests.crash.test_graph_crash import SEAMS, assert_incident_done_once, attempts

pytestmark = [pytest.mark.crash, pytest.mark.slow]


@pytest.mark.parametrize(("spec", "expected", "why"), SEAMS, ids=[s[0] for s in SEAMS])
def test_kill_at_seam_then_resume_on_postgres(
    services: DemoServices,
    state_dir: StateDir,
    postgres_url: str,
    spec: str,
    expected: dict[str, int],
    why: str,
) -> None:
    """A worker killed at a seam leaves work a new process finishes, nothing done twice."""
    first = run_worker(state_dir, "t1", failpoint=spec, store=postgres_url)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    second = run_worker(state_dir, "t1", store=postgres_url)
    assert second.returncode == 0, (second.summary, second.stderr[-2000:])
    assert_incident_done_once(state_dir, "t1", store=postgres_url)
    got = attempts(state_dir, "t1", store=postgres_url)
    assert {k: got[k] for k in expected} == expected, why
    if spec == Failpoint.MID_SUPERSTEP:
        assert min(got["send_email"], got["write_file"]) == 1, got
    # the ticket service's own rows: exactly one ticket
    assert services.stats("tickets")["tickets"] == 1
    assert not state_dir.ledger.exists()  # the SQLite ledger was never used
