"""Lost acknowledgements, racing claimers, stale acks, and a system with no idempotency.

Where a naive approach fails, the naive path is written out
here on purpose (a retry loop with a new key per attempt; an outbox marked done
before sending) and its bad outcome is asserted next to effectgate's. Process
deaths are real: a subprocess exits through a failpoint or ``os._exit``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.conformance._experiments import (
    ALERT,
    BODY,
    REPO,
    TICKET_OP,
    TITLE,
    approve,
    create_ticket_spec,
    dispatch_args,
    effect_call,
    external_ledger_tool,
    external_rows,
    py_cmd,
    py_env,
    read_op,
    read_transitions,
    run_approving,
    run_py,
    runner_args,
    script_model,
    ticket_agent,
    ticket_script,
    tickets_for,
)
from tests.conftest import run_worker

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.dispatch import Dispatcher, DispatchStatus, Verdict
from effectgate.errors import ClaimLostError, OutcomeUnknown
from effectgate.graph import RunStatus
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing import Failpoint
from effectgate.tools import ToolContext, ToolResult

S = OpState
TICKET_ARGS = {"title": TITLE, "body": BODY, "alert_id": ALERT}


def test_lost_ack_naive_sender_duplicates_effectgate_does_not(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A naive retry vs an idempotent one: committed, then the ack is lost."""
    url = services.endpoints.ticket_url
    spec = create_ticket_spec(url)
    args = spec.normalize({**TICKET_ARGS, "alert_id": "naive-alert"})

    # Naive sender: "failed, so try again", each attempt a new request id.
    services.set_fault("tickets", "reset-after-commit")
    for attempt in (1, 2, 3):
        ctx = ToolContext(
            operation_id=f"naive:{attempt}", thread_id="naive", tool_call_id="c", attempt=attempt
        )
        try:
            spec.call(args, ctx)
            break
        except OutcomeUnknown:
            continue
    assert len(tickets_for(services.tickets(), "naive-alert")) == 2  # one alert, two tickets

    # effectgate, same fault: the unknown outcome is looked up by the original key.
    services.set_fault("tickets", "reset-after-commit")
    with ticket_agent(state_dir.root, url) as agent:
        assert run_approving(agent, "t1").status is RunStatus.DONE
    (ticket,) = tickets_for(services.tickets(), ALERT)
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.result["ticket_id"] == ticket["ticket_id"]
    assert (S.IN_FLIGHT, S.UNKNOWN, 1) in read_transitions(state_dir.ledger)


@pytest.mark.crash
def test_marking_done_before_sending_loses_the_task(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """An outbox marked done before sending: naive loses it; IN_FLIGHT keeps it."""
    url = services.endpoints.ticket_url
    outbox = tmp_path / "outbox.sqlite3"
    with contextlib.closing(sqlite3.connect(outbox)) as conn, conn:
        conn.execute("CREATE TABLE tasks (task_id TEXT PRIMARY KEY, status TEXT NOT NULL)")
        conn.execute("INSERT INTO tasks VALUES ('naive-alert', 'pending')")
    naive = ["--outbox", str(outbox), "--url", url]
    assert run_py("naive_sender_main", *naive, "--die-after-mark").returncode == 70
    restarted = run_py("naive_sender_main", *naive)
    assert restarted.returncode == 0 and json.loads(restarted.stdout) == {"sent": 0}
    with contextlib.closing(sqlite3.connect(outbox)) as conn:
        assert conn.execute("SELECT status FROM tasks").fetchall() == [("done",)]
    assert tickets_for(services.tickets(), "naive-alert") == []  # "done", and no ticket

    # effectgate dies at the same point: intent durable, nothing sent yet.
    model = script_model(tmp_path, ticket_script())
    spec = f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@create_ticket"
    assert run_worker(state_dir, "t1", model=model, failpoint=spec).returncode == ExitCode.KILLED
    left = read_op(state_dir.ledger)
    assert (left.state, left.attempt) == (S.IN_FLIGHT, 1)  # not "done": outcome unknown
    assert services.stats("tickets")["create_requests"] == 0
    assert run_worker(state_dir, "t1", model=model).returncode == 0
    (ticket,) = tickets_for(services.tickets(), ALERT)
    assert ticket["idempotency_key"] == TICKET_OP
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 2)
    assert read_transitions(state_dir.ledger)[-4:] == [
        (S.IN_FLIGHT, S.UNKNOWN, 1),
        (S.UNKNOWN, S.RETRY_WAIT, 1),
        (S.RETRY_WAIT, S.IN_FLIGHT, 2),
        (S.IN_FLIGHT, S.SUCCEEDED, 2),
    ]


