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
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from effectgate._clock import Clock, SystemClock
from effectgate._process import new_worker_id
from effectgate.dispatch import Dispatcher
from effectgate.graph._blocks import add_effect_nodes, opaque_node, to_specs
from effectgate.graph._nodes import make_agent_node
from effectgate.graph._policy import Policy
from effectgate.graph._state import AgentState
from effectgate.ledger import LeaseKeeper, Ledger, Operation
from effectgate.tools import ToolSpec

__all__ = ["AgentParts", "build_agent", "new_worker_id", "to_specs"]


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
    leases: LeaseKeeper | None = None,
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
        leases: the thread-lease keeper of the runner that runs the graph
            (``Agent`` passes its own); default: the dispatcher holds each
            dispatched thread's lease itself (``Dispatcher``).

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
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(AgentState)
    agent = make_agent_node(model, specs, system_prompt, ledger=ledger, clock=clock)
    builder.add_node("agent", opaque_node(agent), input_schema=AgentState)
    builder.add_edge(START, "agent")
    gate = add_effect_nodes(
        builder,
        specs.values(),
        ledger=ledger,
        after="agent",
        then="agent",
        policy=policy,
        clock=clock,
        worker=worker,
        on_wait=on_wait,
        leases=leases,
    )
    graph = builder.compile(checkpointer=checkpointer)
    return AgentParts(
        graph=graph,
        ledger=ledger,
        dispatcher=gate.dispatcher,
        specs=specs,
        policy=policy,
        clock=clock,
    )
