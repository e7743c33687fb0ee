"""``build_agent``: the graph of docs/architecture.md, "The graph".

```
START → agent ─┬─ no tool calls ───────────────────────────────> END
               ├─ reads / malformed calls ──> tools ─┬─> agent
               │                                     └─> review (effect calls left)
               └─ side-effect calls ─> review (interrupt) ─┬─ Send ─> effect:<tool> ─┐
                                                            ├─ Send ─> effect:<tool> ─┼─> agent
                                                            └─ rejected → ToolMessage ┘
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from effectgate import _failpoints
from effectgate._clock import Clock, SystemClock
from effectgate._process import new_worker_id
from effectgate.dispatch import Dispatcher
from effectgate.graph._messages import pending_calls
from effectgate.graph._nodes import (
    make_agent_node,
    make_effect_node,
    make_tools_node,
    malformed_reason,
)
from effectgate.graph._policy import Policy
from effectgate.graph._review import make_review_node
from effectgate.graph._state import AgentState, effect_node_name
from effectgate.ledger import Ledger, Operation
from effectgate.tools import ToolSpec, from_langchain_tool

__all__ = ["AgentParts", "build_agent", "new_worker_id", "to_specs"]


def to_specs(tools: Sequence[ToolSpec | BaseTool]) -> dict[str, ToolSpec]:
    """Turn tools into ``ToolSpec``s by name; plain LangChain tools become ``unsafe``.

    Raises:
        ValueError: two tools share a name.
    """
    out: dict[str, ToolSpec] = {}
    for tool in tools:
        spec = tool if isinstance(tool, ToolSpec) else from_langchain_tool(tool)
        if spec.name in out:
            raise ValueError(f"two tools are named {spec.name!r}")
        out[spec.name] = spec
    return out


class AgentParts:
    """The compiled graph and the pieces built around it (ledger, dispatcher, tools)."""

    def __init__(
        self,
        *,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        ledger: Ledger,
        dispatcher: Dispatcher,
        specs: Mapping[str, ToolSpec],
        policy: Policy,
        clock: Clock,
    ) -> None:
        self.graph = graph
        self.ledger = ledger
        self.dispatcher = dispatcher
        self.specs = dict(specs)
        self.policy = policy
        self.clock = clock


def _route_after_agent(specs: Mapping[str, ToolSpec]) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        calls = pending_calls(state["messages"])
        if not calls:
            return END
        for call in calls:
            if malformed_reason(call, specs) is not None or specs[call.name].is_read:
                return "tools"
        return "review"

    return route


def _route_after_tools(specs: Mapping[str, ToolSpec]) -> Callable[[AgentState], str]:
    def route(state: AgentState) -> str:
        left = [c for c in pending_calls(state["messages"]) if c.name in specs]
        return "review" if left else "agent"

    return route


def build_agent(
    model: BaseChatModel,
    tools: Sequence[ToolSpec | BaseTool],
    *,
    ledger: Ledger,
    checkpointer: BaseCheckpointSaver[Any] | None,
    policy: Policy | None = None,
    system_prompt: str | None = None,
    worker: str | None = None,
    clock: Clock | None = None,
    on_wait: Callable[[Operation, float], None] | None = None,
) -> AgentParts:
    """Build the agent graph with a review interrupt and one node per side effect.

    Args:
        model: a chat model supporting ``bind_tools`` (``ChatOpenAI``, the
            scripted model).
        tools: ``ToolSpec``s and/or LangChain tools (undeclared ones are unsafe).
        ledger: the operation ledger every dispatch consults first.
        checkpointer: LangGraph saver (``SqliteSaver``); runs use
            ``durability="sync"``.
        policy: approval TTL, auto-approval, default budget.
        system_prompt: prepended to every model call, never stored in state.
        worker: this process's worker id (``claimed_by``); default: new.
        clock: time source for approvals and backoff.
        on_wait: progress hook called before each backoff wait (seconds).

    Returns:
        ``AgentParts`` whose ``graph`` is the compiled ``StateGraph``. Use
        ``effectgate.Agent`` to run threads with leases and safe resumes.

    Raises:
        ValueError: two tools share a name.
        ConfigError: ``EFFECTGATE_FAILPOINT`` names a seam or tool that does
            not exist, so the crash it asks for could never happen.
    """
    policy = policy or Policy()
    clock = clock or SystemClock()
    specs = to_specs(tools)
    effects = {n: s for n, s in specs.items() if not s.is_read}
    _failpoints.check(effects)
    dispatcher = Dispatcher(
        ledger,
        effects,
        worker=worker or new_worker_id(),
        clock=clock,
        on_wait=on_wait,
        default_budget=policy.budget,
    )
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(AgentState)
    builder.add_node("agent", make_agent_node(model, specs, system_prompt))
    builder.add_node("tools", make_tools_node(specs))
    builder.add_node(
        "review",
        make_review_node(specs=effects, ledger=ledger, policy=policy, clock=clock),
        destinations=("agent", *(effect_node_name(n) for n in effects)),
    )
    for name, spec in effects.items():
        builder.add_node(
            effect_node_name(name),
            make_effect_node(
                spec, dispatcher=dispatcher, ledger=ledger, policy=policy, clock=clock
            ),
        )
        builder.add_edge(effect_node_name(name), "agent")
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", _route_after_agent(specs), ["tools", "review", END])
    builder.add_conditional_edges("tools", _route_after_tools(effects), ["review", "agent"])
    graph = builder.compile(checkpointer=checkpointer)
    return AgentParts(
        graph=graph, ledger=ledger, dispatcher=dispatcher, specs=specs, policy=policy, clock=clock
    )
