"""``effectgate worker`` on PostgreSQL: workers share threads; a dead one's are taken over."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectgate import StateDir, open_agent, submit
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing import Failpoint
from effectgate.testing.oracle import world

pytestmark = [pytest.mark.crash, pytest.mark.slow]

TASK = "Check the order service's error rate and handle any incident."


def _worker(
    sd: StateDir, *extra: str, failpoint: str | None = None, approve: bool = True
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    cmd = [sys.executable, "-m", "effectgate.cli", "worker", "--state-dir", str(sd.root)]
    cmd += ["--approve", "all"] if approve else []
    return subprocess.Popen(
        [*cmd, "--json", "--until-idle", "--lease-ttl", "3", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _approve_left_for_review(sd: StateDir, services: DemoServices) -> int:
    """Answer, as a person would, the reviews ``--approve all`` leaves (possible duplicates).

    Every thread here runs the same incident, so from the second thread on
    the mail is flagged as a possible duplicate of the first thread's, and a
    worker's ``--approve all`` leaves it for a person (as the CLI's does).
    Returns how many reviews were answered.
    """
    answered = 0
    with open_agent(sd, endpoints=services.endpoints) as agent:
        for record in agent.ledger.list_threads():
            result = agent.status(record.thread_id)
            while result.status == "waiting_review":
                answers = {
                    p.id: {"decisions": [{"type": "approve"}] * len(p.value["action_requests"])}
                    for p in result.interrupts
                }
                answered += len(answers)
                result = agent.resume(record.thread_id, answers=answers)
            assert result.status == "done", (record.thread_id, result.status, result.error)
    return answered


def test_a_worker_killed_at_a_seam_has_its_thread_finished_by_another(
    tmp_path: Path, postgres_url: str
) -> None:
    """Worker A dies after the ticket service committed; worker B finishes every thread, once."""
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        with open_agent(sd) as agent:
            for n in range(3):
                submit(agent, TASK, thread_id=f"t{n}")
        a = _worker(sd, failpoint=f"{Failpoint.AFTER_EXTERNAL_COMMIT}@send_email")
        _, err_a = a.communicate(timeout=180)
        assert a.returncode == ExitCode.KILLED, err_a[-2000:]
        with PostgresLedger(postgres_url) as ledger:
            left = ledger.list(states=[OpState.IN_FLIGHT])
        # The kill left the mail's attempt open. Its sibling in the same superstep
        # (write_file: turn 2 makes both calls in one message, run as parallel
        # effect nodes) may be in flight too when the machine is loaded.
        assert "send_email" in [op.tool for op in left], left
        assert {op.tool for op in left} <= {"send_email", "write_file"}, left
        left = [op for op in left if op.tool == "send_email"]
        assert len(left) == 1, left
        b = _worker(sd, "--processes", "2")
        out_b, err_b = b.communicate(timeout=300)
        assert b.returncode == 0, err_b[-2000:]
        runs = [json.loads(line) for line in out_b.splitlines() if '"thread_id"' in line]
        assert {r["thread_id"] for r in runs} == {"t0", "t1", "t2"}
        assert {r["status"] for r in runs if "status" in r} <= {"done", "waiting_review"}
        left_for_review = {r["thread_id"] for r in runs if "left_for_review" in r}
        assert _approve_left_for_review(sd, services) == len(left_for_review)
        # the systems' own records: one ticket (one incident), one mail per thread, no repeats
        w = world(sd)
        assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 3, 0, 0)
        assert services.stats("tickets")["tickets"] == 1
    with PostgresLedger(postgres_url) as ledger:
        ops = ledger.list()
        assert {op.state for op in ops} == {OpState.SUCCEEDED}
        mail = next(op for op in ops if op.operation_id == left[0].operation_id)
        assert mail.attempt == 1  # found by Message-ID on recovery, not sent again


def test_workers_sigkilled_at_random_moments_lose_and_repeat_nothing(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two workers on slow services, one SIGKILLed at a random moment each trial; then finish."""
    rng = random.Random(19)
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    killed = 0
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        services.set_fault("tickets", "slow", delay_s=0.3, times=1000)
        services.set_fault("mail", "slow", delay_s=0.3, times=1000)
        with open_agent(sd) as agent:
            for n in range(4):
                submit(agent, TASK, thread_id=f"t{n}")
        for _ in range(2):
            pair = [_worker(sd), _worker(sd)]
            time.sleep(rng.uniform(0.3, 1.5))  # the pair needs about 2 s or more
            victim = pair[rng.randrange(2)]
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL)
                killed += 1
            for proc in pair:
                proc.communicate(timeout=300)
        final = _worker(sd)
        _, err = final.communicate(timeout=300)
        assert final.returncode == 0, err[-2000:]
        assert _approve_left_for_review(sd, services) >= 1  # the later threads' mails
        w = world(sd)
        assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 4, 0, 0)
    assert killed > 0  # a kill landed, or this proved nothing
    with PostgresLedger(postgres_url) as ledger:
        ops = ledger.list()
        assert {op.state for op in ops} == {OpState.SUCCEEDED}
        # the incident's ticket is one operation shared by the threads; mail and note per thread
        tools = sorted(op.tool for op in ops)
        assert tools == ["create_ticket"] + ["send_email"] * 4 + ["write_file"] * 4


def test_a_review_answered_by_a_runner_that_died_is_resumed_by_a_worker(
    tmp_path: Path, postgres_url: str
) -> None:
    """The answer was recorded, the runner died before the next checkpoint: a worker goes on.

    The checkpoint still shows the review interrupt, but nothing is left to
    answer; a worker without ``--approve`` must take the thread as unfinished
    (else it waits forever for a reviewer with nothing to answer).
    """
    from effectgate._queue import Readiness, readiness
    from effectgate.demo.services import published_endpoints
    from tests.conftest import run_worker

    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        died = run_worker(sd, "t0", failpoint=f"{Failpoint.AFTER_REVIEW_RECORDED}#1")
        assert died.returncode == ExitCode.KILLED, died.stderr[-2000:]
        endpoints = published_endpoints(sd.services)  # the agent has the ticket and mail tools
        with open_agent(sd, endpoints=endpoints) as agent:
            assert readiness(agent, "t0") is Readiness.UNFINISHED
        worker = _worker(sd, approve=False)
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
        # the recorded approval was applied: the ticket service has the ticket,
        # and the thread waits at the next review (nobody approved that one)
        assert services.stats("tickets")["tickets"] == 1
        with open_agent(sd, endpoints=endpoints) as agent:
            assert readiness(agent, "t0") is Readiness.REVIEW
