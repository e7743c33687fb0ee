"""``Agent.status`` of a thread paused at an interrupt, read in a fresh agent without ``get_state``.

The cheap reading (``ThreadReader.waiting_at_head``: ``head_state`` plus a byte scan
for other threads' operations) must give what the full path gives, on every
thread shape; where it is not sure it must step aside. Each case opens a fresh
agent twice on the same directory (nothing remembered between them): once as
is, once with the cheap reading switched off, and compares the two results,
what they leave for the next ``resume`` (``_stops``), and ``head_state``
against LangGraph's ``get_state``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langgraph.types import interrupt
from pydantic import BaseModel

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError, OutcomeUnknown
from effectgate.graph import Agent, RunStatus, StepDurableSaver
from effectgate.graph._saver import head_state
from effectgate.models import ScriptedChatModel, load_script
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

APPROVE_ONE = {"decisions": [{"type": "approve"}], "reviewer": "test"}
APPROVE_ALL = {"decisions": [{"type": "approve"}] * 3, "reviewer": "test"}


class _N(BaseModel):
    n: int


def _note(args: _N, ctx: ToolContext) -> ToolResult:
    return ToolResult(value={"n": args.n})


def _ask(args: _N, ctx: ToolContext) -> ToolResult:
    return ToolResult(value={"priority": interrupt({"question": f"Priority of {args.n}?"})})


def _ring(args: _N, ctx: ToolContext) -> ToolResult:
    if ctx.attempt == 1:
        raise OutcomeUnknown("the bell's answer was lost")
    return ToolResult(value={"rang": args.n}, reference=f"ring-{args.n}")


def _spec(name: str, kind: EffectKind, func: Any, **extra: Any) -> ToolSpec:
    return ToolSpec(
        name=name, description=f"{name}.", args_schema=_N, func=func, kind=kind, **extra
    )


TOOLS = [
    _spec("note", EffectKind.UNSAFE, _note),
    _spec("peek", EffectKind.READ, _note, requires_approval=True),
    _spec("ask", EffectKind.READ, _ask),
    _spec("ring", EffectKind.UNSAFE, _ring),
]


def _call(name: str, n: int) -> dict[str, Any]:
    return {"name": name, "args": {"n": n}}


class _Broken(BaseChatModel):
    """A chat model whose every call fails: the agent node's task records an error."""

    @property
    def _llm_type(self) -> str:
        return "broken"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise RuntimeError("the model is down")

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


Opener = Callable[[], AbstractContextManager[Agent]]


def _scripted(root: Path, calls: list[dict[str, Any]]) -> Opener:
    script = {"name": "shape", "turns": [{"say": "working", "tool_calls": calls}], "final": "Done."}

    def opener() -> AbstractContextManager[Agent]:
        return open_agent(root, model=ScriptedChatModel.from_script(script), tools=TOOLS)

    return opener


def _one_review(root: Path) -> Opener:
    opener = _scripted(root, [_call("note", 1)])
    with opener() as agent:
        assert agent.start("go", thread_id="t").status is RunStatus.WAITING_REVIEW
    return opener


def _review_of_three(root: Path) -> Opener:
    opener = _scripted(root, [_call("note", 1), _call("ring", 2), _call("note", 3)])
    with opener() as agent:
        (review,) = agent.start("go", thread_id="t").interrupts
        assert len(review.value["action_requests"]) == 3
    return opener


def _gated_read(root: Path) -> Opener:
    opener = _scripted(root, [_call("peek", 1), _call("peek", 2)])
    with opener() as agent:
        assert agent.start("go", thread_id="t").status is RunStatus.WAITING_REVIEW
    return opener


def _question(root: Path) -> Opener:
    opener = _scripted(root, [_call("ask", 1), _call("ask", 2)])
    with opener() as agent:
        (asked,) = agent.start("go", thread_id="t").interrupts
        assert asked.kind == "question"
    return opener


def _two_reconciliations(root: Path) -> Opener:
    """Two effect tasks each waiting at a reconciliation; a third task finished."""
    opener = _scripted(root, [_call("ring", 1), _call("ring", 2), _call("note", 3)])
    with opener() as agent:
        (review,) = agent.start("go", thread_id="t").interrupts
        waiting = agent.resume("t", answers={review.id: APPROVE_ALL})
        assert [p.kind for p in waiting.interrupts] == ["reconciliation"] * 2
    return opener


def _partly_answered(root: Path) -> Opener:
    """Of two reconciliations in one superstep, one answered: its task finished."""
    opener = _two_reconciliations(root)
    with opener() as agent:
        first, second = agent.status("t").interrupts
        left = agent.resume("t", answers={first.id: {"verdict": "failed"}})
        assert [p.id for p in left.interrupts] == [second.id]
    return opener


def _errored(root: Path) -> Opener:
    def opener() -> AbstractContextManager[Agent]:
        return open_agent(root, model=_Broken(), tools=TOOLS)

    with opener() as agent:
        assert agent.start("go", thread_id="t").error
    return opener


def _finished(root: Path) -> Opener:
    opener = _one_review(root)
    with opener() as agent:
        (review,) = agent.status("t").interrupts
        assert agent.resume("t", answers={review.id: APPROVE_ONE}).status is RunStatus.DONE
    return opener


def _not_started(root: Path) -> Opener:
    return _scripted(root, [_call("note", 1)])