def _claimers(ledger_path: Path, operation_id: str) -> list[str]:
    """Who claimed each attempt, from the IN_FLIGHT events."""
    with SqliteLedger(ledger_path) as ledger:
        events = ledger.events(operation_id=operation_id)
    return [e.detail["worker"] for e in events if e.dst is S.IN_FLIGHT]


def _kill_ticket_server(services: DemoServices) -> None:
    pid = json.loads((services.data_dir / "tickets.ready.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while services.alive("tickets") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not services.alive("tickets")


def test_receiver_exits_after_writing_a_complete_response(
    services: DemoServices, tmp_path: Path
) -> None:
    """The receiver dies after answering; the answer counts."""
    real = create_ticket_spec(services.endpoints.ticket_url)
    seen: dict[str, bool] = {}

    def answer_then_receiver_dies(args: Any, ctx: ToolContext) -> ToolResult:
        result = real.call(args, ctx)  # the complete response is in hand
        _kill_ticket_server(services)
        seen["receiver_alive"] = services.alive("tickets")
        return result

    spec = dataclasses.replace(real, func=answer_then_receiver_dies)
    call = effect_call(spec, TICKET_ARGS)
    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        approve(ledger, spec, call)
        outcome = Dispatcher(ledger, {spec.name: spec}, worker="w").dispatch(call)
    assert seen == {"receiver_alive": False}
    assert outcome.status is DispatchStatus.SUCCEEDED
    (ticket,) = services.tickets()  # read from the service's file while it is down
    op = read_op(tmp_path / "ledger.sqlite3")
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.result == ticket


@pytest.mark.crash
@pytest.mark.parametrize(
    ("keyed_only", "attempts", "requests"),
    [(False, 1, 1), (True, 2, 2)],
    ids=["lookup-by-original-key", "replay-with-original-key"],
)
def test_sender_dies_after_receiving_before_recording(
    services: DemoServices,
    state_dir: StateDir,
    tmp_path: Path,
    keyed_only: bool,
    attempts: int,
    requests: int,
) -> None:
    """Killed after the response, before the ack: recovery uses the original key; one ticket."""
    model = script_model(tmp_path, ticket_script())
    args = runner_args(state_dir, "t1", model) + (["--keyed-only"] if keyed_only else [])
    spec = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket"
    crashed = run_py("runner_main", *args, failpoint=spec)
    assert crashed.returncode == ExitCode.KILLED, crashed.stderr[-2000:]
    (first,) = services.tickets()
    resumed = run_py("runner_main", *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert services.tickets() == [first]
    assert first["idempotency_key"] == TICKET_OP
    assert services.stats("tickets")["create_requests"] == requests
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, attempts)
    assert op.receipt is not None and op.receipt.result["ticket_id"] == first["ticket_id"]


@pytest.mark.crash
def test_eight_processes_race_to_claim_one_operation(
    services: DemoServices, tmp_path: Path
) -> None:
    """8 processes claim the same operation at once; exactly one wins and sends."""
    url = services.endpoints.ticket_url
    ledger_path = tmp_path / "ledger.sqlite3"
    spec = create_ticket_spec(url)
    with SqliteLedger(ledger_path) as ledger:
        approve(ledger, spec, effect_call(spec, TICKET_ARGS))
    sync = tmp_path / "sync"
    sync.mkdir()
    claim = py_cmd("claim_main", "--ledger", str(ledger_path), "--url", url)
    procs = [
        subprocess.Popen(
            [*claim, "--worker", f"w{i}", "--sync-dir", str(sync)],
            cwd=REPO,
            env=py_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    deadline = time.monotonic() + 30
    while len(list(sync.glob("ready-*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err[-1000:] for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    winners = [r["worker"] for r in reports if r["won"]]
    assert len(winners) == 1
    assert all("claim" in r["error"].lower() for r in reports if not r["won"])
    op = read_op(ledger_path)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert _claimers(ledger_path, op.operation_id) == winners
    assert len(services.tickets()) == 1
    assert services.stats("tickets")["create_requests"] == 1


def test_eight_concurrent_receivers_of_one_request(services: DemoServices) -> None:
    """One request delivered 8 times at once -> 1 ticket, 8 identical answers."""
    spec = create_ticket_spec(services.endpoints.ticket_url)
    args = spec.normalize(TICKET_ARGS)
    ctx = ToolContext(operation_id=TICKET_OP, thread_id="t1", tool_call_id="c1", attempt=1)
    gate = threading.Barrier(8)

    def deliver(_: int) -> ToolResult:
        gate.wait(timeout=10)
        return spec.call(args, ctx)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(deliver, range(8)))
    (ticket,) = services.tickets()
    assert all(a == answers[0] for a in answers)
    assert answers[0].value == ticket
    assert services.stats("tickets")["create_requests"] == 8


def test_stale_attempts_late_ack_is_refused(services: DemoServices, tmp_path: Path) -> None:
    """A fenced-off attempt answers late; its acknowledgement is refused."""
    real = create_ticket_spec(services.endpoints.ticket_url)
    entered, release = threading.Event(), threading.Event()

    def first_attempt_stalls(args: Any, ctx: ToolContext) -> ToolResult:
        if ctx.attempt == 1:
            entered.set()
            release.wait(10)
        return real.call(args, ctx)

    spec = dataclasses.replace(real, func=first_attempt_stalls)
    call = effect_call(spec, TICKET_ARGS)
    path = tmp_path / "ledger.sqlite3"
    late: dict[str, Any] = {}
    with SqliteLedger(path) as old_ledger, SqliteLedger(path) as new_ledger:
        approve(old_ledger, spec, call)
        old = Dispatcher(old_ledger, {spec.name: spec}, worker="old")

        def run_old() -> None:
            try:
                late["outcome"] = old.dispatch(call)
            except ClaimLostError as exc:
                late["refused"] = exc

        stale = threading.Thread(target=run_old)
        stale.start()
        assert entered.wait(10)
        # A new runner takes the thread over: the stalled attempt is presumed gone.
        (recovered,) = new_ledger.recover_in_flight(thread_id=call.thread_id)
        assert (recovered.state, recovered.attempt) == (S.UNKNOWN, 1)
        outcome = Dispatcher(new_ledger, {spec.name: spec}, worker="new").dispatch(call)
        assert outcome.status is DispatchStatus.SUCCEEDED
        release.set()
        stale.join(10)
        op = new_ledger.get(call.operation_id)
    assert isinstance(late.get("refused"), ClaimLostError), late
    assert late["refused"].attempt == 1
    assert op is not None and (op.state, op.attempt) == (S.SUCCEEDED, 2)
    assert _claimers(path, op.operation_id) == ["old", "new"]
    assert op.receipt is not None and op.receipt.attempt == 2
    (ticket,) = services.tickets()  # the late request was a same-key replay
    assert op.receipt.result == ticket
    assert services.stats("tickets")["create_requests"] == 2


@pytest.mark.crash
@pytest.mark.parametrize(
    ("failpoint", "rows_at_crash"),
    [(Failpoint.AFTER_IN_FLIGHT_COMMIT, 0), (Failpoint.AFTER_EXTERNAL_COMMIT, 1)],
    ids=["died-before-the-effect", "died-after-the-effect"],
)
def test_non_idempotent_external_ledger_stays_unknown(
    tmp_path: Path, failpoint: Failpoint, rows_at_crash: int
) -> None:
    """No key, no lookup -> left for a human, not retried; a forced replay makes 2."""
    db, path = tmp_path / "external.sqlite3", tmp_path / "ledger.sqlite3"
    spec = external_ledger_tool(db)
    raw = {"entry": "refund order 42"}
    args = dispatch_args(path, "ext_append", db, raw)
    crashed = run_py("dispatch_main", *args, failpoint=f"{failpoint}@ext_append")
    assert crashed.returncode == ExitCode.KILLED, crashed.stderr[-2000:]
    assert len(external_rows(db)) == rows_at_crash  # the truth differs...

    call = effect_call(spec, raw)
    with SqliteLedger(path) as ledger:
        dispatcher = Dispatcher(ledger, {spec.name: spec}, worker="recovery")
        for _ in range(2):  # ...what the sender knows does not, and it never re-sends alone
            outcome = dispatcher.dispatch(call)
            assert outcome.status is DispatchStatus.NEEDS_RECONCILIATION
            assert outcome.operation is not None
            assert (outcome.operation.state, outcome.operation.attempt) == (
                S.NEEDS_RECONCILIATION,
                1,
            )
        assert len(external_rows(db)) == rows_at_crash

        # Counter-example: force a replay past the stop (a human accepting the risk).
        verdict = Verdict(verdict="retry", acknowledge_duplicate_risk=True)
        dispatcher.apply_verdict(call.operation_id, verdict)
        forced = dispatcher.dispatch(call)
    assert forced.status is DispatchStatus.SUCCEEDED
    assert forced.operation is not None and forced.operation.attempt == 2
    assert external_rows(db) == [raw["entry"]] * (rows_at_crash + 1)
