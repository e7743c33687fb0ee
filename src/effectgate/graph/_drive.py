"""The runs of one ``Agent`` under way: their controls, stop requests and listeners.

A run streams the graph with LangGraph's ``stream_mode="updates"`` and a
``RunControl`` registered under the OS thread that runs it, so that
``request_stop`` (SIGTERM, Ctrl-C) and a cancelled async twin
(``_async_runs.in_thread``) can ask it to stop at its next superstep
boundary. Several runs may be under way at once through the async API.
"""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl

from effectgate.graph._results import EventHook, Seen

__all__ = ["Runs"]


class Runs:
    """The runs of one agent under way, each by the OS thread running it."""

    def __init__(self) -> None:
        self.listeners: dict[int, EventHook] = {}
        """Per OS thread: where ``astream`` wants the updates of the run it drives."""
        self.controls: dict[int, RunControl] = {}
        """The runs under way, by the OS thread running each (several at once
        through the async API)."""
        self.stop_reason: str | None = None
        """Set by ``request_stop``; sticky, so a stop asked between runs is not lost."""

    def request_stop(self, reason: str) -> None:
        """Ask every run under way, and the next one to begin, to stop at a step boundary."""
        self.stop_reason = reason
        for control in list(self.controls.values()):
            control.request_drain(reason)

    def stream(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        value: Any,
        config: RunnableConfig,
        seen: Seen,
        *,
        on_event: EventHook | None,
    ) -> str | None:
        """Run ``graph`` on ``value`` in this OS thread, every update into ``seen``.

        Each update also goes to ``on_event`` and to this thread's listener
        (``listeners``). A stop asked before the run began drains it at once;
        a stop applies to the run it was asked for (``stop_reason`` is then
        cleared).

        Args:
            graph: the agent's compiled graph.
            value: the run's input (``None``, a ``Command``, new messages).
            config: the run config (thread id, maybe a checkpoint id).
            seen: where the streamed updates are read into.
            on_event: called with each update, if given.

        Returns:
            Why the run stopped early (drained at a step boundary, or a node
            failed: LangGraph checkpointed the failed step, so the thread
            stays resumable), or ``None`` when it ran to its end or an interrupt.
        """
        control = RunControl()
        self.controls[threading.get_ident()] = control
        if self.stop_reason is not None:
            # asked before this run began (e.g. while waiting for the lease)
            control.request_drain(self.stop_reason)
        try:
            for chunk in graph.stream(
                value, config, stream_mode="updates", durability="sync", control=control
            ):
                seen.add(chunk)
                if on_event is not None:
                    on_event(chunk)
                listener = self.listeners.get(threading.get_ident())
                if listener is not None:
                    listener(chunk)
        except GraphDrained as exc:
            return f"stopped at a step boundary: {getattr(exc, 'reason', exc)}"
        except Exception as exc:  # noqa: BLE001
            # A node failed (model 5xx after its retries, a corrupt ledger row,
            # a bug). LangGraph has checkpointed the failed step, so the thread
            # stays resumable; report it instead of losing the thread's state.
            seen.failure = exc
            return f"{type(exc).__name__}: {exc}"
        finally:
            self.controls.pop(threading.get_ident(), None)
            self.stop_reason = None  # a stop applies to the run it was asked for
        return None
