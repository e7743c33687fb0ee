"""``EffectGateMiddleware``: effectgate's review and ledger for a LangChain ``create_agent``.

A drop-in for LangChain's ``HumanInTheLoopMiddleware`` (batched mode): the
same interrupt shape (``{"action_requests": [...], "review_configs": [...]}``,
each action with ``name``, ``args`` and ``description``) and the same resume
value (``{"decisions": [{"type": "approve" | "edit" | "reject"}, ...]}``),
plus what effectgate adds to every action (operation id, intent hash,
preview, possible duplicate, conflict), approvals stored in the ledger, and
every side-effecting call dispatched through the ledger.

How, in LangChain's terms:

- ``before_model`` applies effectgate's one follow-up rule
  (``answers.follow_up_plan``): a human message sent as new input while a
  review waited (LangGraph writes it and drops the pending review) finds
  the review's calls unanswered. Calls that provably never started are
  answered "superseded" right after their AI message, before the human
  message (the operations they opened are rejected in the ledger), so the
  model request keeps OpenAI's tool-call pairing; a call that may have
  started refuses the message (``FollowUpError``).
- ``after_model`` runs effectgate's review node itself (``make_review_node``)
  on the model's message: the same ``interrupt()``, validation and ledger
  transaction as in ``build_agent``'s graph. The reviewed calls' tasks
  (operation id, intent hash, the arguments to run) are kept in a private
  state key, ``effectgate_tasks``, as HITL keeps its edits.
- ``wrap_tool_call`` never calls the tool through the agent's ``ToolNode``
  for a tool it gates: it runs effectgate's effect node function for the
  call's task (``Dispatcher.dispatch``: ledger first, claim, call, result),
  so a kill after the external commit, a resume, a replay or a fork is
  answered from the ledger or reconciled by the tool's lookup, never run
  blindly again. Read-only and malformed calls are answered by effectgate's
  tools node function, as in its own graph.

Differences from ``HumanInTheLoopMiddleware``: ``respond`` is taken
wherever ``reject`` is, recorded as a reject, and answers the model with the
person's text marked ``"executed": false`` (never as the side effect's
receipt); and an ``edit`` keeps the tool: the edited
arguments get their own intent hash and operation id, checked against the
ledger. Differences from effectgate's own graph are in
``docs/bring-your-own-graph.md``.

Importing this module needs the ``langchain`` package (``pip install
langchain``); ``import effectgate`` does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Annotated, Any, NotRequired, TypeVar

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    PrivateStateAttr,
    ToolCallRequest,
    hook_config,
)
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_config
from langgraph.graph import END
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send

from effectgate._clock import Clock, SystemClock
from effectgate.answers import check_no_orphans
from effectgate.errors import MissingHookError
from effectgate.graph._blocks import ResumeGuardedGraph, build_parts, ensure_call_ids, guard_resumes
from effectgate.graph._follow_up import before_follow_up, close_open_calls, follow_up_index
from effectgate.graph._messages import error_message, last_ai_message, pending_calls
from effectgate.graph._nodes import malformed_reason
from effectgate.graph._policy import Policy
from effectgate.graph._state import EffectTask
from effectgate.ledger import Ledger, Operation
from effectgate.tools import ToolSpec

__all__ = ["EffectGateMiddleware", "EffectGateState"]

TASKS_KEY = "effectgate_tasks"
"""Private state key: the reviewed calls of the last model message, by tool-call id."""


class EffectGateState(AgentState[Any]):
    """``create_agent`` state with the reviewed calls' tasks (private to the middleware)."""

    effectgate_tasks: NotRequired[Annotated[dict[str, EffectTask], PrivateStateAttr]]
    """The reviewed calls of the last model message, by tool-call id."""


_T = TypeVar("_T")


