"""The ticket experiments: one ``create_ticket`` write under injected faults.

Each experiment creates one ticket on the demo ticket service while something
goes wrong (a lost answer, a crash after the remote commit, a 503, a business
rejection, an unreachable lookup, a reused operation id, a deadline) and
asserts the expected outcome twice: on the ticket service's own SQLite rows (and
its request counter), and on the ledger (state, attempts, transitions). Each
fault is a ``DemoServices`` fault; the "max attempts" of an experiment is the
graph's ``Policy(budget=Budget(max_attempts=N))``; a process exit is a real
worker process killed at a failpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.answers._bind import bound
from tests.conformance._experiments import (
    ALERT,
    BODY,
    HOLD_S,
    TICKET_OP,
    TITLE,
    approve,
    create_ticket_spec,
    decisions,
    effect_call,
    read_op,
    read_transitions,
    run_approving,
    run_py,
    runner_args,
    script_model,
    ticket_agent,
    ticket_script,
    tickets_for,
    transitions,
)
from tests.conftest import run_worker

from effectgate import StateDir, open_agent
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.dispatch import Dispatcher, DispatchStatus, Verdict
from effectgate.errors import DecisionError, Rejected
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import Budget, EventKind, OpState, SqliteLedger
from effectgate.testing import Failpoint, FakeClock
from effectgate.testing.oracle import world
from effectgate.tools import ToolContext

S = OpState


def _claims(trail: Sequence[tuple[Any, ...]]) -> int:
    return sum(1 for _, dst, _ in trail if dst == S.IN_FLIGHT)


def test_4_4_normal_run_twice_reuses_the_result(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Run twice -> one ticket, attempts 1; the second run reuses the result."""
    model = script_model(tmp_path, ticket_script())
    assert run_worker(state_dir, "run-1", model=model).returncode == 0
    # The very same command again, then a new run of the same task (same alert).
    assert run_worker(state_dir, "run-1", model=model).returncode == 0
    assert run_worker(state_dir, "run-2", model=model).returncode == 0

    (ticket,) = services.tickets()
    assert ticket["idempotency_key"] == TICKET_OP
    assert services.stats("tickets")["create_requests"] == 1
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.reference == f"TICKET-{ticket['ticket_id']}"
    with SqliteLedger(state_dir.ledger) as ledger:
        assert _claims(transitions(ledger, TICKET_OP)) == 1
        kinds = [e.kind for e in ledger.events(operation_id=TICKET_OP)]
    assert EventKind.RESULT_REUSED in kinds, "the second run must read the stored receipt back"
    with open_agent(state_dir, model=model, endpoints=services.endpoints) as agent:
        second = agent.status("run-2")
    assert second.status is RunStatus.DONE
    assert f"TICKET-{ticket['ticket_id']}" in (second.final_message or "")


