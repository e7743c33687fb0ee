"""A follow-up message and "Mark as resolved" in your own ``create_agent`` + middleware.

The model is ``ChatOpenAI`` against the local OpenAI-compatible server,
which refuses a request that breaks the tool-call pairing with HTTP 400, as
OpenAI does. Before ``before_model`` applied the one follow-up rule, a human
message sent while a review waited made every later model request a 400.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.answers import RESOLVED, SUPERSEDED_BY
from effectgate.demo.services import DemoServices
from effectgate.graph import history_problems
from effectgate.ledger import Approval, OpenRequest, OpState, SqliteLedger
from effectgate.models import make_model
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply, pairing_problem
from effectgate.testing.oracle import world
from tests.byo._agents import middleware_agent

pytest.importorskip("langchain.agents")

CONFIG: Any = {"configurable": {"thread_id": "t1"}}
TICKET = {
    "title": "orders: error rate above 5%",
    "body": "The order service's error rate is above 5%.",
    "severity": "high",
    "alert_id": "orders-error-rate",
}


def _reply(body: dict[str, Any]) -> Any:
    """A ticket for the first message; plain text once the user said anything else."""
    users = [m for m in body["messages"] if m.get("role") == "user"]
    if len(users) == 1:
        return chat_reply("Opening a ticket.", [{"name": "create_ticket", "arguments": TICKET}])
    return chat_reply(f"Understood: {users[-1]['content']}")


@pytest.fixture
def served(
    services: DemoServices, state_dir: StateDir
) -> Iterator[tuple[Any, SqliteLedger, FakeOpenAIServer]]:
    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with FakeOpenAIServer(_reply) as server, SqliteLedger(state_dir.ledger) as ledger:
        model = make_model("openai:gpt-x", base_url=server.base_url, api_key="test", max_retries=0)
        graph = middleware_agent(
            model,
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            checkpointer=SqliteSaver(conn),
        )
        yield graph, ledger, server
    conn.close()


def test_the_local_server_refuses_a_broken_pairing_as_openai_does() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
    broken = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "b"},
    ]
    assert "did not have response messages: c1" in str(pairing_problem(broken))
    fixed = [*broken[:2], {"role": "tool", "tool_call_id": "c1", "content": "x"}, broken[2]]
    assert pairing_problem(fixed) is None


def test_a_follow_up_while_the_review_waits_supersedes_it(
    served: tuple[Any, SqliteLedger, FakeOpenAIServer], state_dir: StateDir
) -> None:
    """Before: HTTP 400 on this invoke and on every later one. Now the waiting call is
    answered "superseded" before the message and the model request is valid."""
    graph, ledger, server = served
    (pending,) = graph.invoke(
        {"messages": [HumanMessage("open a ticket")]}, CONFIG, version="v2"
    ).interrupts
    (action,) = pending.value["action_requests"]

    out = graph.invoke({"messages": [HumanMessage("never mind")]}, CONFIG, version="v2")

    assert out.interrupts == ()
    messages = out.value["messages"]
    assert messages[-1].content == "Understood: never mind"
    answer = next(m for m in messages if isinstance(m, ToolMessage))
    assert answer.tool_call_id == action["tool_call_id"]
    assert json.loads(str(answer.content))["status"] == "superseded"
    assert messages.index(answer) < [m.content for m in messages].index("never mind")
    assert history_problems(messages, allow_pending=False) == []
    assert pairing_problem(server.requests[-1]["messages"]) is None
    # and the thread goes on: the next message is answered too
    again = graph.invoke({"messages": [HumanMessage("thanks")]}, CONFIG, version="v2")
    assert again.value["messages"][-1].content == "Understood: thanks"
    assert world(state_dir).tickets == 0
    assert ledger.get(action["operation_id"]) is None  # the review recorded nothing


def test_a_follow_up_after_the_approval_was_recorded_rejects_the_operation(
    served: tuple[Any, SqliteLedger, FakeOpenAIServer], state_dir: StateDir, services: DemoServices
) -> None:
    """An operation approved but never started (attempt 0) is withdrawn in the ledger."""
    graph, ledger, _ = served
    (pending,) = graph.invoke(
        {"messages": [HumanMessage("open a ticket")]}, CONFIG, version="v2"
    ).interrupts
    (action,) = pending.value["action_requests"]
    # the reviewer's approval was recorded; the process died before the effect ran
    graph_tools = default_tools(state_dir.workspace, services.endpoints)
    (spec,) = [t for t in graph_tools if t.name == "create_ticket"]
    op_id, ihash, call_id = action["operation_id"], action["intent_hash"], action["tool_call_id"]
    ledger.record_review(
        [
            OpenRequest(
                operation_id=op_id,
                thread_id="t1",
                tool_call_id=call_id,
                tool=spec.name,
                tool_version=spec.version,
                args=dict(action["args"]),
                intent_hash=ihash,
            )
        ],
        [
            Approval(
                operation_id=op_id,
                thread_id="t1",
                tool_call_id=call_id,
                decision="approve",
                intent_hash=ihash,
                reviewer="test",
                decided_at=datetime.now(UTC),
            )
        ],
    )
    graph.invoke({"messages": [HumanMessage("never mind")]}, CONFIG, version="v2")
    op = ledger.get(op_id)
    assert op is not None and op.state is OpState.REJECTED and op.attempt == 0
    approval = ledger.latest_approval(op_id)
    assert approval is not None and approval.reviewer == SUPERSEDED_BY
    assert world(state_dir).tickets == 0


def test_mark_as_resolved_ends_the_run_without_running(
    served: tuple[Any, SqliteLedger, FakeOpenAIServer], state_dir: StateDir
) -> None:
    graph, ledger, server = served
    (pending,) = graph.invoke(
        {"messages": [HumanMessage("open a ticket")]}, CONFIG, version="v2"
    ).interrupts
    (action,) = pending.value["action_requests"]
    asked = len(server.requests)
    out = graph.invoke(Command(goto="__end__"), CONFIG, version="v2")
    assert out.interrupts == ()
    last = out.value["messages"][-1]
    assert isinstance(last, ToolMessage) and RESOLVED in str(last.content)
    assert len(server.requests) == asked  # the run ended: no further model call
    op = ledger.get(action["operation_id"])
    assert op is not None and op.state is OpState.REJECTED
    assert world(state_dir).tickets == 0
