"""The three systems under test, each driven to the end of one thread in this process.

- ``effectgate``: ``open_agent`` on the state directory; every review is
  approved, except that in the replay/fork case the reviewer rejects calls
  flagged ``possible_duplicate_of`` (that is the reviewer's policy, not an
  automatic effectgate decision).
- ``baseline``: what a user writes without effectgate: ``create_agent`` with
  ``HumanInTheLoopMiddleware`` on every side-effecting tool, ``SqliteSaver``,
  ``durability="sync"``, plain tools (``_tools.plain_tools``), and a loop that
  resumes with ``Command(resume={"decisions": [approve...]})``.
- ``effectgate-middleware``: the baseline agent with ``EffectGateMiddleware``
  in place of ``HumanInTheLoopMiddleware`` (effectgate's own tools, its
  ledger in the state directory), driven by the baseline's loop; its
  reviewer follows the ``effectgate`` policy below.
- ``effect-ledger``: the same agent with effect-ledger 0.1.2's
  ``ExecutionBoundary`` installed last and its ``LedgerRunner`` for start and
  resume, as its README shows; ``get_error_rate`` is declared ``READ_ONLY``.

All three play the same offline script (``scripted:incident``) against the
same demo services. Every driver returns a process exit code: 0 done,
3 held for a human (reconciliation / unresolved), 5 not finished, 75 busy.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from effectgate._app import StateDir
from effectgate.demo.services import ServiceEndpoints
from effectgate.models import ScriptedChatModel

__all__ = [
    "EFFECT_LEDGER_DB",
    "EFFECT_LEDGER_SCOPE",
    "EXIT_BUSY",
    "EXIT_DONE",
    "EXIT_HELD",
    "EXIT_UNFINISHED",
    "NOTE",
    "TASK",
    "THREAD",
    "DriveOptions",
    "System",
    "drive",
    "fork_checkpoint",
]

THREAD = "incident"
"""The thread id every trial uses."""
NOTE = "incidents/orders-error-rate.md"
"""The note the workflow writes, relative to the workspace."""
TASK = "Check the order service's error rate and handle any incident."
EFFECT_LEDGER_DB = "effects.sqlite3"
"""effect-ledger's SQLite store, inside the trial's state directory."""
EFFECT_LEDGER_SCOPE = "campaign"
EXIT_DONE, EXIT_HELD, EXIT_UNFINISHED, EXIT_BUSY = 0, 3, 5, 75
_GATED = ("create_ticket", "send_email", "write_file")
_MAX_STEPS = 30
_STALL_STEPS = 3
_SYSTEM_PROMPT = "You are an operations agent. Use the tools to act."


class System(enum.StrEnum):
    """A system under test."""

    EFFECTGATE = "effectgate"
    MIDDLEWARE = "effectgate-middleware"
    BASELINE = "baseline"
    EFFECT_LEDGER = "effect-ledger"
    PG_WORKERS = "effectgate-pg-workers"
    """4 ``effectgate worker`` processes and a reviewer on one PostgreSQL (``_pgworkers``)."""
    PG_FAULTS = "effectgate-pg-faults"
    """The same on a private cluster behind a TCP proxy, with database and process faults."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriveOptions:
    """What one worker process does."""

    state_dir: Path
    """The trial's state directory (services already running)."""
    thread_id: str
    """The thread to start or continue."""
    fresh_ids: bool = False
    """Random tool-call and message ids, as a real model re-proposing a call."""
    fork: bool = False
    """Fork the finished thread from the checkpoint before the create_ticket turn."""
    kill_after_result: bool = False
    """Install the ``after_result`` kill middleware (baseline, effect-ledger)."""


def _endpoints(sd: StateDir) -> ServiceEndpoints:
    from effectgate.demo.services import published_endpoints

    found = published_endpoints(sd.services)
    if found is None:
        raise RuntimeError(f"no demo services published in {sd.services}")
    return found


def _model(fresh_ids: bool) -> ScriptedChatModel:
    return ScriptedChatModel.from_file("incident", fresh_ids=fresh_ids)


def fork_checkpoint(history: Sequence[Any], model_node: str) -> str:
    """Find the checkpoint just before the model call that proposes create_ticket.

    Args:
        history: ``graph.get_state_history(config)`` snapshots, newest first.
        model_node: the graph's model node (``"agent"`` or ``"model"``).

    Returns:
        The checkpoint id: the model node is next, get_error_rate has answered,
        and no create_ticket call has been proposed yet.

    Raises:
        LookupError: the thread never reached that point.
    """
    for snap in reversed(list(history)):
        messages: list[BaseMessage] = list(snap.values.get("messages", []))
        names = {
            str(call["id"]): call["name"]
            for m in messages
            if isinstance(m, AIMessage)
            for call in m.tool_calls
        }
        answered = {names.get(m.tool_call_id) for m in messages if isinstance(m, ToolMessage)}
        proposed = "create_ticket" in names.values()
        if model_node in snap.next and "get_error_rate" in answered and not proposed:
            return str(snap.config["configurable"]["checkpoint_id"])
    raise LookupError("no checkpoint before the create_ticket turn")


