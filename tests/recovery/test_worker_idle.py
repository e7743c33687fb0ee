"""A worker with a review policy leaves a thread that waits for a person's verdict alone."""

from __future__ import annotations

import threading

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