def test_4_5_timeout_after_commit_settles_from_the_receipt(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Lost response, max attempts 1 -> IN_FLIGHT, UNKNOWN, SUCCEEDED; one ticket."""
    services.set_fault("tickets", "timeout-after-commit", delay_s=HOLD_S)
    policy = Policy(budget=Budget(max_attempts=1))
    with ticket_agent(state_dir.root, services.endpoints.ticket_url, policy=policy) as agent:
        result = run_approving(agent, "t1")
    assert result.status is RunStatus.DONE
    (ticket,) = services.tickets()
    assert services.stats("tickets")["create_requests"] == 1
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt, op.budget.max_attempts) == (S.SUCCEEDED, 1, 1)
    assert op.receipt is not None and op.receipt.source == "reconcile"
    assert op.receipt.result["ticket_id"] == ticket["ticket_id"]
    assert read_transitions(state_dir.ledger)[-3:] == [
        (S.APPROVED, S.IN_FLIGHT, 1),
        (S.IN_FLIGHT, S.UNKNOWN, 1),
        (S.UNKNOWN, S.SUCCEEDED, 1),
    ]
    assert f"TICKET-{ticket['ticket_id']}" in (result.final_message or "")


@pytest.mark.crash
def test_4_6_crash_after_commit_recovers_in_a_new_process(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """The agent dies after the remote commit; a new process finds the ticket."""
    model = script_model(tmp_path, ticket_script())
    spec = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket"
    crashed = run_worker(state_dir, "t1", model=model, failpoint=spec)
    assert crashed.returncode == ExitCode.KILLED, crashed.stderr[-2000:]
    left = read_op(state_dir.ledger)
    assert (left.state, left.attempt) == (S.IN_FLIGHT, 1)
    assert len(services.tickets()) == 1

    resumed = run_worker(state_dir, "t1", model=model)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (ticket,) = services.tickets()
    log = (state_dir.services / "tickets.log").read_text()[-1500:]
    trail = read_transitions(state_dir.ledger)
    assert services.stats("tickets")["create_requests"] == 1, (trail, log)
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.reference == f"TICKET-{ticket['ticket_id']}"
    assert (S.IN_FLIGHT, S.UNKNOWN, 1) in trail and (S.UNKNOWN, S.SUCCEEDED, 1) in trail
    assert _claims(trail) == 1


@pytest.mark.parametrize(("retry_after_s", "floor_s"), [(1, 1.0), (0, 0.0)])
def test_4_7_transient_once_retries_after_a_backoff(
    services: DemoServices, state_dir: StateDir, retry_after_s: int, floor_s: float
) -> None:
    """One refusal (503) -> RETRY_WAIT with a backoff, 2 attempts, one ticket."""
    services.set_fault("tickets", "transient-once", retry_after_s=retry_after_s)
    clock = FakeClock()
    base_s = 0.2
    policy = Policy(budget=Budget(max_attempts=3, backoff_base_s=base_s))
    with ticket_agent(
        state_dir.root, services.endpoints.ticket_url, policy=policy, clock=clock
    ) as agent:
        result = run_approving(agent, "t1")
        events = agent.ledger.events(operation_id=TICKET_OP)
    assert result.status is RunStatus.DONE
    assert len(services.tickets()) == 1
    assert services.stats("tickets")["create_requests"] == 2
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 2)
    (wait,) = [e for e in events if e.dst is S.RETRY_WAIT]
    next_at = datetime.fromisoformat(wait.detail["next_attempt_at"])
    delay_s = (next_at - wait.at).total_seconds()
    # Full jitter over [0, base], never earlier than the server's Retry-After.
    assert floor_s <= delay_s <= max(floor_s, base_s)
    (second,) = [e for e in events if e.dst is S.IN_FLIGHT and e.attempt == 2]
    assert second.at >= next_at.replace(microsecond=next_at.microsecond // 1000 * 1000)
    assert clock.slept == [pytest.approx(delay_s, abs=1e-3)]


def test_4_7_unavailable_exhausts_the_budget_and_a_restart_keeps_it(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Unavailable, max attempts 2 -> FAILED, 0 tickets; a max of 99 later: same."""
    services.set_fault("tickets", "unavailable", retry_after_s=0)
    policy = Policy(budget=Budget(max_attempts=2, backoff_base_s=0.05))
    with ticket_agent(state_dir.root, services.endpoints.ticket_url, policy=policy) as agent:
        run_approving(agent, "t1")
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt, op.budget.max_attempts) == (S.FAILED, 2, 2)
    assert services.tickets() == []
    assert services.stats("tickets")["create_requests"] == 2
    assert read_transitions(state_dir.ledger)[-4:] == [
        (S.APPROVED, S.IN_FLIGHT, 1),
        (S.IN_FLIGHT, S.RETRY_WAIT, 1),
        (S.RETRY_WAIT, S.IN_FLIGHT, 2),
        (S.IN_FLIGHT, S.FAILED, 2),
    ]

    # Restart in a new process with max attempts 99 and a healthy service: the
    # old thread, and a new run of the same task, both find the stored budget.
    services.set_fault("tickets", "normal")
    model = script_model(tmp_path, ticket_script())
    for thread in ("t1", "t2"):
        args = runner_args(state_dir, thread, model)
        proc = run_py("runner_main", *args, "--max-attempts", "99")
        assert proc.returncode == 0, proc.stderr[-2000:]
    after = read_op(state_dir.ledger)
    assert (after.state, after.attempt, after.budget.max_attempts) == (S.FAILED, 2, 2)
    assert after.updated_at == op.updated_at
    assert services.tickets() == []
    assert services.stats("tickets")["create_requests"] == 2


