"""Slow calls on PostgreSQL: a live attempt is renewed, never run twice; a stale one is fenced.

Real worker processes (``effectgate.testing.worker``) share the incident's
``create_ticket`` operation through its business key; the demo ticket
service is slowed so that one call outlives several lease periods. The
assertions read the ticket service's own counters (every POST it received)
and the ledger's rows and events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate._app import StateDir
from effectgate._failpoints import EXIT_CODE, Failpoint
from effectgate.demo.services import DemoServices
from effectgate.ledger import Operation, OpState, PostgresLedger

pytestmark = [pytest.mark.crash]

LEASE_TTL_S = 1.5
"""Short, so a slow (4.5 s) call spans three lease periods and a stop outlasts the lease."""
SLOW_S = 4.5
"""Below the ticket tool's 5 s read timeout: the call is slow, not timed out."""


def _worker(sd: StateDir, thread: str, *, failpoint: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    cmd = [sys.executable, "-m", "effectgate.testing.worker", "--state-dir", str(sd.root)]
    cmd += ["--thread", thread, "--store", str(sd.store), "--lease-ttl", str(LEASE_TTL_S)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _until(what: str, ready: Callable[[], bool], *, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within_s:g} s: {what}")
        time.sleep(0.05)


def _ticket_op(url: str) -> Operation | None:
    with PostgresLedger(url) as ledger:
        ops = [op for op in ledger.list() if op.tool == "create_ticket"]
    return ops[0] if ops else None


def _in_flight(url: str, attempt: int) -> bool:
    op = _ticket_op(url)
    return op is not None and op.state is OpState.IN_FLIGHT and op.attempt == attempt


def _last(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-2000:]
    result: dict[str, object] = json.loads(lines[-1])
    return result


def test_a_slow_live_attempt_is_not_taken_over_by_another_thread(
    tmp_path: Path, postgres_url: str
) -> None:
    """Issue #32: attempt 2 is mid-request (4.5 s); resuming thread A claims no attempt 3.

    A's worker dies right after claiming the shared ``create_ticket``
    (attempt 1, nothing sent). B's worker finds A's process gone, settles
    attempt 1 and runs attempt 2 against a ticket service that answers after
    4.5 s, three lease periods, renewing B's lease meanwhile. A worker resuming
    thread A then must see attempt 2 as live and wait: the ticket service
    receives one create request in all.
    """
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        a = _worker(sd, "A", failpoint=f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@create_ticket")
        _, err = a.communicate(timeout=60)
        assert a.returncode == EXIT_CODE, err[-2000:]
        assert _in_flight(postgres_url, 1)
        assert services.stats("tickets")["create_requests"] == 0  # claimed, never sent

        services.set_fault("tickets", "slow", delay_s=SLOW_S, times=1)
        b = _worker(sd, "B")
        _until(
            "B's attempt 2 is at the ticket service",
            lambda: (
                _in_flight(postgres_url, 2) and services.stats("tickets")["create_requests"] == 1
            ),
        )
        # B is inside its 4.5 s request; resume A past a whole lease period.
        time.sleep(LEASE_TTL_S * 1.5)  # not a timed assertion: B's lease must outlive it
        a2 = _worker(sd, "A")
        resumed = _last(a2)
        # A waits for the live attempt (incomplete, "in flight ... wait for it"), claims nothing
        assert resumed["status"] == "incomplete", resumed
        assert "OperationBusyError" in str(resumed["error"]), resumed
        assert [o["attempt"] for o in resumed["operations"]] == [2]  # type: ignore[union-attr]
        finished = _last(b)
        assert finished["status"] == "done", finished
        a3 = _worker(sd, "A")
        assert _last(a3)["status"] == "done"
        # the ticket service's own records: one create request, one ticket
        assert services.stats("tickets") == {"create_requests": 1, "tickets": 1}
    op = _ticket_op(postgres_url)
    assert op is not None and op.state is OpState.SUCCEEDED and op.attempt == 2
