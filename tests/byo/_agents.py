"""The agents a user already has, gated by effectgate (shared by the tests and the worker).

- ``user_graph``: a hand-written ``StateGraph`` with its own state (an extra
  ``turns`` counter, plain ``add_messages``) and its own model node, gated with
  ``add_effect_nodes``.
- ``parent_graph``: the same graph compiled without a checkpointer and added
  as a node of a parent graph (it inherits the parent's checkpointer).
- ``middleware_agent`` / ``hitl_agent``: LangChain ``create_agent`` with
  ``EffectGateMiddleware``, or with plain ``HumanInTheLoopMiddleware``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from effectgate.graph import EffectGate, add_effect_nodes, ensure_call_ids
from effectgate.ledger import Ledger
from effectgate.tools import ToolSpec


class UserState(TypedDict):
    """A user's own state: messages plus a field effectgate knows nothing about."""

    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def build_user_graph(
    model: BaseChatModel,
    tools: Sequence[ToolSpec],
    *,
    ledger: Ledger,
    trace: list[str] | None = None,
    **gate_options: Any,
) -> tuple[StateGraph[Any, Any, Any, Any], EffectGate]:
    """The user's builder, with effectgate's nodes added (not compiled).

    ``trace`` gets ``"call_model"`` each time the model node runs;
    ``gate_options`` go to ``add_effect_nodes`` (policy, clock).
    """
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(UserState)
    gate_box: list[EffectGate] = []

    def call_model(state: UserState, config: RunnableConfig) -> dict[str, Any]:
        if trace is not None:
            trace.append("call_model")
        bound = model.bind_tools(gate_box[0].tool_schemas)
        reply = bound.invoke(state["messages"])
        assert isinstance(reply, AIMessage)
        thread_id = str(config["configurable"]["thread_id"])
        reply = ensure_call_ids(reply, state["messages"], thread_id=thread_id)
        return {"messages": [reply], "turns": state.get("turns", 0) + 1}

    builder.add_node("call_model", call_model)
    builder.add_edge(START, "call_model")
    gate_box.append(
        add_effect_nodes(
            builder, tools, ledger=ledger, after="call_model", then="call_model", **gate_options
        )
    )
    return builder, gate_box[0]


def user_graph(
    model: BaseChatModel,
    tools: Sequence[ToolSpec],
    *,
    ledger: Ledger,
    checkpointer: BaseCheckpointSaver[Any],
) -> Any:
    """The user's graph, compiled on its own."""
    builder, _ = build_user_graph(model, tools, ledger=ledger)
    return builder.compile(checkpointer=checkpointer)


class ParentState(TypedDict):
    """A parent graph's state: the child's messages, plus a note of its own."""

    messages: Annotated[list[AnyMessage], add_messages]
    turns: int
    intake: str


def parent_graph(
    model: BaseChatModel,
    tools: Sequence[ToolSpec],
    *,
    ledger: Ledger,
    checkpointer: BaseCheckpointSaver[Any],
    trace: list[str] | None = None,
) -> Any:
    """A parent graph running the user's gated graph as a subgraph node.

    ``trace`` gets ``"intake"`` and ``"call_model"`` each time those nodes run.
    """
    child_builder, _ = build_user_graph(model, tools, ledger=ledger, trace=trace)
    child = child_builder.compile()  # the parent's checkpointer is used
    parent: StateGraph[Any, Any, Any, Any] = StateGraph(ParentState)

    def intake(state: ParentState) -> dict[str, Any]:
        if trace is not None:
            trace.append("intake")
        return {"intake": "triaged"}

    parent.add_node("intake", intake)
    parent.add_node("incident", child)
    parent.add_edge(START, "intake")
    parent.add_edge("intake", "incident")
    return parent.compile(checkpointer=checkpointer)


def middleware_agent(
    model: BaseChatModel,
    tools: Sequence[ToolSpec],
    *,
    ledger: Ledger,
    checkpointer: BaseCheckpointSaver[Any],
) -> Any:
    """``create_agent`` with ``EffectGateMiddleware`` in place of HITL, guarded (``gate.guard``)."""
    from langchain.agents import create_agent

    from effectgate.middleware import EffectGateMiddleware

    gate = EffectGateMiddleware(tools, ledger=ledger)
    return gate.guard(create_agent(model, middleware=[gate], checkpointer=checkpointer))


def hitl_agent(
    model: BaseChatModel,
    tools: Sequence[ToolSpec],
    *,
    checkpointer: BaseCheckpointSaver[Any],
) -> Any:
    """The agent users have today: ``create_agent`` with ``HumanInTheLoopMiddleware``.

    The tools are the same ``ToolSpec``s run as plain LangChain tools (their
    functions called directly, as any ``@tool`` would be): no ledger.
    """
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    plain = [_plain_tool(spec) for spec in tools]
    gated = {spec.name: True for spec in tools if not spec.is_read}
    return create_agent(
        model,
        tools=plain,
        middleware=[HumanInTheLoopMiddleware(interrupt_on=gated)],
        checkpointer=checkpointer,
    )


def _plain_tool(spec: ToolSpec) -> Any:
    """``spec`` as an ordinary ``@tool``: every call is a new request (a fresh key).

    ``BYO_KILL_AFTER=<tool>`` exits the process right after that tool's
    external call returned, before LangGraph saves its result: the kill the
    ledger exists for.
    """
    import json
    import os
    import uuid

    from langchain_core.tools import StructuredTool

    from effectgate.tools import ToolContext

    def run(**kwargs: Any) -> str:
        args = spec.normalize(kwargs)
        request_id = uuid.uuid4().hex
        ctx = ToolContext(operation_id=request_id, thread_id="", tool_call_id="", attempt=1)
        result = spec.call(args, ctx)
        if os.environ.get("BYO_KILL_AFTER") == spec.name:
            os._exit(137)
        return json.dumps({"status": "ok", "result": result.value}, default=str)

    return StructuredTool.from_function(
        func=run, name=spec.name, description=spec.description, args_schema=spec.args_schema
    )
