"""Building blocks: effectgate's review node and effect nodes in a graph of your own.

``add_effect_nodes`` adds to a user's ``StateGraph`` the same nodes
``build_agent`` uses (``build_agent`` is built with it)::

    <after> ─┬─ no tool calls ─────────────────────────────────> <done>
             ├─ reads / malformed calls ──> tools ─┬─> <then>
             │                                     └─> review (effect calls left)
             └─ side-effect calls ─> review (interrupt) ─┬─ Send ─> effect.<tool> ─┐
                                                         └─ nothing runnable ──────┴─> <then>

Why nodes added to the user's builder, not a compiled subgraph the user adds
as one node: LangGraph's ``Send`` fan-out and ``interrupt()`` are per node of
the graph that holds them. Added as nodes, each reviewed call is one task
of the user's graph, with its own checkpointed result; a resume re-runs only
the unfinished ones, and ``get_state`` shows the review interrupt once, on
the user's thread. A compiled subgraph would add a namespace, a second
state schema to keep in step, and the traps public reports describe for
interrupts inside subgraphs (a subgraph called from a node function re-runs
that function on every resume; ``get_state(subgraphs=True)`` lists the
interrupt at both levels). The graph itself may still be a subgraph of a parent (see
``docs/bring-your-own-graph.md``): the blocks only need a ``messages`` key.

State: any schema with a ``messages`` key holding LangChain messages and a
reducer that appends and replaces by id (``add_messages``, or effectgate's
``AgentState`` delta channel); other keys are left alone. The thread id is
``config["configurable"]["thread_id"]`` (in a subgraph: the parent's).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphInterrupt
from langgraph.graph import END, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, StateSnapshot

from effectgate import _failpoints
from effectgate._clock import Clock, SystemClock
from effectgate._process import new_worker_id
from effectgate.answers import check_resume_ids, refuse_goto_end_without_review
from effectgate.dispatch import Dispatcher
from effectgate.errors import DecisionError, UnknownInterruptError
from effectgate.graph._messages import pending_calls, with_call_ids, with_unique_call_ids
from effectgate.graph._nodes import make_effect_node, make_tools_node, malformed_reason
from effectgate.graph._policy import Policy
from effectgate.graph._review import make_review_node, refuse_resume_before_run
from effectgate.graph._state import EffectTask, effect_node_name
from effectgate.ledger import LeaseKeeper, Ledger, Operation
from effectgate.tools import ToolSpec, from_langchain_tool

__all__ = [
    "EffectGate",
    "GateParts",
    "ResumeGuardedGraph",
    "add_effect_nodes",
    "build_parts",
    "ensure_call_ids",
    "guard_resumes",
    "resume_command",
    "to_specs",
]

log = logging.getLogger("effectgate.dispatch")

TOOLS_NODE = "tools"
"""Node answering read-only and malformed calls."""
REVIEW_NODE = "review"
"""Node holding the review ``interrupt()``."""
_REVIEW_GOTO = "agent"
"""Where the review node sends a turn with nothing to run (fixed inside the node)."""


def to_specs(tools: Iterable[ToolSpec | BaseTool]) -> dict[str, ToolSpec]:
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


def ensure_call_ids(
    reply: AIMessage, history: Sequence[AnyMessage], *, thread_id: str
) -> AIMessage:
    """Give a model reply's tool calls ids that are present and unique in the thread.

    Call this in your own model node before returning the reply. The default
    operation id (the idempotency key) is ``{thread_id}:{tool_call_id}``: a
    call without an id could not be answered, and an id the thread already
    used (``call_0`` in every response of some servers) would alias a new
    action onto an earlier operation, which would then be replayed as done
    and never run. ``build_agent``'s model node does the same.

    Args:
        reply: the model's message.
        history: the thread's messages before ``reply``.
        thread_id: the thread (salts generated ids, so a re-run gives the same).

    Returns:
        ``reply`` itself when nothing needed fixing, else a copy.
    """
    reply = with_call_ids(reply, salt=f"{thread_id}:{len(history)}")
    return with_unique_call_ids(reply, history)


@dataclass(frozen=True, slots=True, kw_only=True)
class GateParts:
    """effectgate's node functions for one set of tools, around one dispatcher.

    The one place they are built: ``add_effect_nodes`` adds them to a graph,
    ``EffectGateMiddleware`` calls them from its hooks.
    """

    specs: dict[str, ToolSpec]
    """Every tool by name."""
    effects: dict[str, ToolSpec]
    """The side-effecting tools by name."""
    dispatcher: Dispatcher
    tools: Any
    """``tools(state, config)``: runs read-only calls, answers malformed ones."""
    review: Any
    """``review(state, config) -> Command``: the review interrupt and ledger transaction."""
    effect: dict[str, Any]
    """``effect(task) -> {"messages": [ToolMessage]}`` per side-effecting tool."""


DISPATCH_LEASE_TTL_S = 30.0
"""Seconds a dispatch's own thread lease lasts without renewal (renewed every third of it)."""


