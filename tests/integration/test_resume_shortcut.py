"""``Agent.resume`` answers its own last interrupts without reloading the state, only while valid.

After a run stops at interrupts, the agent remembers them with the thread's
head (latest checkpoint id and the writes attached to it). A resume whose head
still matches answers them directly; anything that moved the thread since
(another agent or process resuming it, a fork, a crash after a resume write)
sends it down the full path, which reads the pending interrupts back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.graph import _reading as _reading_module
from effectgate.models import ScriptedChatModel

SCRIPT = {
    "name": "three-files",
    "turns": [
        {
            "say": f"Writing {name}.",
            "tool_calls": [
                {"name": "write_file", "args": {"path": f"{name}.txt", "content": f"{name}\n"}}
            ],
        }
        for name in ("a", "b", "c")
    ],
    "final": "All written.",
}
APPROVE = {"decisions": [{"type": "approve"}]}


@contextmanager
def _agent(sd: StateDir) -> Iterator[Agent]:
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(sd, model=model, policy=Policy(approval_ttl=None)) as agent:
        yield agent


def _count_state_loads(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Reads of the thread's state: ``get_state``, or ``status``'s cheap read of a waiting head."""
    calls: list[Any] = []
    real = agent.graph.get_state
    real_head = _reading_module.head_state

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    def counted_head(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_head(*args, **kwargs)

    monkeypatch.setattr(agent.graph, "get_state", counted)
    monkeypatch.setattr(_reading_module, "head_state", counted_head)
    return calls


def _pending_path(result: Any) -> str:
    return str(result.interrupts[0].value["action_requests"][0]["args"]["path"])


def test_own_interrupts_are_answered_without_a_state_load(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _agent(state_dir) as agent:
        first = agent.start("write", thread_id="t")
        loads = _count_state_loads(agent, monkeypatch)
        second = agent.resume("t", answers={first.interrupts[0].id: APPROVE})
        assert (_pending_path(first), _pending_path(second)) == ("a.txt", "b.txt")
        assert loads == []
        waiting = agent.resume("t")  # no answer: says what waits, runs nothing
        assert waiting.status is RunStatus.WAITING_REVIEW and _pending_path(waiting) == "b.txt"
        assert loads == []
        agent.resume("t", decisions=bound(agent, "t", APPROVE))
        done = agent.resume("t", decisions=bound(agent, "t", APPROVE))
        assert done.status is RunStatus.DONE
    assert sorted(p.name for p in state_dir.workspace.iterdir()) == ["a.txt", "b.txt", "c.txt"]


def test_a_thread_moved_by_another_agent_takes_the_full_path(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent 1 stopped at a.txt; agent 2 approved it and stopped at b.txt: 1's answer goes to b."""
    with _agent(state_dir) as one, _agent(state_dir) as two:
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
    assert sorted(p.name for p in state_dir.workspace.iterdir()) == ["a.txt", "b.txt"]
    assert loads  # the full path: the stale interrupts were not used


def test_a_new_write_on_the_same_checkpoint_takes_the_full_path(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume answer saved by someone else (then lost its run) changes the head too."""
    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
        saver = agent.graph.checkpointer
        assert saver is not None
        head = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert head is not None
        saver.put_writes(head.config, [("__resume__", {"stray": True})], task_id="someone-else")
        loads = _count_state_loads(agent, monkeypatch)
        agent.resume("t")
        assert loads


def test_a_bad_answer_on_the_shortcut_loses_nothing(state_dir: StateDir, tmp_path: Path) -> None:
    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
        with pytest.raises(DecisionError):
            agent.resume("t", decisions=bound(agent, "t", {"decisions": []}))
        again = agent.resume("t", decisions=bound(agent, "t", APPROVE))
        assert _pending_path(again) == "b.txt"
    assert [p.name for p in state_dir.workspace.iterdir()] == ["a.txt"]


def test_a_write_replaced_in_place_takes_the_full_path(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupt and resume writes are replaced, not added: their bytes count, not only keys."""
    from langgraph.types import Interrupt

    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
        saver = agent.graph.checkpointer
        assert saver is not None
        head = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert head is not None
        (task_id,) = {w[0] for w in head.pending_writes or () if w[1] == "__interrupt__"}
        other = [Interrupt(value={"type": "review"}, id="x")]
        saver.put_writes(head.config, [("__interrupt__", other)], task_id=task_id)
        loads = _count_state_loads(agent, monkeypatch)
        agent.resume("t")
        assert loads


def test_status_then_resume_in_a_fresh_agent_loads_the_state_once(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process asks what waits, then answers it: ``status`` read it, ``resume`` reuses it."""
    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
    with _agent(state_dir) as fresh:
        loads = _count_state_loads(fresh, monkeypatch)
        waiting = fresh.status("t")
        assert len(loads) == 1
        after = fresh.resume("t", answers={waiting.interrupts[0].id: APPROVE})
        assert len(loads) == 1
        assert (_pending_path(waiting), _pending_path(after)) == ("a.txt", "b.txt")
    assert [p.name for p in state_dir.workspace.iterdir()] == ["a.txt"]


def test_a_thread_moved_after_status_takes_the_full_path(
    state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``status`` read is vouched for by the head it saw, like a run's own interrupts."""
    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
    with _agent(state_dir) as fresh:
        waiting = fresh.status("t")
        saver = fresh.graph.checkpointer
        assert saver is not None
        head = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert head is not None
        saver.put_writes(head.config, [("__resume__", {"stray": True})], task_id="someone-else")
        loads = _count_state_loads(fresh, monkeypatch)
        fresh.resume("t", answers={waiting.interrupts[0].id: APPROVE})
        assert loads