def test_4_7_reject_fails_at_once_without_retry(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A business rejection (422) -> FAILED at once, no retry, 0 tickets."""
    services.set_fault("tickets", "reject")
    with ticket_agent(state_dir.root, services.endpoints.ticket_url) as agent:
        result = run_approving(agent, "t1")
    assert result.status is RunStatus.DONE
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt, op.budget.max_attempts) == (S.FAILED, 1, 3)
    assert "rejected" in (op.error or "")
    trail = read_transitions(state_dir.ledger)
    assert trail[-1] == (S.IN_FLIGHT, S.FAILED, 1)
    assert all(dst is not S.RETRY_WAIT for _, dst, _ in trail)
    assert services.tickets() == []
    assert services.stats("tickets")["create_requests"] == 1


@pytest.mark.crash
def test_4_8_ambiguous_unqueryable_stops_for_reconciliation(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """Lost answer + no lookup -> NEEDS_RECONCILIATION, exit 3, the oracle sees 1."""
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=HOLD_S)
    model = script_model(tmp_path, ticket_script())
    first = run_worker(state_dir, "t1", model=model)
    assert first.returncode == 3, (first.summary, first.stderr[-2000:])
    assert first.summary["status"] == "waiting_reconciliation"
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.NEEDS_RECONCILIATION, 1)
    assert read_transitions(state_dir.ledger)[-3:] == [
        (S.APPROVED, S.IN_FLIGHT, 1),
        (S.IN_FLIGHT, S.UNKNOWN, 1),
        (S.UNKNOWN, S.NEEDS_RECONCILIATION, 1),
    ]
    assert world(state_dir).tickets == 1  # the oracle reads the service's file directly

    # Another process does not submit again: automatic submission has stopped.
    again = run_worker(state_dir, "t1", model=model)
    assert again.returncode == 3
    assert services.stats("tickets")["create_requests"] == 1
    assert read_op(state_dir.ledger).attempt == 1

    # A human who checked the service settles it with evidence; nothing is re-sent.
    (ticket,) = services.tickets()
    verdict = Verdict(verdict="succeeded", reference=f"TICKET-{ticket['ticket_id']}")
    with open_agent(state_dir, model=model, endpoints=services.endpoints) as agent:
        done = agent.resume("t1", verdicts={TICKET_OP: verdict})
    assert done.status is RunStatus.DONE
    settled = read_op(state_dir.ledger)
    assert (settled.state, settled.attempt) == (S.SUCCEEDED, 1)
    assert settled.receipt is not None and settled.receipt.source == "human"
    assert services.stats("tickets")["create_requests"] == 1


def test_4_9_same_operation_with_another_title_is_a_conflict(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The same operation id with another title is refused, never executed."""
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url) as agent:
        assert run_approving(agent, "t1").status is RunStatus.DONE
    other = ticket_script(title="another, different ticket")
    with ticket_agent(state_dir.root, url, script=other) as agent:
        pending = agent.start("again", thread_id="t2")
        (action,) = pending.interrupts[0].value["action_requests"]
        assert action["operation_id"] == TICKET_OP
        assert action["conflict"]["stored_args"]["title"] == TITLE
        assert pending.interrupts[0].value["review_configs"][0]["allowed_decisions"] == [
            "edit",
            "reject",
        ]
        with pytest.raises(DecisionError):
            agent.resume("t2", decisions=bound(agent, "t2", decisions(pending, "approve")))
        assert (
            agent.resume("t2", decisions=bound(agent, "t2", decisions(pending, "reject"))).status
            is RunStatus.DONE
        )
        # Below the graph the dispatcher refuses the conflicting intent the same way.
        spec = create_ticket_spec(url)
        call = effect_call(
            spec,
            {"title": "another, different ticket", "body": BODY, "alert_id": ALERT},
            thread="t3",
        )
        outcome = Dispatcher(agent.ledger, {spec.name: spec}, worker="w").dispatch(call)
        assert outcome.status is DispatchStatus.CONFLICT
    # The ticket service enforces the same rule on its key (HTTP 409).
    spec = create_ticket_spec(url)
    ctx = ToolContext(operation_id=TICKET_OP, thread_id="x", tool_call_id="x", attempt=1)
    with pytest.raises(Rejected, match="409"):
        spec.call(
            spec.normalize({"title": "another, different ticket", "body": BODY, "alert_id": ALERT}),
            ctx,
        )
    (ticket,) = services.tickets()
    assert ticket["title"] == TITLE
    assert services.stats("tickets")["create_requests"] == 2  # the first run + the direct 409
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt, op.args["title"]) == (S.SUCCEEDED, 1, TITLE)


