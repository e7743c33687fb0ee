"""``create_agent`` + ``EffectGateMiddleware`` graphs for ``langgraph dev`` (tests/server).

Factories named in ``langgraph.json`` by ``test_middleware_served.py``; they
read the state directory and the demo services from the same variables as
``effectgate.server`` and the model's address from ``BYO_OPENAI_URL`` (the
test's local OpenAI-compatible server).

- ``swallowing``: a user's tool wrapper (``awrap_tool_call``, as an async
  server needs) that lets two hours pass before the call, so the approval
  has expired when the ledger checks it, and catches ``Exception`` around
  effectgate's wrapper: it swallows the re-review interrupt once, then lets
  interrupts through (the user fixed it). Not guarded, as a user who never
  heard of ``gate.guard`` builds it.
- ``sync_only``: a user's wrapper with ``wrap_tool_call`` only, listed first,
  in ``gate.guard(create_agent(...))``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage

from effectgate import SqliteLedger, StateDir, default_tools
from effectgate.demo.services import ServiceEndpoints
from effectgate.graph import Policy
from effectgate.middleware import EffectGateMiddleware
from effectgate.models import make_model
from effectgate.testing import FakeClock

SWALLOWED: list[str] = []
"""Tool-call ids whose interrupt the swallowing wrapper caught (once each)."""


class Swallow(AgentMiddleware[Any, Any, Any]):
    """Lets the approval expire, and catches ``Exception`` around the call the first time."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        self.clock.advance(timedelta(hours=2))
        call_id = str(request.tool_call["id"])
        if call_id in SWALLOWED:
            return await handler(request)
        try:
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            SWALLOWED.append(call_id)
            return ToolMessage(f"tool failed: {exc!r}", tool_call_id=call_id, status="error")


class SyncOnly(AgentMiddleware[Any, Any, Any]):
    """A logging wrapper written for ``invoke`` only."""

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)


def _parts(clock: FakeClock | None = None) -> tuple[Any, EffectGateMiddleware]:
    state = StateDir.open(os.environ["EFFECTGATE_STATE_DIR"])
    given = json.loads(os.environ["EFFECTGATE_SERVICES"])
    endpoints = ServiceEndpoints(**given)
    model = make_model(
        "openai:gpt-x", base_url=os.environ["BYO_OPENAI_URL"], api_key="test", max_retries=0
    )
    gate = EffectGateMiddleware(
        default_tools(Path(state.workspace), endpoints),
        ledger=SqliteLedger(state.ledger),
        clock=clock,
        policy=Policy(approval_ttl=timedelta(hours=1)),
    )
    return model, gate


async def swallowing() -> Any:
    """The agent whose user wrapper swallows effectgate's re-review once (not guarded)."""
    return await asyncio.to_thread(_swallowing)  # files opened off the server's event loop


async def sync_only() -> Any:
    """The agent with a sync-only wrapper before effectgate's, guarded."""
    return await asyncio.to_thread(_sync_only)


@functools.cache  # one graph (one ledger connection) per server process
def _swallowing() -> Any:
    clock = FakeClock()
    model, gate = _parts(clock)
    return create_agent(model, middleware=[Swallow(clock), gate])


@functools.cache
def _sync_only() -> Any:
    model, gate = _parts()
    return gate.guard(create_agent(model, middleware=[SyncOnly(), gate]))