def drive(system: System, options: DriveOptions) -> tuple[int, dict[str, Any]]:
    """Run or continue one thread with ``system`` until done or held.

    Args:
        system: which system.
        options: the thread, the model's id mode, and whether to fork.

    Returns:
        ``(exit code, summary)``; the summary is printed as one JSON line.
    """
    if system is System.EFFECTGATE:
        return _drive_effectgate(options)
    return _drive_plain(system, options)


# --- effectgate ---------------------------------------------------------------------------


def _review(request: Mapping[str, Any]) -> dict[str, Any]:
    # The reviewer's policy: approve, but never a call effectgate flags as a
    # possible duplicate of an operation that already ran (replay/fork case).
    decisions = [
        {"type": "reject", "message": "duplicate of an earlier operation"}
        if action.get("possible_duplicate_of")
        else {"type": "approve"}
        for action in request["action_requests"]
    ]
    return {"decisions": decisions, "reviewer": "campaign"}


def _drive_effectgate(options: DriveOptions) -> tuple[int, dict[str, Any]]:
    from effectgate._app import open_agent
    from effectgate.errors import ConfigError, ThreadBusyError
    from effectgate.graph import RunStatus

    sd = StateDir.open(options.state_dir)
    summary: dict[str, Any] = {"system": "effectgate", "thread_id": options.thread_id}
    try:
        with open_agent(sd, model=_model(options.fresh_ids), endpoints=_endpoints(sd)) as agent:
            if options.fork:
                config: Any = {"configurable": {"thread_id": options.thread_id}}
                cid = fork_checkpoint(list(agent.graph.get_state_history(config)), "agent")
                summary["forked_from"] = cid
                result = agent.replay(options.thread_id, cid)
            else:
                try:
                    result = agent.start(TASK, thread_id=options.thread_id)
                except ConfigError:  # the thread exists: continue it
                    result = agent.resume(options.thread_id)
            for _ in range(_MAX_STEPS):
                if result.status is not RunStatus.WAITING_REVIEW:
                    break
                pending = result.interrupts[0]
                result = agent.resume(
                    options.thread_id, answers={pending.id: _review(dict(pending.value))}
                )
    except ThreadBusyError as exc:
        return EXIT_BUSY, {**summary, "status": "busy", "error": str(exc)}
    summary.update(status=result.status.value, error=result.error)
    codes = {RunStatus.DONE: EXIT_DONE, RunStatus.WAITING_RECONCILIATION: EXIT_HELD}
    return codes.get(result.status, EXIT_UNFINISHED), summary


# --- baseline and effect-ledger -----------------------------------------------------------


@dataclass(slots=True)
class _Plain:
    system: System
    graph: Any
    runner: Any
    config: dict[str, Any]


@contextmanager
def _open_plain(system: System, options: DriveOptions) -> Iterator[_Plain]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.sqlite import SqliteSaver

    from effectgate.testing.campaign._tools import KillAfterResult, plain_tools

    sd = StateDir.open(options.state_dir)
    middleware: list[Any] = [HumanInTheLoopMiddleware(interrupt_on=dict.fromkeys(_GATED, True))]
    if options.kill_after_result:
        middleware.insert(0, KillAfterResult())  # first = outermost
    runner_cls: Any = None
    ledger: Any = None
    if system is System.MIDDLEWARE:
        from effectgate._app import default_tools
        from effectgate.ledger import SqliteLedger
        from effectgate.middleware import EffectGateMiddleware

        ledger = SqliteLedger(sd.ledger)
        gate = EffectGateMiddleware(default_tools(sd.workspace, _endpoints(sd)), ledger=ledger)
        middleware = [gate]
        tools = []  # the middleware adds its tools to the agent
    elif system is System.EFFECT_LEDGER:
        from effect_ledger import EffectExecutor
        from effect_ledger.langchain import READ_ONLY, ExecutionBoundary, current_operation
        from effect_ledger.langgraph import LedgerRunner

        executor = EffectExecutor(sd.root / EFFECT_LEDGER_DB, scope=EFFECT_LEDGER_SCOPE)
        # README: "With several tool middlewares, install the boundary last."
        middleware.append(
            ExecutionBoundary(
                executor,
                workflow_id="incident-agent:v1",
                tools={"get_error_rate": READ_ONLY},
            )
        )
        tools = plain_tools(
            _endpoints(sd), sd.workspace, ticket_key=lambda: current_operation().provider_key
        )
        runner_cls = LedgerRunner
    else:
        tools = plain_tools(_endpoints(sd), sd.workspace)
    conn = sqlite3.connect(sd.checkpoints, check_same_thread=False)
    try:
        graph = create_agent(
            _model(options.fresh_ids),
            tools,
            system_prompt=_SYSTEM_PROMPT,
            middleware=middleware,
            checkpointer=SqliteSaver(conn),
        )
        runner = runner_cls(graph) if runner_cls is not None else None
        config = {"configurable": {"thread_id": options.thread_id}, "recursion_limit": 100}
        yield _Plain(system=system, graph=graph, runner=runner, config=config)
    finally:
        conn.close()
        if ledger is not None:
            ledger.close()


