"""``add_effect_nodes`` in a user's own ``StateGraph``: routing, names, call ids."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import StateGraph
from langgraph.types import Command
from pydantic import BaseModel

from effectgate import StateDir, default_tools
from effectgate.demo.services import DemoServices
from effectgate.graph import add_effect_nodes
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import ScriptedChatModel, make_model
from effectgate.testing.oracle import world
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec
from tests.byo._agents import UserState, user_graph
from tests.byo.conftest import all_checkpoint_problems

CONFIG: Any = {"configurable": {"thread_id": "t1"}}


@pytest.fixture
def files(state_dir: StateDir) -> Iterator[tuple[SqliteLedger, SqliteSaver]]:
    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with SqliteLedger(state_dir.ledger) as ledger:
        yield ledger, SqliteSaver(conn)
    conn.close()


def test_user_state_and_model_node_kept(
    services: DemoServices, state_dir: StateDir, files: tuple[SqliteLedger, SqliteSaver]
) -> None:
    """The user's extra field and model node work beside effectgate's nodes; a reject routes back.

    effectgate's review node continues at ``agent`` when nothing is left to
    run; in a graph whose model node is ``call_model`` that must be rewritten,
    or LangGraph fails on the missing node.
    """
    ledger, saver = files
    graph = user_graph(
        make_model("scripted:incident"),
        default_tools(state_dir.workspace, services.endpoints),
        ledger=ledger,
        checkpointer=saver,
    )
    out = graph.invoke({"messages": [HumanMessage("go")], "turns": 0}, CONFIG, version="v2")
    assert {"tools", "review", "effect.create_ticket"} <= set(graph.get_graph().nodes)
    reject = {"decisions": [{"type": "reject", "message": "not today"}]}
    out = graph.invoke(Command(resume=reject), CONFIG, version="v2")
    assert out.interrupts == ()
    assert out.value["turns"] == 3  # read, ticket (rejected), the model's closing turn
    assert world(state_dir).tickets == 0
    assert [op.state for op in ledger.list(thread_id="t1")] == [OpState.REJECTED]
    assert all_checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_node_name_clash_is_refused(files: tuple[SqliteLedger, SqliteSaver]) -> None:
    """A graph that already has a ``review`` node is told which names effectgate adds."""
    ledger, _ = files
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(UserState)
    builder.add_node("review", lambda state: {})
    with pytest.raises(ValueError, match="already has node"):
        add_effect_nodes(builder, [], ledger=ledger, after=None)


class _Note(BaseModel):
    text: str


def test_reused_call_ids_become_unique(files: tuple[SqliteLedger, SqliteSaver]) -> None:
    """A model that numbers its calls per message (``call_0`` each turn) still gets both writes.

    The default operation id is ``{thread}:{tool_call_id}``: without
    ``ensure_call_ids`` in the user's model node, the second ``call_0`` would
    be read back as the first one's finished operation and never run.
    """
    ledger, saver = files
    sent: list[str] = []

    def post(args: _Note, ctx: ToolContext) -> ToolResult:
        sent.append(args.text)
        return ToolResult(value={"posted": args.text})

    tool = ToolSpec(
        name="post_note",
        description="post a note",
        args_schema=_Note,
        func=post,
        kind=EffectKind.IDEMPOTENT,
        requires_approval=False,
    )
    turn = [{"name": "post_note", "args": {"text": "one"}, "id": "call_0"}]
    model = ScriptedChatModel.from_script(
        {
            "name": "reused-ids",
            "turns": [
                {"say": "first", "tool_calls": turn},
                {"say": "second", "tool_calls": [{**turn[0], "args": {"text": "two"}}]},
            ],
            "final": "done",
        }
    )
    graph = user_graph(model, [tool], ledger=ledger, checkpointer=saver)
    out = graph.invoke({"messages": [HumanMessage("go")], "turns": 0}, CONFIG, version="v2")
    assert out.interrupts == ()
    assert sent == ["one", "two"]
    ids = [op.tool_call_id for op in ledger.list(thread_id="t1")]
    assert len(set(ids)) == 2 and ids[0] == "call_0"
