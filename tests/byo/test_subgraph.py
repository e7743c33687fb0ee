"""effectgate's review and effect nodes inside a subgraph of a user's parent graph."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import BaseModel

from effectgate import StateDir, default_tools
from effectgate.demo.services import DemoServices
from effectgate.errors import DecisionError, OutcomeUnknown
from effectgate.graph import resume_command
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import ScriptedChatModel, make_model
from effectgate.testing.oracle import world
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec
from tests.byo._agents import parent_graph
from tests.byo.conftest import all_checkpoint_problems

CONFIG: Any = {"configurable": {"thread_id": "t1"}}


@pytest.fixture
def files(state_dir: StateDir) -> Iterator[tuple[SqliteLedger, SqliteSaver]]:
    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with SqliteLedger(state_dir.ledger) as ledger:
        yield ledger, SqliteSaver(conn)
    conn.close()


def approve_all(value: Any) -> dict[str, Any]:
    return {"decisions": [{"type": "approve"} for _ in value["action_requests"]]}


def test_one_resume_runs_nothing_twice(
    services: DemoServices, state_dir: StateDir, files: tuple[SqliteLedger, SqliteSaver]
) -> None:
    """Each resume continues inside the subgraph: no node re-runs, each review is shown once."""
    ledger, saver = files
    trace: list[str] = []
    graph = parent_graph(
        make_model("scripted:incident"),
        default_tools(state_dir.workspace, services.endpoints),
        ledger=ledger,
        checkpointer=saver,
        trace=trace,
    )
    out = graph.invoke({"messages": [HumanMessage("handle it")]}, CONFIG, version="v2")
    shown: list[list[str]] = []
    while out.interrupts:
        (pending,) = out.interrupts  # shown once, not once per graph level
        assert [i.id for i in graph.get_state(CONFIG).interrupts] == [pending.id]
        shown.append([a["name"] for a in pending.value["action_requests"]])
        command = resume_command(graph, CONFIG, approve_all(pending.value))
        out = graph.invoke(command, CONFIG, version="v2")
    assert shown == [["create_ticket"], ["send_email", "write_file"]]
    # 4 model turns (read, ticket, mail + note, summary), the parent's node once
    assert trace.count("call_model") == 4 and trace.count("intake") == 1, trace
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
    assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.SUCCEEDED}
    assert out.value["intake"] == "triaged" and out.value["turns"] == 4
    assert all_checkpoint_problems(state_dir.checkpoints, "t1") == []


class _Args(BaseModel):
    what: str


def _lost_reply_tool(name: str, calls: list[str]) -> ToolSpec:
    """An unsafe tool whose answer is always lost: its outcome needs a human verdict."""

    def run(args: _Args, ctx: ToolContext) -> ToolResult:
        calls.append(name)
        raise OutcomeUnknown("connection reset after the request was sent")

    return ToolSpec(
        name=name,
        description=f"{name} something",
        args_schema=_Args,
        func=run,
        kind=EffectKind.UNSAFE,
    )


def test_bare_resume_refused_with_two_interrupts_in_one_subgraph_task(
    state_dir: StateDir, files: tuple[SqliteLedger, SqliteSaver]
) -> None:
    """Two reconciliations wait in one subgraph task: one answer is refused, a map by id works."""
    ledger, saver = files
    calls: list[str] = []
    model = ScriptedChatModel.from_script(
        {
            "name": "two-writes",
            "turns": [
                {
                    "say": "Both at once.",
                    "tool_calls": [
                        {"name": "push_a", "args": {"what": "a"}},
                        {"name": "push_b", "args": {"what": "b"}},
                    ],
                }
            ],
            "final": "done",
        }
    )
    tools = [_lost_reply_tool("push_a", calls), _lost_reply_tool("push_b", calls)]
    graph = parent_graph(model, tools, ledger=ledger, checkpointer=saver)
    out = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, version="v2")
    (review,) = out.interrupts
    out = graph.invoke(resume_command(graph, CONFIG, approve_all(review.value)), CONFIG)
    snapshot = graph.get_state(CONFIG)
    pending = snapshot.interrupts
    assert sorted(i.value["type"] for i in pending) == ["reconciliation"] * 2
    # both wait inside the one task of the parent that runs the subgraph
    assert [len(t.interrupts) for t in snapshot.tasks if t.interrupts] == [2]
    verdict = {"verdict": "failed", "attempt": 1, "evidence": "not in the remote log"}
    with pytest.raises(DecisionError, match="2 interrupts are pending"):
        resume_command(graph, CONFIG, verdict)
    with pytest.raises(DecisionError, match="pending too"):
        resume_command(graph, CONFIG, by_id={pending[0].id: verdict})
    with pytest.raises(DecisionError, match="not pending"):
        resume_command(graph, CONFIG, by_id={i.id: verdict for i in pending} | {"x": verdict})
    command = resume_command(graph, CONFIG, by_id={i.id: verdict for i in pending})
    out = graph.invoke(command, CONFIG, version="v2")
    assert out.interrupts == ()
    assert sorted(calls) == ["push_a", "push_b"]  # each called once; the verdicts ended them
    assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.FAILED}
    assert all_checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_two_re_reviews_in_one_subgraph_task_answered_by_id(
    state_dir: StateDir, files: tuple[SqliteLedger, SqliteSaver]
) -> None:
    """Two approvals expire before their effect nodes run: two reviews wait in one task.

    The child stops before its effect nodes (a static breakpoint), the clock
    passes the approval TTL, and each effect node asks its reviewer again.
    One bare answer is refused; answers by interrupt id run each call once.
    """
    from datetime import timedelta

    from langgraph.graph import START, StateGraph

    from effectgate.graph import Policy
    from effectgate.testing import FakeClock
    from tests.byo._agents import ParentState, build_user_graph

    ledger, saver = files
    clock = FakeClock()
    calls: list[str] = []

    def record(name: str) -> ToolSpec:
        def run(args: _Args, ctx: ToolContext) -> ToolResult:
            calls.append(name)
            return ToolResult(value={"pushed": args.what})

        return ToolSpec(
            name=name, description=name, args_schema=_Args, func=run, kind=EffectKind.IDEMPOTENT
        )

    model = ScriptedChatModel.from_script(
        {
            "name": "two-writes",
            "turns": [
                {
                    "say": "Both at once.",
                    "tool_calls": [
                        {"name": "push_a", "args": {"what": "a"}},
                        {"name": "push_b", "args": {"what": "b"}},
                    ],
                }
            ],
            "final": "done",
        }
    )
    builder, _ = build_user_graph(
        model,
        [record("push_a"), record("push_b")],
        ledger=ledger,
        clock=clock,
        policy=Policy(approval_ttl=timedelta(minutes=5)),
    )
    child = builder.compile(interrupt_before=["effect.push_a", "effect.push_b"])
    parent: StateGraph[Any, Any, Any, Any] = StateGraph(ParentState)
    parent.add_node("incident", child)
    parent.add_edge(START, "incident")
    graph = parent.compile(checkpointer=saver)
    out = graph.invoke({"messages": [HumanMessage("go")]}, CONFIG, version="v2")
    (review,) = out.interrupts
    graph.invoke(resume_command(graph, CONFIG, approve_all(review.value)), CONFIG)
    clock.advance(timedelta(hours=1))  # both approvals expire before dispatch
    graph.invoke(None, CONFIG)
    snapshot = graph.get_state(CONFIG)
    pending = snapshot.interrupts
    assert [i.value["type"] for i in pending] == ["review", "review"]
    assert [len(t.interrupts) for t in snapshot.tasks if t.interrupts] == [2]
    assert calls == []
    one = {"decisions": [{"type": "approve"}]}
    with pytest.raises(DecisionError, match="2 interrupts are pending"):
        resume_command(graph, CONFIG, one)
    out = graph.invoke(
        resume_command(graph, CONFIG, by_id={i.id: one for i in pending}), CONFIG, version="v2"
    )
    assert out.interrupts == ()
    assert sorted(calls) == ["push_a", "push_b"]
    assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.SUCCEEDED}
    assert all_checkpoint_problems(state_dir.checkpoints, "t1") == []