def _thread_id(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


def _gated_view(messages: list[AnyMessage], effects: Mapping[str, ToolSpec]) -> list[AnyMessage]:
    """``messages`` with the last AI message cut down to its valid calls of effect tools.

    effectgate's review node reviews every pending call of the last AI
    message and expects reads and malformed calls to be answered before it;
    in ``create_agent`` those run in the same tool-node superstep as the
    effects, so the review sees only the calls it gates.
    """
    ai = last_ai_message(messages)
    assert ai is not None
    idx = max(i for i, m in enumerate(messages) if m is ai)
    keep = {
        c.id
        for c in pending_calls(messages)
        if c.name in effects and malformed_reason(c, effects) is None
    }
    view = ai.model_copy(
        update={
            "tool_calls": [tc for tc in ai.tool_calls if tc.get("id") in keep],
            "invalid_tool_calls": [],
        }
    )
    return [*messages[:idx], view, *messages[idx + 1 :]]


class EffectGateMiddleware(AgentMiddleware[EffectGateState, Any, Any]):
    """Review side-effecting tool calls and run them through effectgate's ledger.

    Use in place of ``HumanInTheLoopMiddleware`` (borrowed: its interrupt and
    decision shapes); the agent needs a checkpointer, and each run a
    ``thread_id``. The tools given here are added to the agent
    (``AgentMiddleware.tools``); do not pass them to ``create_agent`` again.

    Example:
        ```python
        gate = EffectGateMiddleware(tools, ledger=SqliteLedger("ledger.sqlite3"))
        agent = create_agent(model, middleware=[gate], checkpointer=saver)
        out = agent.invoke({"messages": [...]}, config, version="v2")
        # out.interrupts[0].value: {"action_requests": [...], "review_configs": [...], ...}
        agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
        ```

    Args:
        tools: ``ToolSpec``s and/or LangChain tools (undeclared LangChain
            tools are ``unsafe``: reviewed, never approved by policy, and
            never re-run after a crash without a human verdict).
        ledger: the operation ledger every dispatch consults first.
        policy: approval TTL, auto-approval, default budget.
        clock: time source for approvals and backoff.
        worker: this process's worker id (``claimed_by``); default: new.
        on_wait: progress hook called before each backoff wait (seconds).

    Raises:
        ValueError: two tools share a name.
        ConfigError: ``EFFECTGATE_FAILPOINT`` names a seam or tool that does
            not exist.

    Note:
        Tools that other middleware or ``create_agent(tools=...)`` add and
        this middleware was not given run ungated, as with HITL's tools
        outside ``interrupt_on``.
    """

    state_schema = EffectGateState

    def __init__(
        self,
        tools: Iterable[ToolSpec | BaseTool],
        *,
        ledger: Ledger,
        policy: Policy | None = None,
        clock: Clock | None = None,
        worker: str | None = None,
        on_wait: Callable[[Operation, float], None] | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock or SystemClock()
        self._parts = build_parts(
            tools, ledger=ledger, policy=policy, clock=self._clock, worker=worker, on_wait=on_wait
        )
        self.specs = self._parts.specs
        self.effects = self._parts.effects
        self.ledger = ledger
        self.dispatcher = self._parts.dispatcher
        self.tools = [_as_langchain_tool(spec) for spec in self.specs.values()]

    def guard(self, agent: CompiledStateGraph[Any, Any, Any, Any]) -> ResumeGuardedGraph:
        """Return the agent ``create_agent`` built with this middleware, guarded at every run.

        Two things no middleware hook can do, because they happen where no
        hook runs; the returned graph does them in ``stream`` / ``astream``
        (so in ``invoke``, ``ainvoke`` and under ``langgraph dev``):

        - a ``Command(resume=...)`` to a thread that waits on nothing (a stale
          id of its last, answered review; a random id; a plain answer), or a
          map naming an interrupt that does not wait, is refused before the
          run with ``UnknownInterruptError``, the served graph's rule and
          words (``graph.guard_resumes``); LangGraph alone runs no node for the
          first and returns the state unchanged, with no error;
        - a middleware of yours with ``wrap_tool_call`` but no
          ``awrap_tool_call`` (or the other way round) in a run of the other
          flavour fails with ``MissingHookError``, one line naming the class
          and the method to add, instead of LangChain's ``NotImplementedError``
          that names neither.

        Args:
            agent: ``create_agent(..., middleware=[..., self, ...])``.

        Returns:
            A copy of ``agent`` (same nodes and checkpointer) to run instead.
        """
        return guard_resumes(agent, cls=_GuardedAgent)

    def before_model(self, state: EffectGateState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Close the calls a follow-up message left unanswered, before the model sees them.

        Returns:
            ``None`` when no human message follows an unanswered call; else the
            history rewritten with one superseded ``ToolMessage`` per closed
            call placed before the follow-up (``REMOVE_ALL_MESSAGES`` and the
            messages in their new order, ids kept).

        Raises:
            FollowUpError: a call's operation may have started (named); the
                model is not called.
        """
        messages = list(state["messages"])
        idx = follow_up_index(messages)
        if idx is None:
            return None
        answers = close_open_calls(
            messages,
            specs=self.specs,
            ledger=self.ledger,
            thread_id=_thread_id(get_config()),
            now=self._clock.now(),
        )
        _, update = before_follow_up(messages, idx, answers)
        return {"messages": update}

    async def abefore_model(
        self, state: EffectGateState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """``before_model`` for ``ainvoke``/``astream``, in a worker thread (the ledger blocks)."""
        return await _off_loop(self.before_model, state, runtime)

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: EffectGateState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Review the model message's side-effecting calls; record decisions in the ledger.

        Re-runs from the top on every resume (LangGraph replays a node up to
        its ``interrupt()``); everything before the interrupt only reads.

        Returns:
            ``None`` when nothing is gated; else the message with call ids
            made unique (if any changed), rejection ``ToolMessage``s, and the
            tasks ``wrap_tool_call`` runs; ``jump_to: "end"`` when the review
            ends the run (answered ``Command(goto="__end__")``, or a call
            rejected as often as the policy allows).
        """
        config = get_config()
        messages = list(state["messages"])
        ai = last_ai_message(messages)
        if ai is None or not ai.tool_calls:
            return {TASKS_KEY: {}} if state.get(TASKS_KEY) else None
        idx = max(i for i, m in enumerate(messages) if m is ai)
        fixed = ensure_call_ids(ai, messages[:idx], thread_id=_thread_id(config))
        update: list[AnyMessage] = [fixed] if fixed is not ai else []
        messages[idx] = fixed
        view = _gated_view(messages, self.effects)
        if last_ai_message(view) is None or not pending_calls(view):
            return {"messages": update, TASKS_KEY: {}}
        command = self._parts.review({"messages": view}, config)
        tasks: dict[str, EffectTask] = {}
        goto = command.goto if isinstance(command.goto, list | tuple) else [command.goto]
        for send in goto:
            if isinstance(send, Send):
                task: EffectTask = send.arg
                tasks[task["tool_call_id"]] = task
        answered = (command.update or {}).get("messages", [])
        out: dict[str, Any] = {"messages": [*update, *answered], TASKS_KEY: tasks}
        if command.goto == END:
            out["jump_to"] = "end"
        return out

    def after_agent(self, state: EffectGateState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Fail closed when the run ends with an operation of its calls waiting for nobody.

        A wrapper around this middleware's ``wrap_tool_call`` that catches
        ``Exception`` swallows the re-review or reconciliation interrupt of a
        call (``GraphInterrupt`` is an ``Exception``); the run would end
        ``done`` with the operation ``PROPOSED`` forever. Runs only when the
        agent finishes, never at an interrupt.

        Raises:
            OrphanedOperationError: names each such operation
                (``answers.check_no_orphans``).
        """
        call_ids = {
            str(c.get("id"))
            for m in state["messages"]
            if isinstance(m, AIMessage)
            for c in m.tool_calls
        }
        check_no_orphans(self.ledger, _thread_id(get_config()), call_ids)
        return None

    async def aafter_agent(
        self, state: EffectGateState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """``after_agent`` for ``ainvoke``/``astream``, in a worker thread."""
        return await _off_loop(self.after_agent, state, runtime)

    @hook_config(can_jump_to=["end"])
    async def aafter_model(
        self, state: EffectGateState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """``after_model`` for ``ainvoke``/``astream``, in a worker thread.

        The review's ``interrupt()`` works there: the thread runs in a copy of
        the run's context (``_off_loop``), as LangGraph runs a sync node.
        """
        return await _off_loop(self.after_model, state, runtime)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Run a gated call through the ledger instead of the tool node's own call.

        Returns:
            Exactly one ``ToolMessage`` for the call: the dispatch outcome
            for a reviewed effect, the read's result, an error for a
            malformed or unreviewed call; other middleware's tools go to
            ``handler`` unchanged.

        Raises:
            LedgerError: the ledger failed; nothing new was committed.
            ClaimLostError: another worker took this thread's attempt over.
        """
        answer = self._answer(request)
        return handler(request) if answer is None else answer

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """``wrap_tool_call`` for async runs; the gated call runs in a worker thread.

        The ledger and effectgate's tools are synchronous (SQLite or psycopg,
        HTTP, SMTP, files): they run off the event loop, so other runs go on
        and ``langgraph dev``'s blocking-call detector has nothing to catch.
        Calls of other middleware's tools go to ``handler`` on the loop.
        """
        answer = await _off_loop(self._answer, request)
        return await handler(request) if answer is None else answer

    def _answer(self, request: ToolCallRequest) -> ToolMessage | None:
        """The ``ToolMessage`` for a call of a tool this middleware has; ``None`` for others."""
        call = request.tool_call
        name = call["name"]
        if name not in self.specs:
            return None
        tasks: Mapping[str, EffectTask] = (request.state or {}).get(TASKS_KEY) or {}
        task = tasks.get(str(call.get("id")))
        if name in self.effects and task is not None:
            out: dict[str, Any] = self._parts.effect[name](task, request.runtime.config)
            message: ToolMessage = out["messages"][0]
            return message
        one = AIMessage(content="", tool_calls=[call])
        answers = self._parts.tools({"messages": [one]}, request.runtime.config)["messages"]
        if answers:
            first: ToolMessage = answers[0]
            return first
        # A valid effect call with no reviewed task: never run it unreviewed.
        pending = pending_calls([one])[0]
        return error_message(pending, "not executed: this call was not reviewed")


_TWINS = {
    "wrap_tool_call": "awrap_tool_call",
    "awrap_tool_call": "wrap_tool_call",
    "wrap_model_call": "awrap_model_call",
    "awrap_model_call": "wrap_model_call",
}
"""Each of ``AgentMiddleware``'s wrap hooks and its twin of the other flavour."""


def _missing_hook(exc: NotImplementedError) -> MissingHookError | None:
    """LangChain's refusal of a missing hook, worded; ``None`` for any other error.

    ``AgentMiddleware``'s default ``awrap_tool_call`` (and its three siblings)
    raises ``NotImplementedError`` when a middleware defines only the other
    flavour; the frame that raised it is that default method, called on the
    user's middleware, so the traceback names the class.
    """
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    code = tb.tb_frame.f_code
    hook = next(
        (n for n in _TWINS if getattr(AgentMiddleware, n).__code__ is code),
        None,
    )
    owner = tb.tb_frame.f_locals.get("self")
    if hook is None or owner is None:
        return None
    name = type(owner).__name__
    flavour = (
        "async (ainvoke/astream; langgraph dev runs every graph so)"
        if hook.startswith("a")
        else "sync (invoke/stream)"
    )
    twin = _TWINS[hook]
    return MissingHookError(
        f"middleware {name} defines {twin} but not {hook}, which this {flavour} run calls: "
        f"add {'async ' if hook.startswith('a') else ''}def {hook}(self, request, handler) to "
        f"{name}, doing what {twin} does ({'await ' if hook.startswith('a') else ''}handler("
        "request)); nothing ran for the call it wraps",
        middleware=name,
        missing=hook,
    )


class _GuardedAgent(ResumeGuardedGraph):
    """``EffectGateMiddleware.guard``'s graph: dead resumes refused, missing hooks named."""

    def stream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """``ResumeGuardedGraph.stream``; a missing sync hook raises ``MissingHookError``."""
        try:
            yield from super().stream(input, config, **kwargs)
        except NotImplementedError as exc:
            worded = _missing_hook(exc)
            if worded is None:
                raise
            raise worded from None

    async def astream(  # type: ignore[override]
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """``ResumeGuardedGraph.astream``; a missing async hook raises ``MissingHookError``."""
        try:
            async for chunk in super().astream(input, config, **kwargs):
                yield chunk
        except NotImplementedError as exc:
            worded = _missing_hook(exc)
            if worded is None:
                raise
            raise worded from None


async def _off_loop(func: Callable[..., _T], /, *args: Any) -> _T:
    """Run ``func(*args)`` in a worker thread, in a copy of the current context.

    ``asyncio.to_thread`` copies the ``contextvars`` context, so LangGraph's
    run config, ``interrupt()`` and stream writer work there, as in a sync
    node LangGraph runs in its executor. Exceptions (``GraphInterrupt``
    included) propagate unchanged.
    """
    return await asyncio.to_thread(func, *args)


def _as_langchain_tool(spec: ToolSpec) -> BaseTool:
    """The model-facing LangChain tool of a ``ToolSpec`` (never run: the middleware is)."""

    def refuse(**_: Any) -> str:
        raise RuntimeError(
            f"{spec.name} runs through EffectGateMiddleware.wrap_tool_call; "
            "add the middleware to the agent that binds this tool"
        )

    return StructuredTool.from_function(
        func=refuse, name=spec.name, description=spec.description, args_schema=spec.args_schema
    )
