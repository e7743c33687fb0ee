"""The resume shortcut on PostgreSQL: the saver's ``head`` vouches for remembered interrupts.

The same rules as ``tests/integration/test_resume_shortcut.py`` on SQLite: a
resume whose thread head (latest checkpoint id and its writes, as stored) is
unchanged answers the agent's own last interrupts without loading the state;
anything that moved the head, whoever moved it, sends it down the full path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from effectgate import StateDir, open_agent
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.graph._pg_saver import StepDurablePostgresSaver
from effectgate.models import ScriptedChatModel
from tests.answers._bind import bound
from tests.integration.test_resume_shortcut import (
    APPROVE,
    SCRIPT,
    _count_state_loads,
    _pending_path,
)


@contextmanager
def _agent(sd: StateDir, url: str) -> Iterator[Agent]:
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(sd, model=model, policy=Policy(approval_ttl=None), store=url) as agent:
        yield agent


def _saver(agent: Agent) -> StepDurablePostgresSaver:
    saver = agent.graph.checkpointer
    assert isinstance(saver, StepDurablePostgresSaver)
    return saver


def test_head_is_the_latest_checkpoint_and_its_writes(
    state_dir: StateDir, postgres_url: str
) -> None:
    with _agent(state_dir, postgres_url) as agent:
        saver = _saver(agent)
        assert saver.head("t") is None
        agent.start("write", thread_id="t")
        latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        head = saver.head("t")
        assert head is not None
        assert head[0] == latest.config["configurable"]["checkpoint_id"]
        assert sorted((w[0], w[2]) for w in head[1]) == sorted(
            (w[0], w[1]) for w in latest.pending_writes or ()
        )
        assert saver.head("t") == head  # nothing moved: the same answer


def test_own_interrupts_are_answered_without_a_state_load(
    state_dir: StateDir, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _agent(state_dir, postgres_url) as agent:
        first = agent.start("write", thread_id="t")
        loads = _count_state_loads(agent, monkeypatch)
        second = agent.resume("t", answers={first.interrupts[0].id: APPROVE})
        assert (_pending_path(first), _pending_path(second)) == ("a.txt", "b.txt")
        assert loads == []
        agent.resume("t", decisions=bound(agent, "t", APPROVE))
        done = agent.resume("t", decisions=bound(agent, "t", APPROVE))
        assert done.status is RunStatus.DONE
    assert sorted(p.name for p in state_dir.workspace.iterdir()) == ["a.txt", "b.txt", "c.txt"]


def test_a_thread_moved_by_another_agent_takes_the_full_path(
    state_dir: StateDir, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent 1 stopped at a.txt; agent 2 approved it and stopped at b.txt: 1's answer goes to b."""
    with _agent(state_dir, postgres_url) as one, _agent(state_dir, postgres_url) as two:
        assert _pending_path(one.start("write", thread_id="t")) == "a.txt"
        assert _pending_path(two.resume("t", decisions=bound(two, "t", APPROVE))) == "b.txt"
        loads = _count_state_loads(one, monkeypatch)
        after = one.resume("t", decisions=bound(one, "t", APPROVE))
        ops = one.ledger.list(thread_id="t")
    assert after.status is RunStatus.WAITING_REVIEW and _pending_path(after) == "c.txt"
    assert [(op.args["path"], op.state.value) for op in ops] == [
        ("a.txt", "SUCCEEDED"),
        ("b.txt", "SUCCEEDED"),
    ]
    assert loads  # the full path: the stale interrupts were not used


@pytest.mark.parametrize("replaced", [False, True], ids=["new-write", "replaced-in-place"])
def test_a_write_on_the_same_checkpoint_takes_the_full_path(
    state_dir: StateDir, postgres_url: str, monkeypatch: pytest.MonkeyPatch, replaced: bool
) -> None:
    """A stray resume write, or an interrupt write replaced in place (its bytes), moves the head."""
    from langgraph.types import Interrupt

    with _agent(state_dir, postgres_url) as agent:
        agent.start("write", thread_id="t")
        saver = _saver(agent)
        head = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert head is not None
        before = saver.head("t")
        writes: list[tuple[str, Any]]
        if replaced:
            (task_id,) = {w[0] for w in head.pending_writes or () if w[1] == "__interrupt__"}
            writes = [("__interrupt__", [Interrupt(value={"type": "review"}, id="x")])]
        else:
            task_id, writes = "someone-else", [("__resume__", {"stray": True})]
        saver.put_writes(head.config, writes, task_id=task_id)
        assert saver.head("t") != before
        loads = _count_state_loads(agent, monkeypatch)
        agent.resume("t")
        assert loads
