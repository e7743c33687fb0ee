"""Kill a real worker process at every seam, resume in a new one, ask the oracle.

The seams are listed in docs/architecture.md, "Seams (failpoints)".
"""

from __future__ import annotations

import json
import random
import signal
import subprocess

import pytest

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.ledger import Ledger, OpState, SqliteLedger
from effectgate.testing import Failpoint
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conftest import run_worker, worker_cmd

pytestmark = pytest.mark.crash

NOTE = "incidents/orders-error-rate.md"


def _ledger(sd: StateDir, store: str | None) -> Ledger:
    if store is None:
        return SqliteLedger(sd.ledger)
    from effectgate.ledger import PostgresLedger

    return PostgresLedger(store, pool_size=1)


def assert_incident_done_once(
    sd: StateDir, thread: str, store: str | None = None
) -> dict[str, OpState]:
    """One ticket, one mail, the note's exact approved bytes, every op SUCCEEDED, history valid."""
    w = world(sd)
    assert (w.tickets, w.mails) == (1, 1), w.as_dict()
    assert w.duplicate_tickets == 0 and w.duplicate_mails == 0
    with _ledger(sd, store) as ledger:
        ops = ledger.list(thread_id=thread)
        states = {op.tool: op.state for op in ops}
        note_op = next(op for op in ops if op.tool == "write_file")
        assert w.files == {NOTE: note_op.args["content"].encode()}
        assert ledger.list(states=[OpState.IN_FLIGHT, OpState.UNKNOWN]) == []
    assert states == {t: OpState.SUCCEEDED for t in ("create_ticket", "send_email", "write_file")}
    assert checkpoint_problems(store or sd.checkpoints, thread) == []
    return states


def attempts(sd: StateDir, thread: str, store: str | None = None) -> dict[str, int]:
    with _ledger(sd, store) as ledger:
        return {op.tool: op.attempt for op in ledger.list(thread_id=thread)}


