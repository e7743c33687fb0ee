"""A user's agent with a custom side-effecting tool, for ``effectgate ... --agent``.

``tests.conversations._custom_agent:build`` is the factory the CLI tests load:
one tool, ``ring_bell``, that writes ``bells/<operation id>.txt`` in the
workspace (the same bytes on a retry: idempotent), and a scripted model that
rings it once.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from effectgate import StateDir
from effectgate.cli import AgentRecipe
from effectgate.graph import Policy
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolResult, ToolSpec

TASK = "Ring the bell for the release."

SCRIPT: dict[str, Any] = {
    "name": "bell",
    "turns": [
        {"say": "Ringing.", "tool_calls": [{"name": "ring_bell", "args": {"text": "release"}}]},
        {"say": "Bell: {{ outcomes }}."},
    ],
    "followups": [
        {
            "turns": [
                {
                    "say": "Ringing again.",
                    "tool_calls": [{"name": "ring_bell", "args": {"text": "release"}}],
                },
                {"say": "Bell: {{ outcomes }}."},
            ]
        },
        {"final": "Not ringing."},
    ],
}


class BellArgs(BaseModel):
    text: str


def bell_tool(sd: StateDir) -> ToolSpec:
    """The custom tool, writing into ``sd``'s workspace."""

    def ring(args: BellArgs, ctx: Any) -> ToolResult:
        path = sd.workspace / "bells" / f"{ctx.operation_id.replace(':', '_')}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(args.text)
        return ToolResult(value={"rang": args.text}, reference=path.name)

    return ToolSpec(
        name="ring_bell",
        description="Ring the release bell.",
        args_schema=BellArgs,
        func=ring,
        kind=EffectKind.IDEMPOTENT,
    )


def build(sd: StateDir) -> AgentRecipe:
    """The factory: the bell tool, the scripted model, approvals that never expire."""
    return AgentRecipe(
        tools=[bell_tool(sd)],
        model=ScriptedChatModel.from_script(SCRIPT),
        policy=Policy(approval_ttl=None),
    )
