"""A fault-injection table (pull the plug at every persistence seam), row by row.

| fault                                      | here                                                |
|--------------------------------------------|-----------------------------------------------------|
| crash before the tool is sent              | worker killed after review / after IN_FLIGHT;       |
|                                            | an expired approval is not executed                 |
| remote success, receipt not yet written    | worker killed after the external commit             |
| receipt written, state not yet reduced     | worker killed after the ledger result               |
| retryable 429/5xx/long delay               | 503 + Retry-After with a budget; lost answers with  |
|                                            | a budget end in NEEDS_RECONCILIATION, not FAILED    |
| new version while an approval waits        | create_ticket v1 -> v2 between review and dispatch  |
| two workers on one thread                  | two worker processes; a SIGKILLed one taken over    |
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from tests.answers._bind import bound
from tests.conformance._experiments import (
    ALERT,
    BODY,
    TICKET_OP,
    TITLE,
    approve,
    approve_but_stop_before_effects,
    create_ticket_spec,
    decisions,
    effect_call,
    read_op,
    read_transitions,
    run_approving,
    script_model,
    ticket_agent,
    ticket_script,
)
from tests.conftest import run_worker, worker_cmd

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.dispatch import Dispatcher, DispatchStatus
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import Budget, EventKind, OpState, SqliteLedger
from effectgate.testing import Failpoint, FakeClock
from effectgate.testing.oracle import checkpoint_problems, world

S = OpState
TICKET_ARGS = {"title": TITLE, "body": BODY, "alert_id": ALERT}


# --------------------------------------------------------------- before dispatch


@pytest.mark.crash
@pytest.mark.parametrize(
    ("failpoint", "approve_again", "state", "attempts", "tickets"),
    [
        (Failpoint.AFTER_REVIEW_RECORDED, "all", S.SUCCEEDED, 1, 1),
        # The approval was recorded before the kill: the review is decided and
        # is not asked again, so a later "none" never reaches it.
        (Failpoint.AFTER_REVIEW_RECORDED, "none", S.SUCCEEDED, 1, 1),
        (f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@create_ticket", "all", S.SUCCEEDED, 2, 1),
    ],
    ids=["after-review-approved-again", "after-review-recorded-stands", "after-in-flight"],
)
def test_crash_before_the_tool_is_sent(
    services: DemoServices,
    state_dir: StateDir,
    tmp_path: Path,
    failpoint: str,
    approve_again: str,
    state: OpState,
    attempts: int,
    tickets: int,
) -> None:
    """Killed before sending -> at most one effect, and only if approved."""
    model = script_model(tmp_path, ticket_script())
    assert (
        run_worker(state_dir, "t1", model=model, failpoint=failpoint).returncode == ExitCode.KILLED
    )
    assert services.stats("tickets")["create_requests"] == 0
    resumed = run_worker(state_dir, "t1", model=model, approve=approve_again)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (state, attempts)
    assert len(services.tickets()) == tickets
    assert services.stats("tickets")["create_requests"] == tickets


def test_expired_approval_is_not_executed(services: DemoServices, state_dir: StateDir) -> None:
    """Crash before sending: an approval that expired before dispatch runs nothing; asked again."""
    clock = FakeClock()
    policy = Policy(approval_ttl=timedelta(minutes=5))
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url, policy=policy, clock=clock) as agent:
        pending = agent.start("task", thread_id="t1")
        approve_but_stop_before_effects(agent, "t1", pending)
        assert _state(state_dir) is S.APPROVED
        clock.advance(timedelta(minutes=6))
        again = agent.resume("t1")
        assert again.status is RunStatus.WAITING_REVIEW
        assert "expired" in again.interrupts[0].value["action_requests"][0]["description"]
        assert services.stats("tickets")["create_requests"] == 0
        assert _state(state_dir) is S.PROPOSED
        done = agent.resume("t1", decisions=bound(agent, "t1", decisions(again)))
    assert done.status is RunStatus.DONE
    assert (read_op(state_dir.ledger).state, read_op(state_dir.ledger).attempt) == (
        S.SUCCEEDED,
        1,
    )
    assert len(services.tickets()) == 1


def test_expired_approval_refused_by_the_dispatcher(services: DemoServices, tmp_path: Path) -> None:
    """Crash before sending, in the dispatcher: an expired approval is withdrawn, nothing runs."""
    clock = FakeClock()
    spec = create_ticket_spec(services.endpoints.ticket_url)
    call = effect_call(spec, TICKET_ARGS)
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as ledger:
        approve(ledger, spec, call, expires_at=clock.now() + timedelta(minutes=5))
        clock.advance(timedelta(minutes=6))
        outcome = Dispatcher(ledger, {spec.name: spec}, worker="w", clock=clock).dispatch(call)
    assert outcome.status is DispatchStatus.NEEDS_REVIEW
    assert "expired" in outcome.message
    op = read_op(tmp_path / "ledger.sqlite3")
    assert (op.state, op.attempt) == (S.PROPOSED, 0)
    assert services.stats("tickets")["create_requests"] == 0


# ----------------------------------------------------- after the remote success


@pytest.mark.crash
@pytest.mark.parametrize("tool", ["create_ticket", "send_email"])
def test_crash_after_remote_success_before_the_receipt(
    services: DemoServices, state_dir: StateDir, tool: str
) -> None:
    """Remote success, receipt not written: UNKNOWN, then reconciled; no second ticket or mail."""
    spec = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@{tool}"
    assert run_worker(state_dir, "t1", failpoint=spec).returncode == ExitCode.KILLED
    with SqliteLedger(state_dir.ledger) as ledger:
        (left,) = ledger.list(tool=tool)
    assert (left.state, left.attempt, left.receipt) == (S.IN_FLIGHT, 1, None)
    resumed = run_worker(state_dir, "t1")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
    assert services.stats("tickets")["create_requests"] == 1
    assert services.stats("mail")["data_commands"] == 1
    op = read_op(state_dir.ledger, left.operation_id)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.source == "reconcile"
    trail = read_transitions(state_dir.ledger, left.operation_id)
    assert trail[-2:] == [(S.IN_FLIGHT, S.UNKNOWN, 1), (S.UNKNOWN, S.SUCCEEDED, 1)]


@pytest.mark.crash
def test_crash_after_the_receipt_before_the_state_update(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Receipt written, state not reduced: in the ledger, not the checkpoint -> reused, no call."""
    model = script_model(tmp_path, ticket_script())
    spec = f"{Failpoint.AFTER_LEDGER_RESULT}@create_ticket"
    assert run_worker(state_dir, "t1", model=model, failpoint=spec).returncode == ExitCode.KILLED
    stored = read_op(state_dir.ledger)
    assert (stored.state, stored.attempt) == (S.SUCCEEDED, 1)
    resumed = run_worker(state_dir, "t1", model=model)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.summary["status"] == "done"
    assert len(services.tickets()) == 1
    assert services.stats("tickets")["create_requests"] == 1
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt, op.receipt) == (S.SUCCEEDED, 1, stored.receipt)
    with SqliteLedger(state_dir.ledger) as ledger:
        kinds = [e.kind for e in ledger.events(operation_id=TICKET_OP)]
    assert EventKind.RESULT_REUSED in kinds
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