def _approve_all(value: Any) -> dict[str, Any]:
    return {"decisions": [{"type": "approve"} for _ in value["action_requests"]]}


def _is_recovery(item: Any) -> bool:
    return isinstance(item.value, dict) and item.value.get("kind") == "effect_recovery"


def _step(agent: _Plain, woke: bool) -> tuple[str, bool]:
    """Advance one invocation; return ``(what happened, woke a recovery pause)``."""
    from langgraph.types import Command

    snap = agent.graph.get_state(agent.config)
    start = {"messages": [HumanMessage(TASK)]}
    if snap.metadata is None or not snap.values:
        if agent.runner is not None:
            agent.runner.start(start, agent.config)
        else:
            agent.graph.invoke(start, agent.config, durability="sync")
        return "started", woke
    if snap.interrupts:
        recovery = [i for i in snap.interrupts if _is_recovery(i)]
        if recovery and woke:
            return "held", woke  # woken once already and still unresolved
        answer = _review if agent.system is System.MIDDLEWARE else _approve_all
        answers = {i.id: answer(i.value) for i in snap.interrupts if not _is_recovery(i)}
        if agent.runner is not None:
            agent.runner.resume(agent.config, responses=answers)
        else:
            agent.graph.invoke(Command(resume=answers), agent.config, durability="sync")
        return "resumed", woke or bool(recovery)
    if snap.tasks or snap.next:
        if agent.runner is not None:
            agent.runner.resume(agent.config)
        else:
            agent.graph.invoke(None, agent.config, durability="sync")
        return "continued", woke
    return "done", woke


def _fork_plain(agent: _Plain, summary: dict[str, Any]) -> None:
    cid = fork_checkpoint(list(agent.graph.get_state_history(agent.config)), "model")
    summary["forked_from"] = cid
    config = {
        **agent.config,
        "configurable": {**agent.config["configurable"], "checkpoint_id": cid},
    }
    if agent.runner is not None:
        try:
            agent.runner.resume(config)
        except ValueError as exc:
            # LedgerRunner refuses time travel ("Only root agents at the latest
            # checkpoint are supported"); its docstring says time travel
            # bypasses its guards, so the fork below is what a user who forks
            # anyway (LangGraph Studio, graph.invoke) gets.
            summary["runner_refused_fork"] = str(exc)
    agent.graph.invoke(None, config, durability="sync")


def _head(agent: _Plain) -> str | None:
    snap = agent.graph.get_state(agent.config)
    return None if snap.metadata is None else str(snap.config["configurable"]["checkpoint_id"])


def _drive_plain(system: System, options: DriveOptions) -> tuple[int, dict[str, Any]]:
    summary: dict[str, Any] = {"system": system.value, "thread_id": options.thread_id}
    with _open_plain(system, options) as agent:
        if options.fork:
            _fork_plain(agent, summary)
        woke, what, idle = False, "?", 0
        for _ in range(_MAX_STEPS):
            before = _head(agent)
            try:
                what, woke = _step(agent, woke)
            except ValueError as exc:
                # LedgerRunner refused (the thread moved under us, or a state it
                # cannot start or resume); record why and look again.
                summary.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
                what = "refused"
            if what in ("done", "held"):
                break
            idle = idle + 1 if _head(agent) == before else 0
            if idle >= _STALL_STEPS:
                # Nothing was written for several steps: the driver cannot move this
                # thread (e.g. LedgerRunner.resume returns at once when next == ()
                # although a finished task still waits to be applied).
                what = f"stalled after {what}"
                break
        summary["status"] = what
    return {"done": EXIT_DONE, "held": EXIT_HELD}.get(what, EXIT_UNFINISHED), summary