def _lease_lost(reason: str) -> None:
    # A dispatch's own lease was taken over (its renewals stopped for a whole
    # TTL: the process was stopped or cut off). The attempt number fences
    # whatever this process still records; nothing else to stop here.
    log.warning("dispatch lease lost: %s", reason)


def build_parts(
    tools: Iterable[ToolSpec | BaseTool],
    *,
    ledger: Ledger,
    policy: Policy | None = None,
    clock: Clock | None = None,
    worker: str | None = None,
    on_wait: Callable[[Operation, float], None] | None = None,
    leases: LeaseKeeper | None = None,
) -> GateParts:
    """Build the dispatcher and the node functions for ``tools`` (see ``add_effect_nodes``).

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
    worker = worker or new_worker_id()
    if leases is None:
        # No runner holds the thread's lease around this graph's runs (a
        # served graph, your own graph invoked directly): each dispatch holds
        # it itself, the heartbeat that keeps its attempt live.
        leases = LeaseKeeper(
            ledger, DISPATCH_LEASE_TTL_S, _lease_lost, name=f"effectgate-dispatch-lease {worker}"
        )
    dispatcher = Dispatcher(
        ledger,
        effects,
        worker=worker,
        clock=clock,
        on_wait=on_wait,
        default_budget=policy.budget,
        questions=(GraphInterrupt,),
        leases=leases,
    )
    return GateParts(
        specs=specs,
        effects=effects,
        dispatcher=dispatcher,
        tools=make_tools_node(specs),
        review=make_review_node(specs=effects, ledger=ledger, policy=policy, clock=clock),
        effect={
            name: make_effect_node(
                spec, dispatcher=dispatcher, ledger=ledger, policy=policy, clock=clock
            )
            for name, spec in effects.items()
        },
    )


class EffectGate:
    """What ``add_effect_nodes`` added to a graph, and the router out of the model node.

    Attributes:
        specs: every tool by name (reads and effects); bind ``tool_schemas``
            to your model.
        effects: the side-effecting tools by name (one ``effect.<tool>`` node each).
        dispatcher: the ledger-checked dispatcher the effect nodes share.
        then: the node a turn continues at after its tools ran (your model node).
        done: where ``route`` goes when the model called no tool.
    """

    def __init__(
        self,
        *,
        specs: Mapping[str, ToolSpec],
        dispatcher: Dispatcher,
        then: str,
        done: str,
    ) -> None:
        self.specs = dict(specs)
        self.effects = {n: s for n, s in self.specs.items() if not s.is_read}
        self.dispatcher = dispatcher
        self.then = then
        self.done = done

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-format tool schemas of every tool, for ``model.bind_tools``."""
        return [s.to_openai_tool() for s in self.specs.values()]

    @property
    def destinations(self) -> list[str]:
        """Every node ``route`` may return, for ``add_conditional_edges``."""
        return [TOOLS_NODE, REVIEW_NODE, self.done]

    @property
    def nodes(self) -> list[str]:
        """The node names added: ``tools``, ``review`` and ``effect.<tool>`` per effect."""
        return [TOOLS_NODE, REVIEW_NODE, *(effect_node_name(n) for n in self.effects)]

    def route(self, state: Mapping[str, Any]) -> str:
        """Route after the model node: ``done``, ``"tools"`` or ``"review"``.

        Reads and malformed calls go to ``tools`` first (it then routes the
        effect calls left to ``review``); a message of effect calls only goes
        straight to ``review``.
        """
        calls = pending_calls(state["messages"])
        if not calls:
            return self.done
        for call in calls:
            if malformed_reason(call, self.specs) is not None or self.specs[call.name].is_read:
                return TOOLS_NODE
        return REVIEW_NODE

    def _after_tools(self, state: Mapping[str, Any]) -> str:
        left = [c for c in pending_calls(state["messages"]) if c.name in self.effects]
        return REVIEW_NODE if left else self.then