# ----------------------------------------------------- 429/5xx, delay and budget


def test_unavailable_backs_off_within_a_budget(services: DemoServices, state_dir: StateDir) -> None:
    """Retryable fault: 503 + Retry-After -> waits that honour it, 3 attempts, then FAILED."""
    services.set_fault("tickets", "unavailable", retry_after_s=2)
    clock = FakeClock()
    policy = Policy(budget=Budget(max_attempts=3, backoff_base_s=0.5, backoff_cap_s=30))
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url, policy=policy, clock=clock) as agent:
        run_approving(agent, "t1")
        events = agent.ledger.events(operation_id=TICKET_OP)
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.FAILED, 3)  # 503 means "not accepted": known not applied
    assert services.tickets() == []
    assert services.stats("tickets")["create_requests"] == 3  # no fourth request
    waits = [e for e in events if e.dst is S.RETRY_WAIT]
    delays = [
        (datetime.fromisoformat(e.detail["next_attempt_at"]) - e.at).total_seconds() for e in waits
    ]
    assert len(delays) == 2 and all(d >= 2.0 for d in delays)  # never before Retry-After
    assert clock.slept == pytest.approx(delays, abs=1e-3)


@pytest.mark.parametrize(("max_attempts", "state"), [(1, S.NEEDS_RECONCILIATION), (2, None)])
def test_lost_answers_exhaust_the_budget_without_claiming_failure(
    services: DemoServices, tmp_path: Path, max_attempts: int, state: OpState | None
) -> None:
    """Retryable fault: answers lost after the commit; a spent budget is NEEDS_RECONCILIATION."""
    services.set_fault("tickets", "reset-after-commit", times=max_attempts)
    # create_ticket without its lookup: after a lost answer, only a same-key replay is safe.
    spec = dataclasses.replace(create_ticket_spec(services.endpoints.ticket_url), reconciler=None)
    call = effect_call(spec, TICKET_ARGS)
    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        approve(ledger, spec, call, budget=Budget(max_attempts=max_attempts))
        outcome = Dispatcher(ledger, {spec.name: spec}, worker="w").dispatch(call)
    op = read_op(tmp_path / "ledger.sqlite3")
    assert (op.state, op.attempt) == (S.NEEDS_RECONCILIATION, max_attempts)
    assert outcome.status is DispatchStatus.NEEDS_RECONCILIATION
    assert state in (None, op.state)
    # FAILED would have been false: the service holds exactly one ticket for the key.
    (ticket,) = services.tickets()
    assert ticket["idempotency_key"] == TICKET_OP
    assert services.stats("tickets")["create_requests"] == max_attempts


