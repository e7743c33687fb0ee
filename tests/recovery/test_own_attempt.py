"""An attempt this worker ran, whose result write failed, is recovered within bounded time.

The ledger's write lock is held (by another connection, as a backup tool or a
second process would) right after the external system committed, so the
result write fails with ``LedgerBusyError`` and the operation stays IN_FLIGHT
under this very worker. A second thread needing the same keyed operation, in
the same process, must not wait for that attempt for ever: its call returned,
so it is recovered (UNKNOWN, then the tool's lookup finds the effect).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from effectgate.errors import LedgerBusyError
from effectgate.graph import Agent, RunResult, RunStatus, StepDurableSaver
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec
from tests.answers._bind import bound

KEY = "thing:alpha"
APPROVE = {"decisions": [{"type": "approve"}]}
SCRIPT: dict[str, Any] = {
    "name": "one-thing",
    "turns": [
        {
            "say": "creating",
            "tool_calls": [{"name": "create_thing", "args": {"name": "alpha"}, "id": "call_1"}],
        }
    ],
    "final": "created",
}


class ThingArgs(BaseModel):
    name: str


class World:
    """The external system: what it was asked, what it holds."""

    def __init__(self, ledger_path: Path) -> None:
        self.requests: list[str] = []
        self.things: set[str] = set()
        self.ledger_path = ledger_path
        self.locker: sqlite3.Connection | None = None
        self.lock_next = True

    def create(self, args: ThingArgs, ctx: ToolContext) -> ToolResult:
        self.requests.append(ctx.operation_id)
        self.things.add(ctx.operation_id)  # keyed: a repeat with the key changes nothing
        if self.lock_next:
            self.lock_next = False
            conn = sqlite3.connect(self.ledger_path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")  # the ledger's write lock, held past its timeout
            self.locker = conn
        return ToolResult(value={"name": args.name}, reference=ctx.operation_id)

    def lookup(self, args: ThingArgs, ctx: ToolContext) -> Lookup:
        if ctx.operation_id in self.things:
            return Lookup.found({"name": args.name}, ctx.operation_id)
        return Lookup.not_found("no such thing")

    def unlock(self) -> None:
        if self.locker is not None:
            self.locker.execute("ROLLBACK")
            self.locker.close()
            self.locker = None


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, World]]:
    world = World(tmp_path / "ledger.sqlite3")
    spec = ToolSpec(
        name="create_thing",
        description="Create a thing, keyed by its name.",
        args_schema=ThingArgs,
        func=world.create,
        kind=EffectKind.KEYED,
        reconciler=world.lookup,
        not_found_is_final=False,
        operation_key=lambda args: f"thing:{args.name}",
    )
    ledger = SqliteLedger(world.ledger_path, busy_timeout=0.3)
    conn = sqlite3.connect(tmp_path / "checkpoints.sqlite3", check_same_thread=False)
    model = ScriptedChatModel.from_script(SCRIPT)
    agent = Agent(model, [spec], ledger=ledger, checkpointer=StepDurableSaver(conn))
    # Release the lock the moment the result write has failed, so only that write meets it.
    record = ledger.record_result

    def record_then_unlock(*args: Any, **kwargs: Any) -> Any:
        try:
            return record(*args, **kwargs)
        finally:
            world.unlock()

    ledger.record_result = record_then_unlock  # type: ignore[method-assign]
    try:
        yield agent, world
    finally:
        world.unlock()
        ledger.close()
        conn.close()


def _bounded(call: Any, timeout_s: float = 15.0) -> RunResult:
    """Run ``call`` in a daemon thread; fail if it has not returned within ``timeout_s``."""
    box: list[Any] = []
    runner = threading.Thread(target=lambda: box.append(call()), daemon=True)
    runner.start()
    runner.join(timeout_s)
    assert not runner.is_alive(), f"still running after {timeout_s} s: it spins"
    (result,) = box
    assert isinstance(result, RunResult)
    return result


def _stuck_in_flight(agent: Agent, world: World) -> None:
    """Thread t1's approved create commits outside, then its result write fails busy."""
    assert agent.start("create alpha", thread_id="t1").status is RunStatus.WAITING_REVIEW
    first = agent.resume("t1", decisions=bound(agent, "t1", APPROVE))
    assert first.error is not None and LedgerBusyError.__name__ in first.error, first
    # the exception itself, for the CLI's exit 75 ("busy, try again")
    assert isinstance(first.cause, LedgerBusyError), first.cause
    op = agent.ledger.get(KEY)
    assert op is not None and (op.state, op.claimed_by) == (OpState.IN_FLIGHT, agent.worker)
    assert world.requests == [KEY]


def test_a_second_thread_needing_the_same_key_does_not_spin(setup: tuple[Agent, World]) -> None:
    agent, world = setup
    _stuck_in_flight(agent, world)

    # The operation already started (t1's attempt), so t2 is not asked to
    # review it again: its dispatch recovers the attempt, within bounded time.
    second = _bounded(lambda: agent.start("create alpha", thread_id="t2"))
    assert (second.status, second.error) == (RunStatus.DONE, None)
    op = agent.ledger.get(KEY)
    assert op is not None and (op.state, op.attempt) == (OpState.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.source == "reconcile"
    assert world.requests == [KEY]  # found by the lookup, not created again

    again = _bounded(lambda: agent.resume("t1"))
    assert (again.status, again.error) == (RunStatus.DONE, None)
    assert world.requests == [KEY]


def test_a_replay_of_the_same_thread_does_not_spin(setup: tuple[Agent, World]) -> None:
    agent, world = setup
    _stuck_in_flight(agent, world)
    config = {"configurable": {"thread_id": "t1"}}
    before_effect = next(
        s
        for s in agent.graph.get_state_history(config)  # type: ignore[arg-type]
        if any(name.startswith("effect") for name in s.next)
    )
    checkpoint_id = before_effect.config["configurable"]["checkpoint_id"]
    replayed = _bounded(lambda: agent.replay("t1", checkpoint_id))
    assert replayed.error is None, replayed.error
    op = agent.ledger.get(KEY)
    assert op is not None and (op.state, op.attempt) == (OpState.SUCCEEDED, 1)
    assert world.requests == [KEY]