def add_effect_nodes(
    builder: StateGraph[Any, Any, Any, Any],
    tools: Iterable[ToolSpec | BaseTool],
    *,
    ledger: Ledger,
    after: str | None = "agent",
    then: str = "agent",
    done: str = END,
    policy: Policy | None = None,
    clock: Clock | None = None,
    worker: str | None = None,
    on_wait: Callable[[Operation, float], None] | None = None,
    leases: LeaseKeeper | None = None,
) -> EffectGate:
    """Add effectgate's tools, review and effect nodes to your ``StateGraph``.

    Adds the nodes ``tools`` (runs read-only calls, answers malformed ones),
    ``review`` (one ``interrupt()`` for every pending side-effecting call of
    the last AI message; decisions and approvals go to the ledger) and one
    ``effect.<tool>`` node per side-effecting tool (dispatch through the
    ledger, exactly as in ``build_agent``), with their edges to ``then``. If
    ``after`` is given, the conditional edge out of your model node is added
    too; otherwise add it yourself with ``gate.route`` and
    ``gate.destinations`` (e.g. to combine it with a router of your own).

    Your model node binds ``gate.tool_schemas`` (or the tools themselves)
    and passes its reply through ``ensure_call_ids`` before returning it.

    Example:
        ```python
        builder = StateGraph(MyState)  # has "messages", and anything else
        builder.add_node("agent", my_model_node)
        builder.add_edge(START, "agent")
        gate = add_effect_nodes(builder, tools, ledger=SqliteLedger(path))
        graph = builder.compile(checkpointer=saver)
        ```

    Args:
        builder: your uncompiled graph; its state has a ``messages`` key.
        tools: ``ToolSpec``s and/or LangChain tools (undeclared ones are unsafe).
        ledger: the operation ledger every dispatch consults first.
        after: your model node, or ``None`` to add its conditional edge yourself.
        then: where a turn continues once its calls are answered (your model node).
        done: where ``route`` goes when the model called no tool (default ``END``).
        policy: approval TTL, auto-approval, default budget.
        clock: time source for approvals and backoff.
        worker: this process's worker id (``claimed_by``); default: new.
        on_wait: progress hook called before each backoff wait (seconds).
        leases: the thread-lease keeper of the runner that runs your graph,
            if it holds thread leases; default: each dispatch holds its
            thread's lease itself while it runs (``Dispatcher``), so a live
            attempt is never taken for an abandoned one.

    Returns:
        The ``EffectGate``: router, node names, tools and dispatcher.

    Raises:
        ValueError: two tools share a name, or the graph already has a node
            named ``tools``, ``review`` or ``effect.<tool>``.
        ConfigError: ``EFFECTGATE_FAILPOINT`` names a seam or tool that does
            not exist, so the crash it asks for could never happen.
    """
    parts = build_parts(
        tools,
        ledger=ledger,
        policy=policy,
        clock=clock,
        worker=worker,
        on_wait=on_wait,
        leases=leases,
    )
    gate = EffectGate(specs=parts.specs, dispatcher=parts.dispatcher, then=then, done=done)
    taken = sorted(set(gate.nodes) & set(builder.nodes))
    if taken:
        raise ValueError(
            f"the graph already has node(s) {', '.join(taken)}; effectgate adds nodes named "
            f"{', '.join(gate.nodes)}"
        )
    # effectgate's node functions are annotated with its own ``AgentState``;
    # LangGraph would read that as the nodes' input schema and refuse a
    # ``messages`` channel of another type. They read ``messages`` only.
    own_state = builder.state_schema
    builder.add_node(TOOLS_NODE, opaque_node(parts.tools), input_schema=own_state)
    builder.add_node(
        REVIEW_NODE,
        opaque_node(_review_to(parts.review, then)),
        destinations=(then, *(effect_node_name(n) for n in parts.effects)),
        input_schema=own_state,
    )
    for name, effect in parts.effect.items():
        builder.add_node(effect_node_name(name), opaque_node(effect), input_schema=EffectTask)
        builder.add_edge(effect_node_name(name), then)
    if after is not None:
        builder.add_conditional_edges(after, gate.route, gate.destinations)
    builder.add_conditional_edges(TOOLS_NODE, gate._after_tools, [REVIEW_NODE, then])
    return gate


