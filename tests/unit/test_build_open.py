"""Building the agent graph: effectgate's own nodes are not searched for subgraphs.

LangGraph's ``compile`` disassembles every node function looking for a
subgraph it calls (``find_subgraph_pregel``); for effectgate's nodes, which
call none, that search was most of the CPU time of ``open_agent``.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.pregel import _utils

from effectgate.graph import AgentState, EffectTask, add_effect_nodes, build_agent
from effectgate.ledger import SqliteLedger
from effectgate.models import ScriptedChatModel
from effectgate.tools import ToolSpec
from effectgate.tools.builtin import file_tools


def _searched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the node functions LangGraph disassembles from now on."""
    seen: list[str] = []
    real = _utils.get_function_nonlocals

    def counted(func: Any) -> Any:
        if isinstance(func, FunctionType):
            seen.append(func.__name__)
        return real(func)

    monkeypatch.setattr(_utils, "get_function_nonlocals", counted)
    return seen


def _tools(tmp_path: Any) -> list[ToolSpec]:
    return list(file_tools(tmp_path))


def test_build_agent_does_not_search_its_own_nodes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    searched = _searched(monkeypatch)
    parts = build_agent(
        ScriptedChatModel.from_script({"turns": [], "final": "ok"}),
        _tools(tmp_path),
        ledger=SqliteLedger(tmp_path / "ledger.sqlite3"),
        checkpointer=InMemorySaver(),
    )
    assert searched == []
    nodes = parts.graph.builder.nodes
    assert nodes["agent"].input_schema is AgentState
    assert nodes["review"].input_schema is AgentState
    effects = [name for name in nodes if name.startswith("effect.")]
    assert effects and all(nodes[name].input_schema is EffectTask for name in effects)
    assert all(not node.subgraphs for node in parts.graph.nodes.values())


def test_a_users_own_node_is_still_searched(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only effectgate's nodes skip the search: a user's node may call a subgraph."""
    searched = _searched(monkeypatch)

    def my_model(state: AgentState) -> dict[str, Any]:
        return {"messages": []}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(AgentState)
    builder.add_node("agent", my_model)
    builder.add_edge(START, "agent")
    add_effect_nodes(builder, _tools(tmp_path), ledger=SqliteLedger(tmp_path / "l.sqlite3"))
    builder.compile()
    assert searched == ["my_model"]
