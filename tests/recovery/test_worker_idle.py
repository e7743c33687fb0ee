"""A worker with a review policy leaves a thread that waits for a person's verdict alone."""

from __future__ import annotations

import threading
import time

import pytest

from effectgate._app import StateDir, open_agent
from effectgate._workers import Readiness, WorkerOptions, readiness, work
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus


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

    import effectgate._workers as workers
    from effectgate.graph import RunResult

    calls: list[str] = []
    record = SimpleNamespace(thread_id="t1", metadata={})
    agent = SimpleNamespace(ledger=SimpleNamespace(list_threads=lambda: [record]))
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
