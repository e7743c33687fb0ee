"""Recovery never takes over an attempt whose worker may still be running it.

Thread A's approved keyed ``create_ticket`` is killed right after its IN_FLIGHT
commit. Thread B needs the same business-keyed operation, recovers it (A's
worker is gone) and is mid-request on attempt 2 against a slow ticket service.
Thread A is resumed meanwhile: its start-up sweep and its dispatch must leave
B's live attempt alone (the run stops busy), so the service receives one
create request in all, counted by the service itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate import open_agent
from effectgate.cli import ExitCode
from effectgate.demo import DemoServices
from effectgate.graph import RunStatus
from effectgate.ledger import EventKind, OpState, SqliteLedger
from effectgate.models import ScriptedChatModel
from effectgate.tools import ticket_tools
from tests.recovery._kit import KEY, SCRIPT, wait_until, worker

pytestmark = [pytest.mark.crash, pytest.mark.slow]

SLOW_S = 10.0
"""How long the ticket service sits on thread B's create request, in seconds."""


def _resume_a(state: Path, url: str) -> tuple[RunStatus, str | None]:
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state, model=model, tools=ticket_tools(url, timeout_s=60)) as agent:
        result = agent.resume("A")
    return result.status, result.error


def test_a_resumed_thread_leaves_another_threads_live_attempt_alone(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with DemoServices(tmp_path / "services") as services:
        url = services.endpoints.ticket_url
        crashed = worker(tmp_path, state, url, "A", failpoint="AFTER_IN_FLIGHT_COMMIT")
        out, err = crashed.communicate(timeout=120)
        assert crashed.returncode == ExitCode.KILLED, (out, err)
        assert services.stats("tickets")["create_requests"] == 0  # killed before the call

        services.set_fault("tickets", "slow", delay_s=SLOW_S)
        taker = worker(tmp_path, state, url, "B")
        try:
            wait_until(
                lambda: services.stats("tickets")["create_requests"] == 1,
                "thread B's create request reached the service",
            )
            status, error = _resume_a(state, url)
            # nothing more reached the service while B's request was under way
            assert services.stats("tickets")["create_requests"] == 1
            assert status is RunStatus.INCOMPLETE
            assert error is not None and "OperationBusyError" in error, error
            assert "is in flight in thread 'B'" in error

            out, err = taker.communicate(timeout=120)
            assert taker.returncode == 0, err
            assert json.loads(out.splitlines()[-1])["status"] == "done"
        finally:
            if taker.poll() is None:
                taker.kill()
                taker.communicate()
        services.set_fault("tickets", "normal")

        status, error = _resume_a(state, url)  # A now reuses B's ticket
        assert (status, error) == (RunStatus.DONE, None)
        assert services.stats("tickets")["create_requests"] == 1
        assert [t["idempotency_key"] for t in services.tickets()] == [KEY]
    with SqliteLedger(state / "ledger.sqlite3") as ledger:
        op = ledger.get(KEY)
        assert op is not None and (op.state, op.attempt) == (OpState.SUCCEEDED, 2)
        claims = [e for e in ledger.events(operation_id=KEY) if e.dst is OpState.IN_FLIGHT]
        assert [e.detail.get("thread_id") for e in claims] == [None, "B"]
        assert all(e.kind is EventKind.TRANSITION for e in claims)
