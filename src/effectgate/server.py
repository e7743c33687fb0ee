"""Serve the effectgate agent with the LangGraph server (``langgraph dev``).

``langgraph.json`` at the repository root names :func:`make_graph` as the
graph ``effectgate``. The LangGraph server then owns what it always owns: the
checkpointer (its own persistence), the thread and run records, and the
serialisation of runs per thread. effectgate brings what it always brings:
the review ``interrupt()`` in the shape of LangChain's
``HumanInTheLoopMiddleware`` (so ``langgraph_sdk``, Studio, Agent Chat UI and
Agent Inbox can show and answer it), one graph node per side effect, and the
operation ledger in a state directory, checked before every dispatch.

Clients answer a review with ``Command(resume={interrupt_id: {"decisions":
[...]}})``, as for any LangGraph interrupt. A run killed between an external
commit and its ledger result (a crash of the server process) leaves the
operation ``IN_FLIGHT`` in the ledger; whatever the server's own persistence
lost, the next run that reaches the call finds the row, proves the dead
worker gone, and recovers the outcome by the tool's lookup instead of calling
the tool again.

What the server does *not* get from effectgate: the ``Agent`` runner's
per-thread lease. The server serialises runs of one thread itself; two server
processes on one state directory that run the same thread at the same time
are kept from a double dispatch by the ledger's claim (the attempt number is
the fencing token), not by a lease.

Configuration comes from the environment (``langgraph.json``'s ``env`` may
set it):

- ``EFFECTGATE_STATE_DIR``: the state directory (ledger, workspace); default
  ``.effectgate-server`` in the server's working directory.
- ``EFFECTGATE_STORE``: a ``postgresql://`` URL for the ledger, as for the
  CLI's ``--store``. A state directory that already records a store uses it
  without this variable: its ledger is the one in PostgreSQL, never a second,
  empty SQLite ledger beside it (which would let the served graph repeat every
  effect that ledger recorded).
- ``EFFECTGATE_MODEL``: a model spec as for ``effectgate run --model``;
  default ``scripted:incident`` (offline).
- ``EFFECTGATE_SERVICES``: the demo ticket service and mail sink, either
  ``demo`` (started by this process, with their data in the state directory,
  stopped when it exits; a fresh one reports the orders error rate 0.12, as
  ``effectgate demo`` does) or a JSON object with ``ticket_url``, ``smtp_host``,
  ``smtp_port`` and ``mail_url`` (services someone else runs). Unset: only the
  file and shell tools.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
from typing import TYPE_CHECKING, Any

from langgraph.graph.state import CompiledStateGraph

from effectgate._postgres_app import STORE_ENV
from effectgate.demo.services import SERVICES_ENV

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from effectgate.demo.services import ServiceEndpoints

__all__ = ["make_graph"]

STATE_DIR_ENV = "EFFECTGATE_STATE_DIR"
MODEL_ENV = "EFFECTGATE_MODEL"


async def make_graph(
    config: RunnableConfig | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Return the effectgate agent graph for the LangGraph server (a graph factory).

    The graph is built once per process, on the first call, from the
    environment (see the module docstring), and returned by every later call:
    one ledger connection and one worker id per server process, whatever
    number of runs it serves. It is compiled without a checkpointer; the
    server sets its own. The build (files opened, services started) runs in
    a worker thread, never on the server's event loop.

    Args:
        config: the run's config, passed by the server; not read (the graph
            does not depend on it).

    Returns:
        The compiled graph: ``agent`` → ``tools`` / ``review`` (interrupt) →
        ``effect:<tool>`` nodes, with the ledger of ``EFFECTGATE_STATE_DIR``.

    Raises:
        ConfigError: the state directory, store, model spec or
            ``EFFECTGATE_SERVICES`` is invalid (the server reports it when it
            loads the graph).
    """
    del config
    return await asyncio.to_thread(_built)


@functools.cache
def _built() -> CompiledStateGraph[Any, Any, Any, Any]:
    # functools.cache: one graph (one ledger, one worker id) per process; a
    # failed build raises and is tried again by the next call.
    return _build()


def _build() -> CompiledStateGraph[Any, Any, Any, Any]:
    from effectgate._app import DEFAULT_SYSTEM_PROMPT, StateDir, default_tools
    from effectgate.graph import build_agent, guard_resumes
    from effectgate.models import make_model

    state = StateDir.open(
        os.environ.get(STATE_DIR_ENV) or ".effectgate-server",
        store=os.environ.get(STORE_ENV) or None,
    )
    model = make_model(os.environ.get(MODEL_ENV) or "scripted:incident")
    endpoints = _endpoints(os.environ.get(SERVICES_ENV), state.services)
    ledger = state.open_ledger()  # the directory's one ledger: SQLite, or its recorded store
    atexit.register(ledger.close)
    parts = build_agent(
        model,
        default_tools(state.workspace, endpoints),
        ledger=ledger,
        checkpointer=None,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
    )
    # A resume to a thread that waits on nothing runs no node in LangGraph, so
    # no node could refuse it; one naming an unknown interrupt is refused before
    # the run, so no refusal stays on the checkpoint as a task error. With the
    # ledger, an answer to a review the server lost (kill -9: no checkpoint,
    # the ledger keeps the thread's operations) is refused as lost, not mistyped.
    return guard_resumes(parts.graph, ledger=ledger)


def _endpoints(value: str | None, data_dir: Any) -> ServiceEndpoints | None:
    """The demo services' addresses from ``EFFECTGATE_SERVICES`` (see the module docstring)."""
    from effectgate.demo.services import (
        DEMO_ERROR_RATE,
        DemoServices,
        endpoints_from_env,
        read_error_rate,
    )

    given = endpoints_from_env(value)
    if given != "demo":
        return given
    services = DemoServices(data_dir)
    endpoints = services.start()
    atexit.register(services.stop)
    if read_error_rate(data_dir, "orders") is None:  # a fresh demo, as `effectgate demo`
        services.set_error_rate("orders", DEMO_ERROR_RATE)
    return endpoints
