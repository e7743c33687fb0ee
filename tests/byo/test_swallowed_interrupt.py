"""A user's outermost tool wrapper that catches ``Exception`` swallows effectgate's interrupt.

In langgraph 1.x ``GraphInterrupt`` is an ``Exception``: a ``wrap_tool_call``
with ``except Exception`` around effectgate's catches the re-review an
expired approval raises, answers the call itself, and the run goes on. Before,
the run ended ``done`` with nothing pending and the operation ``PROPOSED``
forever. Now the middleware's ``after_agent`` fails closed
(``OrphanedOperationError`` naming the operation). Real ``create_agent``,
real SQLite checkpointer, ``ChatOpenAI`` against the local OpenAI-compatible
server.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.demo.services import DemoServices
from effectgate.errors import OrphanedOperationError
from effectgate.graph import Policy
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import make_model
from effectgate.testing import FakeClock
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply
from effectgate.testing.oracle import world

langchain_agents = pytest.importorskip("langchain.agents")
from langchain.agents.middleware import AgentMiddleware  # noqa: E402

CONFIG: Any = {"configurable": {"thread_id": "t1"}}
TICKET = {
    "title": "orders: error rate above 5%",
    "body": "The order service's error rate is above 5%.",
    "severity": "high",
    "alert_id": "orders-error-rate",
}


def _reply(body: dict[str, Any]) -> Any:
    if any(m.get("role") == "tool" for m in body["messages"]):
        return chat_reply("Done.")
    return chat_reply("Opening a ticket.", [{"name": "create_ticket", "arguments": TICKET}])


class Swallow(AgentMiddleware[Any, Any, Any]):
    """The user's wrapper: logs and answers every tool failure itself (and lets time pass)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.caught: list[type[BaseException]] = []

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.clock.advance(timedelta(hours=2))  # the approval expires before the call runs
        try:
            return handler(request)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            self.caught.append(type(exc))
            return ToolMessage(
                f"tool failed: {exc!r}", tool_call_id=request.tool_call["id"], status="error"
            )


def test_a_swallowed_re_review_fails_closed_naming_the_operation(
    services: DemoServices, state_dir: StateDir
) -> None:
    from langchain.agents import create_agent

    from effectgate.middleware import EffectGateMiddleware

    assert issubclass(GraphInterrupt, Exception)  # why `except Exception` catches it
    clock = FakeClock()
    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with FakeOpenAIServer(_reply) as server, SqliteLedger(state_dir.ledger) as ledger:
        gate = EffectGateMiddleware(
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            clock=clock,
            policy=Policy(approval_ttl=timedelta(hours=1)),
        )
        swallow = Swallow(clock)
        graph = create_agent(
            make_model("openai:gpt-x", base_url=server.base_url, api_key="test", max_retries=0),
            middleware=[swallow, gate],  # the first is the outermost wrapper
            checkpointer=SqliteSaver(conn),
        )
        (pending,) = graph.invoke(
            {"messages": [HumanMessage("open a ticket")]}, CONFIG, version="v2"
        ).interrupts
        (action,) = pending.value["action_requests"]
        with pytest.raises(OrphanedOperationError) as failed:
            graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CONFIG)
        op = ledger.get(action["operation_id"])
    conn.close()
    assert swallow.caught == [GraphInterrupt]
    assert failed.value.operation_ids == [action["operation_id"]]
    text = str(failed.value)
    assert f"create_ticket ({action['operation_id']}, PROPOSED at attempt 0)" in text
    assert "GraphBubbleUp" in text
    assert op is not None and op.state is OpState.PROPOSED
    assert world(state_dir).tickets == 0


MAIL = {
    "to": ["oncall@example.com"],
    "subject": "orders error rate above 5%",
    "body": "The order service's error rate is above 5%.",
}


def _two_effects(body: dict[str, Any]) -> Any:
    if any(m.get("role") == "tool" for m in body["messages"]):
        return chat_reply("Done.")
    return chat_reply(
        "Opening a ticket and paging on-call.",
        [
            {"name": "create_ticket", "arguments": TICKET},
            {"name": "send_email", "arguments": MAIL},
        ],
    )


class AsyncSwallow(Swallow):
    """The same wrapper, async (what ``ainvoke`` and ``langgraph dev`` call)."""

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.clock.advance(timedelta(hours=2))
        try:
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 - the point of the test
            self.caught.append(type(exc))
            return ToolMessage(
                f"tool failed: {exc!r}", tool_call_id=request.tool_call["id"], status="error"
            )


def test_an_async_swallowed_re_review_of_a_ticket_and_a_mail_fails_closed(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``ainvoke``, two effects in one review: both named, no ticket, no mail, both PROPOSED."""
    import asyncio

    from langchain.agents import create_agent

    from effectgate.middleware import EffectGateMiddleware

    clock = FakeClock()
    with FakeOpenAIServer(_two_effects) as server, SqliteLedger(state_dir.ledger) as ledger:
        gate = EffectGateMiddleware(
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            clock=clock,
            policy=Policy(approval_ttl=timedelta(hours=1)),
        )
        swallow = AsyncSwallow(clock)
        graph = gate.guard(
            create_agent(
                make_model("openai:gpt-x", base_url=server.base_url, api_key="test", max_retries=0),
                middleware=[swallow, gate],
                checkpointer=InMemorySaver(),
            )
        )

        async def run() -> tuple[list[Any], OrphanedOperationError]:
            out = await graph.ainvoke(
                {"messages": [HumanMessage("open a ticket and page")]}, CONFIG, version="v2"
            )
            (pending,) = out.interrupts
            actions = pending.value["action_requests"]
            approve = {"decisions": [{"type": "approve"}] * len(actions)}
            with pytest.raises(OrphanedOperationError) as failed:
                await graph.ainvoke(Command(resume={pending.id: approve}), CONFIG)
            return actions, failed.value

        actions, error = asyncio.run(run())
        ops = {a["name"]: ledger.get(a["operation_id"]) for a in actions}
    assert sorted(ops) == ["create_ticket", "send_email"]
    assert swallow.caught == [GraphInterrupt, GraphInterrupt]
    assert sorted(error.operation_ids) == sorted(a["operation_id"] for a in actions)
    for name, op in ops.items():
        assert op is not None and op.state is OpState.PROPOSED, name
        assert f"{name} ({op.operation_id}, PROPOSED at attempt 0)" in str(error)
    w = world(state_dir)
    assert (w.tickets, w.mails) == (0, 0)  # the ticket service and the mail sink got nothing