# ------------------------------------------------------- tool version changes


def test_version_change_while_the_review_is_pending(
    services: DemoServices, state_dir: StateDir
) -> None:
    """New tool version: v1 shown for review, v2 deployed, reviewer approves -> nothing runs."""
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url, version="1") as v1:
        pending = v1.start("task", thread_id="t1")
        shown = pending.interrupts[0].value["action_requests"][0]["intent_hash"]
    with ticket_agent(state_dir.root, url, version="2") as v2:
        answer = decisions(v2.status("t1"))
        result = v2.resume("t1", decisions=bound(v2, "t1", answer))
        approved = [a.intent_hash for a in v2.ledger.approvals(TICKET_OP)]
    assert services.stats("tickets")["create_requests"] == 0
    assert services.tickets() == []
    assert all(h == shown for h in approved), "an approval names an intent nobody was shown"
    if result.status is RunStatus.WAITING_REVIEW:  # asked again: now showing what would run
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["intent_hash"] != shown


def test_version_change_after_approval_refuses_the_old_approval(
    services: DemoServices, state_dir: StateDir
) -> None:
    """New tool version: approved under v1, resumed under v2 -> the approval is not used."""
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url, version="1") as v1:
        approve_but_stop_before_effects(v1, "t1", v1.start("task", thread_id="t1"))
        assert _state(state_dir) is S.APPROVED
    with ticket_agent(state_dir.root, url, version="2") as v2:
        result = v2.resume("t1")
        for _ in range(2):  # whatever a reviewer answers now, v1's approval runs nothing
            if result.status is not RunStatus.WAITING_REVIEW:
                break
            result = v2.resume("t1", decisions=bound(v2, "t1", decisions(result)))
    assert services.stats("tickets")["create_requests"] == 0
    assert services.tickets() == []
    op = read_op(state_dir.ledger)
    assert (op.tool_version, op.attempt) == ("1", 0)
    assert op.state in (S.APPROVED, S.PROPOSED, S.REJECTED)


def test_version_change_after_approval_answers_the_call_as_not_executed(
    services: DemoServices, state_dir: StateDir
) -> None:
    """New tool version: the v1 call is refused and answered; the thread can finish."""
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url, version="1") as v1:
        approve_but_stop_before_effects(v1, "t1", v1.start("task", thread_id="t1"))
    with ticket_agent(state_dir.root, url, version="2") as v2:
        result = v2.resume("t1")
        for _ in range(3):
            if result.status is not RunStatus.WAITING_REVIEW:
                break
            result = v2.resume("t1", decisions=bound(v2, "t1", decisions(result, "reject")))
    assert result.status is RunStatus.DONE
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.REJECTED, 0)
    assert services.tickets() == []


# --------------------------------------------------------- two workers, one thread


@pytest.mark.crash
def test_two_workers_on_one_thread(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Two workers start one thread; one runs it, one ticket."""
    services.set_fault("tickets", "slow", delay_s=1.0)
    model = script_model(tmp_path, ticket_script())
    cmd = worker_cmd(state_dir, "t1", "--model", model)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=60) for p in procs)
    for p in procs:
        assert p.stdout is not None
        p.stdout.close()
    assert codes in ([0, 75], [0, 0]), codes
    assert len(services.tickets()) == 1
    assert services.stats("tickets")["create_requests"] == 1
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)


@pytest.mark.crash
def test_killed_worker_is_taken_over_and_its_attempt_reconciled_first(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Two workers: the old attempt is marked UNKNOWN before the new worker acts."""
    services.set_fault("tickets", "slow", delay_s=1.5)
    model = script_model(tmp_path, ticket_script())
    old = subprocess.Popen(
        worker_cmd(state_dir, "t1", "--model", model),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until the old worker's request is out
        if state_dir.ledger.exists() and _state(state_dir) is S.IN_FLIGHT:
            break
        time.sleep(0.02)
    old.send_signal(signal.SIGKILL)
    old.wait()
    services.set_fault("tickets", "normal")
    taken = run_worker(state_dir, "t1", model=model)
    assert taken.returncode == 0, taken.stderr[-2000:]
    op = read_op(state_dir.ledger)
    trail = read_transitions(state_dir.ledger)
    assert trail[trail.index((S.APPROVED, S.IN_FLIGHT, 1)) + 1] == (S.IN_FLIGHT, S.UNKNOWN, 1)
    assert op.state is S.SUCCEEDED and op.attempt in (1, 2)
    time.sleep(1.6)  # let the dead worker's slow request finish on the server
    (ticket,) = services.tickets()
    assert ticket["idempotency_key"] == TICKET_OP
    assert op.receipt is not None and op.receipt.result["ticket_id"] == ticket["ticket_id"]


def _state(sd: StateDir) -> OpState | None:
    with SqliteLedger(sd.ledger) as ledger:
        op = ledger.get(TICKET_OP)
    return None if op is None else op.state
