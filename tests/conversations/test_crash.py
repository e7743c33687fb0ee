"""Start-or-resume and follow-up turns across real process kills; the services are the truth."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from langchain_core.messages import HumanMessage

from effectgate import StateDir, open_agent
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus, history_problems
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing import Failpoint
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conversations._scripts import ALSO_LEAD, TASK

pytestmark = pytest.mark.crash


def _worker(
    sd: StateDir, *extra: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    cmd = [sys.executable, "-m", "tests.conversations._worker", "--state-dir", str(sd.root)]
    return subprocess.run(
        [*cmd, "--thread", "c", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )


def _attempts(sd: StateDir) -> dict[str, list[int]]:
    with SqliteLedger(sd.ledger) as ledger:
        ops = ledger.list(thread_id="c")
        assert ledger.list(states=[OpState.IN_FLIGHT, OpState.UNKNOWN]) == []
    out: dict[str, list[int]] = {}
    for op in ops:
        assert op.state is OpState.SUCCEEDED, op
        out.setdefault(op.tool, []).append(op.attempt)
    return out


def _humans(sd: StateDir) -> list[str]:
    with open_agent(sd, model="scripted:incident") as agent:
        messages = agent.messages("c")
    assert history_problems(messages, allow_pending=False) == []
    return [str(m.content) for m in messages if isinstance(m, HumanMessage)]


SEAMS = [
    # (failpoint, attempts after recovery): the same as a plain resume gives (tests/crash)
    (f"{Failpoint.AFTER_REVIEW_RECORDED}#1", {"create_ticket": [1], "send_email": [1]}),
    (f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@create_ticket", {"create_ticket": [2]}),
    (f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket", {"create_ticket": [1]}),
    (f"{Failpoint.AFTER_EXTERNAL_COMMIT}@send_email", {"send_email": [1]}),
    (f"{Failpoint.AFTER_LEDGER_RESULT}@send_email", {"send_email": [1]}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "expected"), SEAMS, ids=[s[0] for s in SEAMS])
def test_starting_again_after_a_kill_at_a_seam_resumes_the_thread(
    services: DemoServices, state_dir: StateDir, spec: str, expected: dict[str, list[int]]
) -> None:
    """A client that repeats its start after a kill continues the one thread: 1 ticket, 1 mail."""
    first = _worker(state_dir, failpoint=spec)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    again = _worker(state_dir)  # Agent.start only, never resume
    assert again.returncode == 0, (again.stdout, again.stderr[-2000:])
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
    got = _attempts(state_dir)
    assert {k: got[k] for k in expected} == expected
    assert _humans(state_dir) == [TASK]
    assert checkpoint_problems(state_dir.checkpoints, "c") == []


def test_starting_again_after_a_kill_before_the_first_checkpoint_runs_the_task_once(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The thread was recorded, then the process died before its first checkpoint."""
    with SqliteLedger(state_dir.ledger) as ledger:
        ledger.record_thread("c", {"task": TASK}, {})  # what start writes first
    done = _worker(state_dir)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
    assert _humans(state_dir) == [TASK]


def test_a_kill_mid_turn_is_finished_by_resume(services: DemoServices, state_dir: StateDir) -> None:
    """Killed after turn 2's mail reached the sink: resume finds it, sends nothing twice."""
    spec = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@send_email#2"
    first = _worker(state_dir, "--send", ALSO_LEAD, failpoint=spec)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    assert world(state_dir).mails == 2  # the lead's mail went out before the kill
    done = _worker(state_dir, "--resume")
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_mails) == (1, 2, 0)
    assert _attempts(state_dir) == {"create_ticket": [1], "send_email": [1, 1]}
    assert _humans(state_dir) == [TASK, ALSO_LEAD]
    assert checkpoint_problems(state_dir.checkpoints, "c") == []


@pytest.mark.parametrize("how", ["resume", "send again"])
def test_a_turn_recorded_but_not_yet_added_is_added_exactly_once(
    services: DemoServices, state_dir: StateDir, how: str
) -> None:
    """Killed right after recording turn 2: resume (or the retried request) adds it once.

    The retry is a new process that starts the thread again and sends the same
    request (same request id), as a client whose first attempt timed out would.
    """
    first = _worker(state_dir, "--send", ALSO_LEAD, "--die-after-recording-turn")
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    assert world(state_dir).mails == 1 and _humans(state_dir) == [TASK]
    with open_agent(state_dir, model="scripted:incident") as agent:
        status = agent.status("c")
    assert status.status is RunStatus.INCOMPLETE
    assert "turn 2 ('Also copy the on-call lead.') is recorded but has not run" in (
        status.error or ""
    )
    extra = ["--resume"] if how == "resume" else ["--send", ALSO_LEAD]
    done = _worker(state_dir, *extra)
    assert done.returncode == 0, (done.stdout, done.stderr[-2000:])
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "done"
    again = _worker(state_dir, "--resume")  # and once more: nothing new
    assert again.returncode == 0, again.stderr[-2000:]
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_mails) == (1, 2, 0)
    assert _humans(state_dir) == [TASK, ALSO_LEAD]
    assert checkpoint_problems(state_dir.checkpoints, "c") == []