SHAPES: dict[str, tuple[Callable[[Path], Opener], bool]] = {
    # shape: (build it, whether the cheap reading answers)
    "one review": (_one_review, True),
    "one review of three calls": (_review_of_three, True),
    "gated reads": (_gated_read, True),
    "question": (_question, True),
    "two reconciliations": (_two_reconciliations, True),
    "partly answered": (_partly_answered, True),
    "errored task": (_errored, False),
    "finished": (_finished, False),
    "not started": (_not_started, False),
}


def _task_view(tasks: Any) -> list[tuple[Any, ...]]:
    return [(t.id, t.name, t.path, repr(t.error), t.interrupts) for t in tasks]


def _compare(opener: Opener, thread: str) -> bool:
    """Fast and full ``status`` of ``thread`` in fresh agents; whether the fast one answered."""
    answered: list[bool] = []
    with opener() as agent:
        cheap = agent._reader.waiting_at_head

        def spy(thread_id: str, head: Any) -> Any:
            found = cheap(thread_id, head)
            answered.append(found is not None)
            return found

        agent._reader.waiting_at_head = spy  # type: ignore[method-assign]
        fast = agent.status(thread)
        fast_stop = agent._stops.get(thread)
        saver = agent.graph.checkpointer
        assert isinstance(saver, StepDurableSaver)
        state = head_state(agent.graph, saver, agent._config(thread))
        snapshot = agent.graph.get_state(agent._config(thread))
        if state is not None:
            assert _task_view(state.tasks) == _task_view(snapshot.tasks)
            assert state.interrupts == snapshot.interrupts
    with opener() as agent:
        agent._reader.waiting_at_head = lambda thread_id, head: None  # type: ignore[method-assign]
        full = agent.status(thread)
        full_stop = agent._stops.get(thread)
    assert fast == full
    assert fast_stop == full_stop
    return answered == [True]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_cold_status_matches_the_full_path(tmp_path: Path, shape: str) -> None:
    build, cheap = SHAPES[shape]
    opener = build(tmp_path / "state")
    assert _compare(opener, "t") is cheap


@contextmanager
def _incident(sd: StateDir, svc: DemoServices) -> Iterator[Agent]:
    model = ScriptedChatModel.from_script(load_script("incident"))
    with open_agent(sd, model=model, endpoints=svc.endpoints) as agent:
        yield agent


def test_a_thread_naming_another_threads_operation_takes_the_full_path(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Tuesday met Monday's ticket by its key: its status lists it (``shared_operations``)."""
    with _incident(state_dir, services) as agent:
        (first,) = agent.start("Handle the incident.", thread_id="monday").interrupts
        (second,) = agent.resume("monday", answers={first.id: APPROVE_ONE}).interrupts
        both = {"decisions": [{"type": "approve"}] * 2, "reviewer": "test"}
        assert agent.resume("monday", answers={second.id: both}).status is RunStatus.DONE
        assert agent.start("Handle the incident.", thread_id="tuesday").shared_operations

    def opener() -> AbstractContextManager[Agent]:
        return _incident(state_dir, services)

    for thread in ("tuesday", "monday"):
        assert _compare(opener, thread) is False
    with opener() as agent:
        assert [op.thread_id for op in agent.status("tuesday").shared_operations] == ["monday"]


def _spied_resume(
    agent: Agent, thread: str, *, cheap: bool = True, answered: list[bool] | None = None
) -> tuple[Any, list[bool]]:
    """``agent.resume(thread)``, recording whether ``_continue_at_head`` answered."""
    answered = [] if answered is None else answered
    original = agent._continue_at_head

    def spy(thread_id: str) -> Any:
        found = original(thread_id) if cheap else None
        answered.append(found is not None)
        return found

    agent._continue_at_head = spy  # type: ignore[method-assign]
    return agent.resume(thread), answered


def test_resuming_an_errored_task_without_answers_matches_the_full_path(tmp_path: Path) -> None:
    """Tasks left and no interrupt: the cheap path runs them, as the full path does."""
    opener = _errored(tmp_path / "state")
    with opener() as agent:
        fast, answered = _spied_resume(agent, "t")
    assert answered == [True]
    with opener() as agent:
        full, answered = _spied_resume(agent, "t", cheap=False)
    assert answered == [False]
    assert (fast.status, fast.error, fast.operations) == (full.status, full.error, full.operations)
    assert "the model is down" in str(fast.error)


@pytest.mark.parametrize("shape", ["one review", "finished", "not started"])
def test_resuming_without_answers_steps_aside_where_nothing_is_left_to_run(
    tmp_path: Path, shape: str
) -> None:
    """A thread at an interrupt, done or never run is the full path's to report or start."""
    opener = SHAPES[shape][0](tmp_path / "state")
    answered: list[bool] = []
    with opener() as agent:
        try:
            _spied_resume(agent, "t", answered=answered)
        except ConfigError:
            assert shape == "not started"  # never begun, no record: "unknown thread"
    assert answered == [False]


def test_recovery_after_a_kill_takes_the_cheap_path_and_acts_once(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A worker killed after claiming the file write: the next resume runs on without
    loading the messages first, and the world holds one ticket, one mail, one file."""
    from effectgate.cli import ExitCode
    from effectgate.testing import Failpoint
    from tests.conftest import run_worker
    from tests.crash.test_graph_crash import assert_incident_done_once

    spec = f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@write_file"
    assert run_worker(state_dir, "t1", failpoint=spec).returncode == ExitCode.KILLED
    with _incident(state_dir, services) as agent:
        result, answered = _spied_resume(agent, "t1")
    assert answered == [True]
    assert result.status is RunStatus.DONE, result.error
    assert_incident_done_once(state_dir, "t1")
