"""Thread leases while an agent runs: renewed, dropped when stolen, never renewed after release."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import BaseModel
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.errors import ConfigError, ThreadBusyError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.ledger import Lease, SqliteLedger
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolResult, ToolSpec

TTL = 0.3
SCRIPT = {
    "name": "slow",
    "turns": [
        {"say": "Working.", "tool_calls": [{"name": "slow", "args": {"seconds": 1.2}}]},
        {"say": "Again.", "tool_calls": [{"name": "slow", "args": {"seconds": 0.1}}]},
    ],
    "final": "Done.",
}
APPROVE = {"decisions": [{"type": "approve"}]}


class SlowArgs(BaseModel):
    seconds: float


@contextmanager
def _agent(sd: StateDir, calls: list[float]) -> Iterator[Agent]:
    def effect(args: SlowArgs, ctx: Any) -> ToolResult:
        calls.append(args.seconds)
        time.sleep(args.seconds)
        return ToolResult(value={"slept": args.seconds})

    spec = ToolSpec(
        name="slow",
        description="Sleep.",
        args_schema=SlowArgs,
        func=effect,
        kind=EffectKind.IDEMPOTENT,
    )
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(
        sd, model=model, tools=[spec], policy=Policy(approval_ttl=None), lease_ttl_s=TTL
    ) as agent:
        yield agent


def _lease(ledger: SqliteLedger) -> Lease | None:
    with ledger.store.read() as r:
        return r.get_lease("t")


def _keepers(agent: Agent) -> list[threading.Thread]:
    name = f"effectgate-lease-keeper {agent.worker}"
    return [t for t in threading.enumerate() if t.name == name]


def test_lease_is_renewed_through_a_long_run(state_dir: StateDir) -> None:
    """A run four lease lifetimes long keeps its thread: another runner is refused throughout."""
    calls: list[float] = []
    with _agent(state_dir, calls) as one, _agent(state_dir, []) as two:
        one.start("go", thread_id="t")
        box: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: box.update(r=one.resume("t", decisions=bound(one, "t", APPROVE)))
        )
        runner.start()
        refusals = 0
        while not calls:
            time.sleep(0.01)
        while runner.is_alive():
            with pytest.raises(ThreadBusyError):
                two.resume("t", decisions=bound(two, "t", APPROVE))
            refusals += 1
            time.sleep(0.1)
        runner.join()
        assert box["r"].status is RunStatus.WAITING_REVIEW, box["r"].error
    assert calls == [1.2] and refusals >= 8


def test_a_stolen_lease_stops_the_run_at_the_next_step(state_dir: StateDir) -> None:
    calls: list[float] = []
    with _agent(state_dir, calls) as agent:
        agent.start("go", thread_id="t")
        box: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: box.update(r=agent.resume("t", decisions=bound(agent, "t", APPROVE)))
        )
        runner.start()
        while not calls:
            time.sleep(0.01)
        with SqliteLedger(state_dir.ledger) as ledger:
            held = _lease(ledger)
            assert held is not None and held.owner == agent.worker
            ledger.acquire_lease("t", "thief", 30.0, take_over_from=agent.worker)
            runner.join()
    result = box["r"]
    assert result.status is RunStatus.INCOMPLETE
    assert "thread lease lost to another runner" in (result.error or "")
    assert calls == [1.2]  # the effect that was running finished; nothing after it ran


def test_a_released_lease_is_not_renewed_and_the_keeper_ends(state_dir: StateDir) -> None:
    with _agent(state_dir, []) as agent:
        agent.start("go", thread_id="t")
        time.sleep(TTL * 1.5)  # past the keeper's next period
        with SqliteLedger(state_dir.ledger) as ledger:
            lease = _lease(ledger)
            assert lease is not None and lease.owner == agent.worker
            assert lease.expires_at <= ledger.clock.now()
        assert _keepers(agent) == []


def test_a_brief_hold_is_waited_for_and_a_late_starter_does_not_take_the_lease(
    state_dir: StateDir,
) -> None:
    """Three concurrent demo starts once left nobody finishing (a fresh user saw 75/75/2).

    A starter with another task is refused without taking the lease; a repeated
    start is a resume and needs it; a runner meeting a short hold by a live
    process waits (lease_wait_s).
    """
    with _agent(state_dir, []) as agent:
        agent.start("go", thread_id="t")
        with SqliteLedger(state_dir.ledger) as ledger:
            held = ledger.acquire_lease("t", "someone-alive", 30.0)  # a live holder
            with pytest.raises(ConfigError, match="already exists with another task"):
                agent.start("other", thread_id="t")  # refused before any lease is asked for
            with pytest.raises(ThreadBusyError):
                agent.start("go", thread_id="t")  # the same start is a resume: it needs the lease
            with pytest.raises(ThreadBusyError):
                agent.resume("t")  # lease_wait_s=0: at once
            timer = threading.Timer(0.3, ledger.release_lease, args=(held,))
            timer.start()
            agent.lease_wait_s = 2.0
            t0 = time.monotonic()
            result = agent.resume("t", decisions=bound(agent, "t", APPROVE))
            waited = time.monotonic() - t0
            timer.join()
    assert result.status is RunStatus.WAITING_REVIEW, result.error
    assert waited >= 0.25  # it waited for the hold instead of failing
