"""An ``--agent`` factory whose one unsafe tool loses its answer: the call is parked."""

from __future__ import annotations

from pydantic import BaseModel

from effectgate import StateDir
from effectgate.cli import AgentRecipe
from effectgate.errors import OutcomeUnknown
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

SCRIPT = {
    "name": "parks",
    "turns": [{"say": "ringing", "tool_calls": [{"name": "ring", "args": {"times": 1}}]}],
    "final": "Done.",
}


class Ring(BaseModel):
    """How many times to ring."""

    times: int


def build(state_dir: StateDir) -> AgentRecipe:
    """A scripted model proposing one ``ring``; the ring happens, its answer is lost."""
    from effectgate.models import ScriptedChatModel

    out = state_dir.workspace / "rings.txt"

    def ring(args: Ring, ctx: ToolContext) -> ToolResult:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as fh:
            fh.write(f"{ctx.operation_id}:{ctx.attempt}\n")
        raise OutcomeUnknown("the bell's answer was lost")

    spec = ToolSpec(
        name="ring",
        description="Ring the bell.",
        args_schema=Ring,
        func=ring,
        kind=EffectKind.UNSAFE,
    )
    return AgentRecipe(tools=[spec], model=ScriptedChatModel.from_script(SCRIPT))


TWICE = {
    "name": "parks-then-asks",
    "turns": [
        {"say": "ringing", "tool_calls": [{"name": "ring", "args": {"times": 1}}]},
        {"say": "again", "tool_calls": [{"name": "ring", "args": {"times": 2}}]},
    ],
    "final": "Done.",
}


def build_twice(state_dir: StateDir) -> AgentRecipe:
    """As ``build``, then a second ``ring``: its review waits after the first is settled."""
    from effectgate.models import ScriptedChatModel

    recipe = build(state_dir)
    return AgentRecipe(tools=recipe.tools, model=ScriptedChatModel.from_script(TWICE))
