"""``Command(goto="__end__")`` ("Mark as resolved" in LangGraph Studio / Agent Inbox).

LangGraph ignores the write (no ``branch:to:__end__`` channel) and runs the
interrupted review again: the client saw success, the review stayed
pending and nothing was recorded. The review node now answers it: every
call is closed as a reviewer's reject with the reason "resolved by the
reviewer without running" (ToolMessages, ledger REJECTED) and the thread
ends. Real SQLite checkpointer (``open_agent``); counts from the services.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from effectgate import StateDir
from effectgate.answers import RESOLVED
from effectgate.demo.services import DemoServices
from effectgate.errors import DecisionError
from effectgate.graph import RunStatus, history_problems
from effectgate.ledger import OpState
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conversations._scripts import TASK, conversation_agent


def test_goto_end_closes_the_review_as_resolved_and_ends_the_thread(
    services: DemoServices, state_dir: StateDir
) -> None:
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        config = {"configurable": {"thread_id": "c"}}

        out = agent.graph.invoke(Command(goto="__end__"), config, durability="sync")

        assert "__interrupt__" not in out  # before: the same review, asked again
        status = agent.status("c")
        assert status.status is RunStatus.DONE, status.error
        assert status.interrupts == []
        messages = agent.messages("c")
        answer = next(
            m
            for m in messages
            if isinstance(m, ToolMessage) and m.tool_call_id == action["tool_call_id"]
        )
        assert messages[-1] is answer or messages[-1] == answer  # the thread ends here
        payload = json.loads(str(answer.content))
        assert (payload["status"], payload["executed"]) == ("rejected", False)
        assert RESOLVED in payload["message"]
        op = agent.ledger.get(action["operation_id"])
        assert op is not None and op.state is OpState.REJECTED and op.attempt == 0
        assert agent.ledger.latest_approval(op.operation_id).message == RESOLVED
        # an approval of the resolved review afterwards is refused and runs nothing
        late = {"interrupt_id": review.id, "decisions": [{"type": "approve"}], "reviewer": "x"}
        with pytest.raises(DecisionError, match="already decided: reject"):
            agent.resume("c", decisions=late)
    assert history_problems(messages, allow_pending=False) == []
    assert checkpoint_problems(state_dir.checkpoints, "c") == []
    assert world(state_dir).tickets == 0
    assert services.stats("tickets")["create_requests"] == 0
