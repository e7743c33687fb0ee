"""Arguments a schema fills from a ``default_factory`` are fixed once, when the call is proposed."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from effectgate import StateDir, open_agent
from effectgate.graph import RunStatus
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


class _Note(BaseModel):
    text: str
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def test_a_default_factory_field_does_not_change_under_the_reviewer(state_dir: StateDir) -> None:
    sent: list[tuple[str, str]] = []

    def post(args: _Note, ctx: ToolContext) -> ToolResult:
        sent.append((args.text, args.at.isoformat()))
        return ToolResult(value={"ok": True})

    spec = ToolSpec(
        name="post_note", description="Post a note.", args_schema=_Note, func=post,
        kind=EffectKind.UNSAFE,
    )  # fmt: skip
    script = {
        "name": "note",
        "turns": [
            {"say": "posting", "tool_calls": [{"name": "post_note", "args": {"text": "hi"}}]}
        ],
        "final": "Posted.",
    }
    model = ScriptedChatModel.from_script(script)
    with open_agent(state_dir, model=model, tools=[spec]) as agent:
        (review,) = agent.start("post", thread_id="t").interrupts
        (action,) = review.value["action_requests"]
        again = agent.status("t").interrupts[0].value["action_requests"][0]
        assert again["args"] == action["args"] and again["intent_hash"] == action["intent_hash"]
        done = agent.resume("t", answers={review.id: {"decisions": [{"type": "approve"}]}})
        assert done.status is RunStatus.DONE, done
        assert [e for e in (agent.status("t").interrupts)] == []
    assert sent == [("hi", action["args"]["at"].replace("Z", "+00:00"))]
