"""The ``--agent`` factory of the answer state machine: file writes and a bell that may park.

The same recipe runs in the test process and in the CLI processes the
machine kills at a seam, so both sides see one thread with one set of tools.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from effectgate import StateDir, default_tools
from effectgate.cli import AgentRecipe
from effectgate.errors import OutcomeUnknown
from effectgate.graph import Policy
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

FILES = ["a", "b", "c"]


def _write(name: str) -> dict[str, Any]:
    return {"name": "write_file", "args": {"path": f"{name}.txt", "content": f"{name}\n"}}


SCRIPT: dict[str, Any] = {
    "name": "answer-machine",
    "turns": [
        {
            "say": "writing a and ringing",
            "tool_calls": [_write("a"), {"name": "ring", "args": {"n": 1}}],
        },
        {"say": "writing b", "tool_calls": [_write("b")]},
        {
            "say": "ringing again and writing c",
            "tool_calls": [{"name": "ring", "args": {"n": 2}}, _write("c")],
        },
    ],
    "final": "All done.",
}
POLICY = Policy(approval_ttl=None)


class Ring(BaseModel):
    """Which ring."""

    n: int


def ring_tool(state_dir: StateDir) -> ToolSpec:
    """An unsafe bell: every attempt rings (a line in ``rings.txt``); the first loses its answer."""
    out = state_dir.root / "rings.txt"

    def ring(args: Ring, ctx: ToolContext) -> ToolResult:
        with out.open("a", encoding="utf-8") as fh:
            fh.write(f"{ctx.operation_id}|{ctx.attempt}\n")
        if ctx.attempt == 1:
            raise OutcomeUnknown("the bell's answer was lost")
        return ToolResult(value={"rang": args.n}, reference=f"ring-{args.n}-{ctx.attempt}")

    return ToolSpec(
        name="ring",
        description="Ring the bell.",
        args_schema=Ring,
        func=ring,
        kind=EffectKind.UNSAFE,
    )


def build(state_dir: StateDir) -> AgentRecipe:
    """File tools on the workspace plus the bell, with the machine's scripted model."""
    from effectgate.models import ScriptedChatModel

    tools = [*default_tools(state_dir.workspace), ring_tool(state_dir)]
    return AgentRecipe(tools=tools, model=ScriptedChatModel.from_script(SCRIPT), policy=POLICY)