def test_4_9_a_new_operation_id_creates_a_second_ticket(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A genuinely new ticket takes a new operation id -> 2 tickets."""
    url = services.endpoints.ticket_url
    with ticket_agent(state_dir.root, url) as agent:
        assert run_approving(agent, "t1").status is RunStatus.DONE
    second = ticket_script(title="another, different ticket", alert_id=f"{ALERT}-2")
    with ticket_agent(state_dir.root, url, script=second) as agent:
        assert run_approving(agent, "t2").status is RunStatus.DONE
    tickets = services.tickets()
    assert [t["idempotency_key"] for t in tickets] == [TICKET_OP, f"ticket:{ALERT}-2"]
    assert len(tickets_for(tickets, ALERT)) == 1
    with SqliteLedger(state_dir.ledger) as ledger:
        ops = ledger.list(tool="create_ticket")
    assert [(o.operation_id, o.state, o.attempt) for o in ops] == [
        (TICKET_OP, S.SUCCEEDED, 1),
        (f"ticket:{ALERT}-2", S.SUCCEEDED, 1),
    ]


def test_4_10_a_sent_write_is_confirmed_after_the_deadline(
    services: DemoServices, tmp_path: Path
) -> None:
    """The deadline stops new submissions, not the confirmation of a sent one."""
    services.set_fault("tickets", "timeout-after-commit", delay_s=HOLD_S)
    spec = create_ticket_spec(services.endpoints.ticket_url)
    call = effect_call(spec, {"title": TITLE, "body": BODY, "alert_id": ALERT})
    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        # The answer is lost after the client's 1 s timeout, past this deadline.
        deadline = ledger.clock.now() + timedelta(seconds=0.8)
        approve(ledger, spec, call, budget=Budget(deadline_at=deadline))
        outcome = Dispatcher(ledger, {spec.name: spec}, worker="w").dispatch(call)
        events = ledger.events(operation_id=call.operation_id)
    (claimed,) = [e for e in events if e.dst is S.IN_FLIGHT]
    (settled,) = [e for e in events if e.dst is S.SUCCEEDED]
    assert claimed.at < deadline <= settled.at
    assert outcome.status is DispatchStatus.SUCCEEDED
    op = read_op(tmp_path / "ledger.sqlite3")
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.source == "reconcile"
    assert len(services.tickets()) == 1
    assert services.stats("tickets")["create_requests"] == 1
