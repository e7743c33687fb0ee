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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.ledger import EventKind, Lease, Operation, OpState, PostgresLedger
from effectgate.testing import Failpoint

pytestmark = [pytest.mark.crash]

LEASE_TTL_S = 1.5
"""Short, so a slow (4.5 s) call spans three lease periods and a stop outlasts the lease."""
SLOW_S = 4.5
"""Below the ticket tool's 5 s read timeout: the call is slow, not timed out."""


def _worker(
    sd: StateDir, thread: str, *, failpoint: str | None = None, go_file: Path | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    cmd = [sys.executable, "-m", "effectgate.testing.worker", "--state-dir", str(sd.root)]
    cmd += ["--thread", thread, "--store", str(sd.store), "--lease-ttl", str(LEASE_TTL_S)]
    cmd += ["--go-file", str(go_file)] if go_file else []
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


def _lease(url: str, thread: str) -> Lease:
    with PostgresLedger(url) as ledger, ledger._store.read() as r:
        lease = r.get_lease(thread)
    assert lease is not None, f"thread {thread!r} has no lease"
    return lease


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
        assert a.returncode == ExitCode.KILLED, err[-2000:]
        assert _in_flight(postgres_url, 1)
        assert services.stats("tickets")["create_requests"] == 0  # claimed, never sent

        services.set_fault("tickets", "slow", delay_s=SLOW_S)
        go = tmp_path / "go"
        a2 = _worker(sd, "A", go_file=go)  # ready ahead of time, runs once told
        b = _worker(sd, "B")
        _until(
            "B's attempt 2 is at the ticket service",
            lambda: (
                _in_flight(postgres_url, 2) and services.stats("tickets")["create_requests"] == 1
            ),
        )
        # B is inside its 4.5 s request; resume A once B's lease as first taken has lapsed
        first_expiry = _lease(postgres_url, "B").expires_at
        _until("B's first lease term is over", lambda: datetime.now(UTC) > first_expiry)
        go.touch()
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


def _lease_expired(url: str, thread: str) -> bool:
    return _lease(url, thread).expires_at <= datetime.now(UTC)


def test_a_worker_stopped_past_its_lease_has_its_late_result_fenced_off(
    tmp_path: Path, postgres_url: str
) -> None:
    """SIGSTOP mid-call past the lease; a takeover runs attempt 2; SIGCONT: attempt 1 is refused.

    Worker 1 sends the create (the service holds it 12 s) and is stopped.
    Its heartbeats stop with it, so after one lease the thread is taken over:
    attempt 1 becomes UNKNOWN (charged: its worker lives), the lookup finds
    no ticket yet, attempt 2 creates it with the same Idempotency-Key.
    Continued, worker 1's late answer for attempt 1 must not replace attempt
    2's outcome: the ledger keeps attempt 2's receipt and records the late
    answer as a fenced-off note; the service holds one ticket.
    """
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        services.set_fault("tickets", "slow", delay_s=12.0)
        first = _worker(sd, "S")
        try:
            _until(
                "attempt 1 is at the ticket service",
                lambda: (
                    _in_flight(postgres_url, 1)
                    and services.stats("tickets")["create_requests"] == 1
                ),
            )
            first.send_signal(signal.SIGSTOP)
            services.set_fault("tickets", "normal")  # "slow" lasts until changed
            _until("the stopped worker's lease lapsed", lambda: _lease_expired(postgres_url, "S"))
            second = _worker(sd, "S")
            taken = _last(second)
            assert taken["status"] == "done", taken
            op = _ticket_op(postgres_url)
            assert op is not None and op.state is OpState.SUCCEEDED and op.attempt == 2
        finally:
            first.send_signal(signal.SIGCONT)
        late = _last(first)
        # the continued worker is told its attempt was fenced off, and sends nothing more
        assert "ClaimLostError" in str(late["error"]), late
        assert services.stats("tickets") == {"create_requests": 2, "tickets": 1}  # one key
        assert services.stats("mail") == {"data_commands": 1, "messages": 1}
    with PostgresLedger(postgres_url) as ledger:
        op = ledger.get("ticket:orders-error-rate")
        events = ledger.events(operation_id="ticket:orders-error-rate")
    assert op is not None and op.state is OpState.SUCCEEDED and op.attempt == 2
    assert op.receipt is not None and op.receipt.attempt == 2  # attempt 2's outcome stays
    fenced = [e for e in events if e.kind is EventKind.NOTE and "fenced_attempt" in e.detail]
    assert [e.detail["fenced_attempt"] for e in fenced] == [1], [e.detail for e in events]
    successes = [e for e in events if e.dst is OpState.SUCCEEDED]
    assert len(successes) == 1  # never two successes
