"""A follow-up sent as a new run's input while a review waits (any LangGraph client).

``graph.invoke({"messages": [HumanMessage(...)]}, config)`` on a thread whose
review is pending is what ``langgraph dev`` runs for a client's new message:
LangGraph writes the message and drops the pending review task. The agent
node then applies the one follow-up rule (``answers.follow_up_plan``), the
same one ``Agent.send(..., supersede=True)`` applies. The checkpointer is the
real SQLite one ``open_agent`` opens; counts are read from the ticket
service and the ledger.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.types import Command

from effectgate import StateDir
from effectgate.answers import SUPERSEDED_BY
from effectgate.demo.services import DemoServices
from effectgate.errors import DecisionError, FollowUpError
from effectgate.graph import RunStatus, history_problems
from effectgate.ledger import Approval, OpenRequest, OpState
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conversations._scripts import ALSO_LEAD, TASK, conversation_agent


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def _approve_in_ledger(agent: Any, action: dict[str, Any], *, claim: bool) -> None:
    """The reviewer's approval recorded (the process died before the effect); claimed if asked."""
    spec = agent.parts.specs[str(action["name"])]
    op_id, ihash = str(action["operation_id"]), str(action["intent_hash"])
    request = OpenRequest(
        operation_id=op_id,
        thread_id="c",
        tool_call_id=str(action["tool_call_id"]),
        tool=spec.name,
        tool_version=spec.version,
        args=dict(action["args"]),
        intent_hash=ihash,
    )
    approval = Approval(
        operation_id=op_id,
        thread_id="c",
        tool_call_id=str(action["tool_call_id"]),
        decision="approve",
        intent_hash=ihash,
        reviewer="test",
        decided_at=agent.parts.clock.now(),
    )
    agent.ledger.record_review([request], [approval])
    if claim:
        agent.ledger.claim(op_id, attempt=1, worker="someone-else")


def test_new_input_while_a_review_waits_supersedes_it_and_the_thread_goes_on(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Before: the agent node refused the history, the run ended in error and the review
    vanished. Now the waiting call is answered "superseded" before the message, the
    approved-but-never-started operation is REJECTED in the ledger, the thread finishes,
    and an approval of the old review runs nothing."""
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        _approve_in_ledger(agent, action, claim=False)  # APPROVED, attempt 0: never started

        agent.graph.invoke({"messages": [HumanMessage(ALSO_LEAD)]}, _config("c"), durability="sync")

        status = agent.status("c")
        assert status.status is RunStatus.DONE, status.error
        messages = agent.messages("c")
        answer = next(
            m
            for m in messages
            if isinstance(m, ToolMessage) and m.tool_call_id == action["tool_call_id"]
        )
        payload = json.loads(str(answer.content))
        assert (payload["status"], payload["executed"]) == ("superseded", False)
        assert payload["operation_id"] == action["operation_id"]
        follow_up = next(i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and i > 0)
        assert messages.index(answer) < follow_up
        assert history_problems(messages, allow_pending=False) == []

        op = agent.ledger.get(action["operation_id"])
        assert op is not None and op.state is OpState.REJECTED and op.attempt == 0
        assert agent.ledger.latest_approval(op.operation_id).reviewer == SUPERSEDED_BY

        # The old review answered later: refused by effectgate's API, a no-op for a raw client.
        old = {
            "interrupt_id": review.id,
            "decisions": [{"type": "approve"}],
            "reviewer": "late",
        }
        with pytest.raises(DecisionError, match="already decided: reject"):
            agent.resume("c", decisions=old)
        agent.graph.invoke(
            Command(resume={review.id: {"decisions": [{"type": "approve"}]}}),
            _config("c"),
            durability="sync",
        )
    assert world(state_dir).tickets == 0
    assert services.stats("tickets")["create_requests"] == 0
    # Every checkpoint after the input one holds a valid history (LangGraph's own input
    # checkpoint holds the message as the client sent it, after the unanswered call).
    problems = checkpoint_problems(state_dir.checkpoints, "c")
    assert len(problems) == 1 and "HumanMessage before calls" in problems[0], problems


def test_new_input_while_a_first_review_waits_answers_the_call_superseded(
    services: DemoServices, state_dir: StateDir
) -> None:
    """No operation exists yet (the review records it): the call is answered, nothing runs."""
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        agent.graph.invoke({"messages": [HumanMessage(ALSO_LEAD)]}, _config("c"), durability="sync")
        status = agent.status("c")
        messages = agent.messages("c")
        assert agent.ledger.get(action["operation_id"]) is None
    assert status.status is RunStatus.DONE, status.error
    assert history_problems(messages, allow_pending=False) == []
    assert world(state_dir).tickets == 0


def test_new_input_while_a_call_may_have_started_drives_it_on_and_answers_after(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A claimed operation (IN_FLIGHT, attempt 1) is never answered "superseded".

    Before, the agent node refused the message on this and every later run
    (the input had dropped the interrupt; the thread was wedged). Now the
    call goes back to its effect node, which meets it in the ledger as any
    resume would (here: a claim nobody runs, recovered through the ticket
    lookup, then one create request); the message is answered after it.
    """
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        _approve_in_ledger(agent, action, claim=True)
        with pytest.raises(FollowUpError) as refused:
            agent.send("c", ALSO_LEAD, supersede=True)  # refused before anything is written
        agent.graph.invoke({"messages": [HumanMessage(ALSO_LEAD)]}, _config("c"), durability="sync")
        op = agent.ledger.get(action["operation_id"])
        messages = agent.messages("c")
    text = str(refused.value)
    assert f"create_ticket ({action['operation_id']})" in text
    assert "in_flight at attempt 1 and may have started" in text.lower()
    assert op is not None and op.state is OpState.SUCCEEDED
    assert history_problems(messages) == [], messages
    follow = [i for i, m in enumerate(messages) if m.content == ALSO_LEAD]
    assert len(follow) == 1
    answers = [m for m in messages[: follow[0]] if isinstance(m, ToolMessage)]
    assert any(m.tool_call_id == action["tool_call_id"] for m in answers)
    assert world(state_dir).tickets == 1
    assert services.stats("tickets")["create_requests"] == 1