SEAMS = [
    # (failpoint spec, expected attempts after recovery, why)
    (f"{Failpoint.AFTER_REVIEW_RECORDED}#1", {"create_ticket": 1}, "review re-asked"),
    (f"{Failpoint.AFTER_REVIEW_RECORDED}#2", {"send_email": 1}, "second review re-asked"),
    # IN_FLIGHT but the call never left: UNKNOWN -> lookup "not found" -> same-key retry
    (f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@create_ticket", {"create_ticket": 2}, "keyed retry"),
    (f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@send_email", {"send_email": 2}, "not found is final"),
    # killed between claiming the attempt and writing the file: a new attempt, exact bytes
    (f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@write_file", {"write_file": 2}, "idempotent retry"),
    # the external system committed: reconciliation finds it, attempts stay 1
    (f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket", {"create_ticket": 1}, "found by key"),
    (f"{Failpoint.AFTER_EXTERNAL_COMMIT}@send_email", {"send_email": 1}, "found by Message-ID"),
    (f"{Failpoint.AFTER_EXTERNAL_COMMIT}@write_file", {"write_file": 2}, "same bytes again"),
    # the ledger has the result, the checkpoint not: the stored receipt is reused
    (f"{Failpoint.AFTER_LEDGER_RESULT}@create_ticket", {"create_ticket": 1}, "receipt reused"),
    (f"{Failpoint.AFTER_LEDGER_RESULT}@send_email", {"send_email": 1}, "receipt reused"),
    # one sibling finished (its receipt is reused), the other may have been mid-call
    (f"{Failpoint.MID_SUPERSTEP}", {}, "finished sibling reused"),
]


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize(("spec", "expected", "why"), SEAMS, ids=[s[0] for s in SEAMS])
def test_kill_at_seam_then_resume(
    services: DemoServices,
    state_dir: StateDir,
    spec: str,
    expected: dict[str, int],
    why: str,
    api: str,
) -> None:
    """A worker killed at a seam leaves work a new process finishes without doing anything twice.

    ``api``: the worker drives the agent through ``start``/``resume`` or
    through ``astart``/``aresume`` (the same guarantees).
    """
    first = run_worker(state_dir, "t1", failpoint=spec, api=api)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    second = run_worker(state_dir, "t1", api=api)
    assert second.returncode == 0, (second.summary, second.stderr[-2000:])
    assert_incident_done_once(state_dir, "t1")
    got = attempts(state_dir, "t1")
    assert {k: got[k] for k in expected} == expected, why
    if spec == Failpoint.MID_SUPERSTEP:
        assert min(got["send_email"], got["write_file"]) == 1, got
    # the ticket service saw at most the creates the attempts account for
    assert services.stats("tickets")["tickets"] == 1


@pytest.mark.parametrize("tool", ["send_email", "create_ticket", "write_file"])
def test_kills_inside_one_call_do_not_spend_its_attempt_budget(
    services: DemoServices, state_dir: StateDir, tool: str
) -> None:
    """Four processes in a row die inside one call (budget: 3 attempts); a fifth does it once.

    Each worker is killed right after claiming the call's next attempt. A
    death says nothing about the tool, so each attempt is given back
    (``Operation.recoveries``): the call runs in the fifth process, where it
    used to end FAILED (mail: "not applied, no attempts left", so no mail at
    all) or wait for a person (ticket, note) after the third kill.
    """
    spec = f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@{tool}"
    for _ in range(4):
        killed = run_worker(state_dir, "t1", failpoint=spec)
        assert killed.returncode == ExitCode.KILLED, killed.stderr[-2000:]
    done = run_worker(state_dir, "t1")
    assert done.returncode == 0, (done.summary, done.stderr[-2000:])
    assert_incident_done_once(state_dir, "t1")
    with SqliteLedger(state_dir.ledger) as ledger:
        (op,) = ledger.list(thread_id="t1", tool=tool)
        given_back = [
            e.attempt
            for e in ledger.events(operation_id=op.operation_id)
            if e.detail.get("attempt_given_back")
        ]
    assert (op.attempt, op.recoveries, op.budget.max_attempts) == (5, 4, 3)
    assert given_back == [1, 2, 3, 4]
    assert services.stats("tickets")["tickets"] == 1


def test_crash_left_in_flight_row_for_write_file(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A kill after the claim leaves IN_FLIGHT, attempt 1; recovery answers the call once."""
    spec = f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@write_file"
    assert run_worker(state_dir, "t1", failpoint=spec).returncode == ExitCode.KILLED
    with SqliteLedger(state_dir.ledger) as ledger:
        (op,) = ledger.list(thread_id="t1", tool="write_file")
        assert (op.state, op.attempt) == (OpState.IN_FLIGHT, 1)
        call_id = op.tool_call_id
    assert run_worker(state_dir, "t1").returncode == 0
    assert_incident_done_once(state_dir, "t1")
    with SqliteLedger(state_dir.ledger) as ledger:
        events = [(e.src, e.dst) for e in ledger.events(operation_id=op.operation_id)]
    assert (OpState.IN_FLIGHT, OpState.UNKNOWN) in events
    from effectgate import open_agent

    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        answers = [m for m in agent.messages("t1") if getattr(m, "tool_call_id", None) == call_id]
    assert len(answers) == 1


def test_sigkill_at_random_moments(tmp_path) -> None:
    """SIGKILL at random times while services are slow; resuming until done never duplicates."""
    rng = random.Random(1234)
    kills = 0
    for trial in range(3):
        sd = StateDir.open(tmp_path / f"s{trial}")
        with DemoServices(sd.services) as svc:
            svc.set_error_rate("orders", 0.12)
            svc.set_fault("tickets", "slow", delay_s=0.3, times=1000)
            svc.set_fault("mail", "slow", delay_s=0.3, times=1000)
            for _ in range(4):  # up to four kills, at random moments
                proc = subprocess.Popen(
                    worker_cmd(sd, "t"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                try:
                    proc.wait(timeout=rng.uniform(0.3, 2.5))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    continue
                assert proc.returncode == 0, proc.returncode
                break
            else:  # then let one run finish
                assert run_worker(sd, "t", timeout=120).returncode == 0
            assert_incident_done_once(sd, "t")
    assert kills > 0  # the test killed something, or it proved nothing


def test_two_processes_resume_one_thread(services: DemoServices, state_dir: StateDir) -> None:
    """Two workers on one thread: one runs, the other is refused as busy; one ticket."""
    services.set_fault("tickets", "slow", delay_s=1.5, times=1)
    procs = [
        subprocess.Popen(worker_cmd(state_dir, "t1"), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=60) for p in procs)
    assert codes in ([0, 75], [0, 0]), codes
    for p in procs:
        if p.returncode == 75:
            assert json.loads(p.stdout.read().splitlines()[-1])["status"] == "busy"
    if codes == [0, 75]:
        assert_incident_done_once(state_dir, "t1")
    assert world(state_dir).tickets == 1
