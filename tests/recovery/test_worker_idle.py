"""A worker with a review policy leaves a thread that waits for a person's verdict alone."""

from __future__ import annotations

import threading
import time

import pytest

from effectgate import StateDir, open_agent
from effectgate._queue import Readiness, readiness
from effectgate.cli._workers import WorkerOptions, work
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus
from tests._damage import damage_sqlite_arguments


def test_an_approving_worker_does_not_spin_on_a_thread_waiting_for_a_verdict(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``--approve all --until-idle`` exits at once when the only thread needs reconciliation.

    The ticket's outcome is unknown and its lookup unavailable, so a person's
    verdict is needed, which no review policy gives. The worker took such a
    thread as "waiting for review", resumed it, counted that as a run and took
    it again at once: 28,000 runs in a minute at full CPU, and ``until_idle``
    never ended (found by a fresh user).
    """
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
        result = agent.start("Check the order service and handle any incident.", thread_id="t1")
        (pending,) = result.interrupts
        n = len(pending.value["action_requests"])
        result = agent.resume("t1", answers={pending.id: {"decisions": [{"type": "approve"}] * n}})
        assert result.status is RunStatus.WAITING_RECONCILIATION
        assert readiness(agent, "t1") is Readiness.RECONCILIATION
        said: list[dict[str, object]] = []
        done: list[int] = []
        opts = WorkerOptions(approve="all", until_idle=True, poll_s=0.01)
        runner = threading.Thread(target=lambda: done.append(work(agent, opts, say=said.append)))
        runner.start()
        runner.join(timeout=60)
        assert not runner.is_alive(), f"the worker kept running: {len(said)} runs so far"
        assert done == [0] and said == []
        assert agent.status("t1").status is RunStatus.WAITING_RECONCILIATION
    assert services.stats("tickets")["tickets"] == 1


def test_a_worker_does_not_spin_on_a_thread_that_stops_incomplete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread that keeps stopping early (another runner's operation in flight) waits a poll.

    Before, each such run counted as a run and the worker took the thread
    again at once: about 50 identical "incomplete" lines in 12 s (a fresh
    user). Now it is tried after the poll pause, said once, and ``until_idle``
    still waits for it.
    """
    from types import SimpleNamespace

    import effectgate.cli._workers as workers
    from effectgate.graph import RunResult

    calls: list[str] = []
    record = SimpleNamespace(thread_id="t1", metadata={})
    agent = SimpleNamespace(ledger=SimpleNamespace(list_threads=lambda damaged=None: [record]))
    stuck = RunResult(thread_id="t1", status=RunStatus.INCOMPLETE, error="OperationBusyError: x")

    def run_one(*args: object) -> tuple[RunResult, bool]:
        calls.append("run")
        return stuck, True

    monkeypatch.setattr(workers, "readiness", lambda agent, thread_id: Readiness.UNFINISHED)
    monkeypatch.setattr(workers, "_run_one", run_one)
    said: list[dict[str, object]] = []
    stop = threading.Event()
    opts = WorkerOptions(until_idle=True, poll_s=0.2)
    runner = threading.Thread(
        target=lambda: work(agent, opts, say=said.append, stop=stop)  # type: ignore[arg-type]
    )
    runner.start()
    time.sleep(1.0)
    assert runner.is_alive()  # until_idle waits: the thread is not done
    stop.set()
    runner.join(timeout=10)
    assert 2 <= len(calls) <= 8, len(calls)
    assert said == [
        {"thread_id": "t1", "was": "unfinished", "status": "incomplete",
         "error": "OperationBusyError: x"}
    ]  # fmt: skip


def test_one_damaged_ledger_row_does_not_stop_a_worker_from_the_other_threads(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A thread whose operation row fails validation is said once and left; the rest are run.

    Before, the worker's scan read that thread's status, the damaged row
    raised ``LedgerCorruptError`` out of ``work`` and the worker ended, and so
    did every other worker at its next scan: one row wedged every thread.
    """
    from effectgate import submit

    task = "Check the order service and handle any incident."
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        result = agent.start(task, thread_id="a")
        while result.interrupts:
            result = agent.resume(
                "a",
                answers={
                    p.id: {"decisions": [{"type": "approve"}] * len(p.value["action_requests"])}
                    for p in result.interrupts
                },
            )
        assert result.status is RunStatus.DONE
        (damaged,) = [op.operation_id for op in agent.ledger.list(thread_id="a", tool="write_file")]
        damage_sqlite_arguments(state_dir.ledger, damaged)
        submit(agent, task, thread_id="b")
        said: list[dict[str, object]] = []
        done: list[int] = []
        opts = WorkerOptions(approve="all", until_idle=True, poll_s=0.01)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                done.append(work(agent, opts, say=said.append))
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        runner.join(timeout=120)
        assert not runner.is_alive()
        assert errors == [], errors
        about_a = [line for line in said if line.get("thread_id") == "a"]
        assert len(about_a) == 1 and "its stored state cannot be read" in str(about_a[0]["skipped"])
        assert damaged in str(about_a[0]["skipped"])
        # b went on to its review; its file write has the damaged row's intent,
        # so whether it already ran cannot be checked: left for a person.
        status = agent.status("b")
        assert status.status is RunStatus.WAITING_REVIEW
        (review,) = status.interrupts
        (write,) = [a for a in review.value["action_requests"] if a["name"] == "write_file"]
        assert [d["operation_id"] for d in write["unreadable_same_intent"]] == [damaged]
        assert any(line.get("left_for_review") for line in said), said
        # a person who has checked approves it; b runs to the end
        answer = {"decisions": [{"type": "approve"}] * len(review.value["action_requests"])}
        assert agent.resume("b", answers={review.id: answer}).status is RunStatus.DONE
    # b's ticket is a's (one business key); nothing else was duplicated by the worker
    assert services.stats("tickets")["tickets"] == 1


_HELD_LOCK = """
import os, signal, threading
from effectgate.cli._workers import _LoopStop
from effectgate.cli._signals import STOPPER, Mode

class Agent:
    reasons = []
    def request_stop(self, reason):
        self.reasons.append(reason)

stop, agent = threading.Event(), Agent()
with STOPPER.command(Mode.GRACEFUL, lambda text: None, reads_stop=True):
    with STOPPER.running(_LoopStop(stop, agent)):
        with stop._cond:  # where the main thread is when the signal lands inside stop.wait()
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, under the lock
            held = stop.is_set()
        stop.wait(5)
print(held, stop.is_set(), agent.reasons[:1])
"""


def test_a_worker_signal_landing_inside_stop_wait_cannot_deadlock() -> None:
    """The handler never sets the loop's event: ``Event.set`` under the held lock hangs for good.

    The worker's loop waits on ``stop``; the CLI's handler only marks the
    stop, and a thread of its own sets ``stop`` (``STOPPER.running``).
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _HELD_LOCK], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False True ['stopped by SIGTERM']"
