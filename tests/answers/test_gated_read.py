"""A read tool declared ``requires_approval=True`` is reviewed before it runs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from effectgate import StateDir, open_agent
from effectgate.graph import RunStatus
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


class _Path(BaseModel):
    path: str


def _gated(calls: list[str]) -> ToolSpec:
    def read(args: _Path, ctx: ToolContext) -> ToolResult:
        calls.append(args.path)
        return ToolResult(value={"secret": "42"})

    return ToolSpec(
        name="read_secret",
        description="Read a secret.",
        args_schema=_Path,
        func=read,
        kind=EffectKind.READ,
        requires_approval=True,
    )


SCRIPT: dict[str, Any] = {
    "name": "peek",
    "turns": [{"say": "peeking", "tool_calls": [{"name": "read_secret", "args": {"path": "k"}}]}],
    "final": "Done.",
}


def test_a_gated_read_waits_for_review_and_a_reject_keeps_it_unread(state_dir: StateDir) -> None:
    ran: list[str] = []
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state_dir, model=model, tools=[_gated(ran)]) as agent:
        shown = agent.start("peek", thread_id="t")
        assert shown.status is RunStatus.WAITING_REVIEW and ran == []
        (review,) = shown.interrupts
        assert review.value["action_requests"][0]["name"] == "read_secret"
        reject = {"decisions": [{"type": "reject", "message": "private"}]}
        assert agent.resume("t", answers={review.id: reject}).status is RunStatus.DONE
        assert ran == []
        again = agent.start("peek", thread_id="u")
        approve = {"decisions": [{"type": "approve"}]}
        assert agent.resume("u", answers={again.interrupts[0].id: approve}).status is RunStatus.DONE
    assert ran == ["k"]


def test_a_respond_to_a_gated_read_keeps_it_unread_and_tells_the_model(
    state_dir: StateDir,
) -> None:
    """HITL's ``respond`` answers the model in the tool's place: the read does not run.

    Before, the tools node acted only on ``reject``, so a ``respond`` (allowed
    wherever ``reject`` is) ran the read it was meant to stand in for.
    """
    ran: list[str] = []
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state_dir, model=model, tools=[_gated(ran)]) as agent:
        (review,) = agent.start("peek", thread_id="t").interrupts
        respond = {"decisions": [{"type": "respond", "message": "the secret is not for you"}]}
        assert agent.resume("t", answers={review.id: respond}).status is RunStatus.DONE
        state = agent.graph.get_state({"configurable": {"thread_id": "t"}}).values["messages"]
    assert ran == []
    (answer,) = [m for m in state if getattr(m, "tool_call_id", None)]
    assert "the secret is not for you" in str(answer.content)
    assert "42" not in str(answer.content)
