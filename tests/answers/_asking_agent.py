"""An ``--agent`` factory whose tool asks the user with ``interrupt()`` before it writes a file."""

from __future__ import annotations

from langgraph.types import interrupt
from pydantic import BaseModel

from effectgate import StateDir
from effectgate.cli import AgentRecipe
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

SCRIPT = {
    "name": "asks",
    "turns": [{"say": "noting", "tool_calls": [{"name": "file_note", "args": {"topic": "db"}}]}],
    "final": "Done.",
}


class Note(BaseModel):
    """One note's topic."""

    topic: str


def build(state_dir: StateDir) -> AgentRecipe:
    """A scripted model proposing one ``file_note``, which asks the priority first."""
    from effectgate.models import ScriptedChatModel

    out = state_dir.workspace / "notes.txt"

    def write(args: Note, ctx: ToolContext) -> ToolResult:
        priority = interrupt({"question": f"Which priority for {args.topic}?"})
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as fh:
            fh.write(f"{args.topic}:{priority}\n")
        return ToolResult(value={"written": args.topic})

    spec = ToolSpec(
        name="file_note",
        description="Append a note, asking its priority.",
        args_schema=Note,
        func=write,
        kind=EffectKind.IDEMPOTENT,
    )
    return AgentRecipe(tools=[spec], model=ScriptedChatModel.from_script(SCRIPT))