def opaque_node(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a node LangGraph does not search for subgraphs.

    ``StateGraph.compile`` looks for a subgraph in every node function
    (``langgraph.pregel._utils.find_subgraph_pregel``): it disassembles the
    function and its nested code with ``dis`` and follows every captured value
    and global it loads. effectgate's nodes call no graph, yet on each
    ``open_agent`` that search was more than half of the open's CPU time. A
    ``functools.partial`` without arguments is called exactly like ``fn``
    (same signature, so LangGraph passes ``config`` the same way) but is not
    a Python function, so the search skips it (the node has no subgraphs,
    as before). It also hides ``fn``'s annotations from ``add_node``: give
    ``input_schema`` (and ``destinations`` for a node returning ``Command``)
    explicitly.

    Args:
        fn: a node function of effectgate's own (never a user's node, which
            may call a subgraph).

    Returns:
        A callable with ``fn``'s signature.
    """
    return functools.partial(fn)


def _review_to(review: Any, then: str) -> Any:
    """The review node, continuing at ``then`` when it has nothing to send."""
    if then == _REVIEW_GOTO:
        return review

    def review_node(state: Any, config: RunnableConfig) -> Command[Any]:
        command: Command[Any] = review(state, config)
        if command.goto == _REVIEW_GOTO:
            return Command(goto=then, update=command.update)
        return command

    return review_node


_NO_ANSWER: Any = object()


def resume_command(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    answer: Any = _NO_ANSWER,
    *,
    by_id: Mapping[str, Any] | None = None,
) -> Command[Any]:
    """Build the ``Command(resume=...)`` that answers exactly the interrupts pending now.

    A bare ``Command(resume=value)`` is ambiguous while several interrupts
    wait, for instance two reconciliations inside one subgraph task (the
    parent sees one task). LangGraph 1.2 refuses it with a ``RuntimeError``
    once the run starts; it accepts a map that answers only some of them,
    and then re-runs each unanswered node up to its ``interrupt()``. This
    refuses both before anything runs, with a ``DecisionError`` naming the
    pending ids: one answer needs exactly one pending interrupt, and a map
    must answer every pending interrupt by its id (``Interrupt.id``, as in
    ``graph.get_state(config).interrupts``, subgraphs' included). The
    command is always id-keyed. The same rule as ``Agent.resume``, for a
    graph you run yourself.

    Args:
        graph: the compiled graph (a parent graph, if the reviews sit in a subgraph).
        config: the run config with the ``thread_id``.
        answer: the answer to the one pending interrupt (e.g. ``{"decisions": [...]}``).
        by_id: answers by interrupt id, one for every pending interrupt.

    Returns:
        ``Command(resume={interrupt_id: answer, ...})`` to pass to ``invoke``/``stream``.

    Raises:
        DecisionError: nothing is pending; both or neither of ``answer`` and
            ``by_id`` given; a single answer while several interrupts are
            pending; a map that misses a pending interrupt or names one that
            is not pending. Nothing ran.
    """
    interrupts = {i.id: i.value for i in graph.get_state(config).interrupts}
    pending = list(interrupts)
    if not pending:
        raise DecisionError("no interrupt is pending on this thread; nothing to resume")
    if (answer is _NO_ANSWER) == (by_id is None):
        raise DecisionError("give either one answer or answers by interrupt id (by_id=...)")
    if by_id is None:
        if len(pending) != 1:
            raise DecisionError(
                f"{len(pending)} interrupts are pending ({', '.join(pending)}); a bare answer "
                "could reach the wrong one: answer each by its id (by_id={id: answer})"
            )
        return Command(resume={pending[0]: answer})
    check_resume_ids(list(by_id), known=pending, pending=interrupts)
    missing = [i for i in pending if i not in by_id]
    if missing:
        raise DecisionError(
            f"interrupt(s) {', '.join(missing)} are pending too: answer every pending "
            "interrupt in one resume, or the unanswered nodes run again"
        )
    return Command(resume={i: by_id[i] for i in pending})


class ResumeGuardedGraph(CompiledStateGraph):  # type: ignore[type-arg]
    """A compiled graph that refuses, before it runs, a resume no node could take.

    ``stream`` and ``astream`` (and so ``invoke``, ``ainvoke`` and every run of
    the LangGraph server, which goes through ``astream``) read the addressed
    checkpoint first when the input is a ``Command(resume=...)``, and end the
    run with ``UnknownInterruptError`` (``refuse_resume_before_run``) when the
    thread waits on nothing, waits on no interrupt but has tasks next (a run
    stopped inside its step: LangGraph would run them and drop the answer),
    or the map names an interrupt that does not wait there. An empty
    ``Command(resume=None)`` (no resume, update or goto), which LangGraph's
    own loop meets with ``UnboundLocalError``, is refused the same way,
    naming the interrupts that wait. Nothing is written then: no run, no
    checkpoint, no task error. Other runs are not touched. Build one with
    ``guard_resumes``.

    ``resume_ledger`` (optional): the ledger the graph's effect nodes use.
    With it, a resume to a thread that has no checkpoint at all but whose
    operations the ledger records is refused as a review lost with the
    server's checkpoints (``answers.refuse_resume_of_lost_review``) instead
    of as a mistyped one. A constructor argument, so ``Pregel.copy`` (which
    rebuilds the graph from its attributes) keeps it.
    """

    def __init__(self, *args: Any, resume_ledger: Ledger | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resume_ledger = resume_ledger

    def _saver(self, config: RunnableConfig | None) -> BaseCheckpointSaver[Any] | None:
        given = (config or {}).get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
        saver = given if given is not None else self.checkpointer
        return saver if isinstance(saver, BaseCheckpointSaver) else None

    def stream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """``Pregel.stream``, after the check above.

        Raises:
            UnknownInterruptError: ``input`` is a resume no node could take,
                or an empty ``Command``; nothing was run or written.
        """
        saver = self._saver(config)
        if _is_empty_command(input):
            _refuse_empty_command(self.get_state(config or {}) if saver is not None else None)
        if _is_goto_end(input) and saver is not None:
            _refuse_goto_end(self.get_state(config or {}))
        if _is_resume(input) and saver is not None:
            head = self.get_state(config or {})
            found = saver.get_tuple(head.config)
            writes = list(found.pending_writes or []) if found else []
            lost = self._lost_review(config) if found is None else None
            refuse_resume_before_run(
                input.resume, next_tasks=head.next, writes=writes, lost_operations=lost
            )
        yield from super().stream(input, config, **kwargs)

    async def astream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """``Pregel.astream``, after the check above.

        Raises:
            UnknownInterruptError: ``input`` is a resume no node could take,
                or an empty ``Command``; nothing was run or written.
        """
        saver = self._saver(config)
        if _is_empty_command(input):
            empty_head = await self.aget_state(config or {}) if saver is not None else None
            _refuse_empty_command(empty_head)
        if _is_goto_end(input) and saver is not None:
            _refuse_goto_end(await self.aget_state(config or {}))
        if _is_resume(input) and saver is not None:
            head = await self.aget_state(config or {})
            found = await saver.aget_tuple(head.config)
            writes = list(found.pending_writes or []) if found else []
            lost = await asyncio.to_thread(self._lost_review, config) if found is None else None
            refuse_resume_before_run(
                input.resume, next_tasks=head.next, writes=writes, lost_operations=lost
            )
        async for chunk in super().astream(input, config, **kwargs):
            yield chunk

    def _lost_review(self, config: RunnableConfig | None) -> list[str] | None:
        """The ledger's operation ids of the thread ``config`` names; ``None`` without a ledger."""
        thread_id = (config or {}).get("configurable", {}).get("thread_id")
        if self.resume_ledger is None or thread_id is None:
            return None
        return [op.operation_id for op in self.resume_ledger.list(thread_id=str(thread_id))]


def _is_goto_end(value: Any) -> bool:
    """A ``Command(goto="__end__")`` with no resume: "Mark as resolved"."""
    goto = value.goto if isinstance(value, Command) else None
    ends = goto == END or (isinstance(goto, (list, tuple)) and END in goto)
    return ends and value.resume is None


def _refuse_goto_end(head: StateSnapshot) -> None:
    refuse_goto_end_without_review({i.id: i.value for i in head.interrupts})


def _is_resume(value: Any) -> bool:
    return isinstance(value, Command) and value.resume is not None


def _is_empty_command(value: Any) -> bool:
    """A ``Command`` with no resume, no update and no goto: ``Command(resume=None)``."""
    return (
        isinstance(value, Command)
        and value.resume is None
        and value.update is None
        and not value.goto
        and value.graph is None
    )


def _refuse_empty_command(head: StateSnapshot | None) -> NoReturn:
    """Refuse ``Command(resume=None)`` before the run, naming what waits (``head``).

    LangGraph's own loop meets an empty command with ``UnboundLocalError``
    (langgraph 1.x sets ``resume_is_map`` only for a resume that is not None),
    a traceback that names no answer.

    Raises:
        UnknownInterruptError: always; one line, naming the pending interrupt ids.
    """
    ids = [i.id for i in head.interrupts] if head is not None else []
    waits = (
        f"pending: {', '.join(ids)}; answer with Command(resume={{interrupt_id: answer}})"
        if ids
        else "this thread waits on no interrupt"
    )
    raise UnknownInterruptError(
        "resume refused: Command(resume=None) carries no answer (no resume, update or goto); "
        f"nothing was applied. {waits}"
    )


def guard_resumes(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    *,
    cls: type[ResumeGuardedGraph] = ResumeGuardedGraph,
    ledger: Ledger | None = None,
) -> ResumeGuardedGraph:
    """Return ``graph`` as a ``ResumeGuardedGraph``: the same graph, refusing dead resumes first.

    LangGraph runs no node for a ``Command(resume=...)`` to a thread that
    waits on nothing, so effectgate's nodes cannot refuse it; and a node's
    refusal of a resume map naming an unknown interrupt is recorded as the
    task's error on the checkpoint, where it stays beside later reviews.
    The returned graph refuses both before the run (``UnknownInterruptError``,
    one line, nothing written). The served graph (``effectgate.server``) and
    ``EffectGateMiddleware.guard`` use it; use it on a graph of your own built
    with ``add_effect_nodes``.

    Args:
        graph: a compiled graph (``builder.compile(...)``, ``create_agent(...)``).
        cls: the class of the copy (a subclass of ``ResumeGuardedGraph``).
        ledger: the ledger of the graph's effect nodes; when given, a resume
            to a thread with no checkpoint whose operations it records is
            refused as a review lost with the server's checkpoints, not as a
            mistyped one (the served graph passes its ledger).

    Returns:
        A copy of ``graph`` of class ``cls``, sharing its nodes, channels and
        checkpointer (built as ``Pregel.copy`` builds one).
    """
    skip = ("__orig_class__", "resume_ledger")
    attrs = {k: v for k, v in graph.__dict__.items() if k not in skip}
    return cls(**attrs, resume_ledger=ledger)
