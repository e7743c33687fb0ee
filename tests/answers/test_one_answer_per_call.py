"""Every call is answered exactly once, and the model never sees an unanswered call."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.types import Command, Send

from effectgate import StateDir, open_agent
from effectgate.errors import ConfigError
from effectgate.graph import EffectTask, Policy, RunStatus
from effectgate.models import ScriptedChatModel

SCRIPT = {
    "name": "one-write",
    "turns": [
        {
            "say": "writing",
            "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "a\n"}}],
        }
    ],
    "final": "Done.",
}


def _agent(sd: StateDir) -> Any:
    model = ScriptedChatModel.from_script(SCRIPT)
    return open_agent(sd, model=model, policy=Policy(approval_ttl=None))


def _answers_per_call(messages: list[Any]) -> Counter[str]:
    return Counter(m.tool_call_id for m in messages if isinstance(m, ToolMessage))


def test_an_effect_node_sent_again_by_hand_does_not_answer_twice(state_dir: StateDir) -> None:
    with _agent(state_dir) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        (action,) = review.value["action_requests"]
        reject = {"decisions": [{"type": "reject", "message": "not now"}]}
        assert agent.resume("t", answers={review.id: reject}).status is RunStatus.DONE
        task = EffectTask(
            thread_id="t",
            tool_call_id=action["tool_call_id"],
            tool="write_file",
            args=action["args"],
            operation_id=action["operation_id"],
            intent_hash=action["intent_hash"],
            edited=False,
            batch_size=1,
        )
        config = {"configurable": {"thread_id": "t"}}
        agent.graph.invoke(Command(goto=Send("effect.write_file", task)), config)
        counts = _answers_per_call(agent.messages("t"))
        assert counts[action["tool_call_id"]] == 1
        assert agent.resume("t").status is RunStatus.DONE
    assert not (state_dir.workspace / "a.txt").exists()


def test_the_model_is_never_sent_an_unanswered_call(state_dir: StateDir) -> None:
    with _agent(state_dir) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        (action,) = review.value["action_requests"]
        config = {"configurable": {"thread_id": "t"}}
        # a host writes past the pending call as if the model had moved on
        agent.graph.update_state(config, {"messages": [AIMessage("never mind")]}, as_node="agent")
        with pytest.raises(ConfigError, match=action["tool_call_id"]):
            agent.graph.invoke({"messages": [HumanMessage("and now?")]}, config)
    assert not (state_dir.workspace / "a.txt").exists()
