"""A tool whose body asks the user with LangGraph's ``interrupt()``.

A read tool may ask: the question reaches the caller as its own pending
interrupt (kind ``question``) and the answer is delivered by interrupt id. A
side-effecting tool that asks is refused: LangGraph matches a task's resume
values by position, so inside an effect step a question's answer could be
consumed by another interrupt of that step (a reconciliation after a crash,
a re-review after an expired approval). The call ends FAILED, "stopped before
acting", without acting; the other calls of the message run once (asserted
on the external systems' own state).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langgraph.types import interrupt
from pydantic import BaseModel

from effectgate import StateDir, default_tools, open_agent
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]


class _Note(BaseModel):
    topic: str


def _asking_writer(out: Path, runs: list[str]) -> ToolSpec:
    """A side-effecting tool that asks which priority before it appends one line to ``out``."""

    def write(args: _Note, ctx: ToolContext) -> ToolResult:
        runs.append(args.topic)
        priority = interrupt({"question": f"Which priority for {args.topic}?"})
        with out.open("a", encoding="utf-8") as fh:
            fh.write(f"{args.topic}:{priority}\n")
        return ToolResult(value={"written": args.topic, "priority": priority})

    return ToolSpec(
        name="file_note",
        description="Append a note, asking its priority.",
        args_schema=_Note,
        func=write,
        kind=EffectKind.IDEMPOTENT,
    )


def _asking_reader(runs: list[str]) -> ToolSpec:
    def read(args: _Note, ctx: ToolContext) -> ToolResult:
        runs.append(args.topic)
        answer = interrupt(f"What do you know about {args.topic}?")
        return ToolResult(value={"topic": args.topic, "answer": answer})

    return ToolSpec(
        name="ask_user",
        description="Ask the user.",
        args_schema=_Note,
        func=read,
        kind=EffectKind.READ,
    )


MAIL = {"to": ["oncall@example.com"], "subject": "s", "body": "b"}
SCRIPT: dict[str, Any] = {
    "name": "asks",
    "turns": [
        {
            "say": "mail and note",
            "tool_calls": [
                {"name": "send_email", "args": MAIL},
                {"name": "file_note", "args": {"topic": "db"}},
            ],
        }
    ],
    "final": "Done.",
}


def _approve_all(agent: Any, thread: str) -> Any:
    (review,) = [i for i in agent.status(thread).interrupts if i.kind == "review"]
    n = len(review.value["action_requests"])
    return agent.resume(thread, answers={review.id: {"decisions": [{"type": "approve"}] * n}})


def test_an_effect_tool_that_asks_is_refused_before_it_acts(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Mail and asking note in one message: one mail, no line, the note FAILED and said so."""
    out = state_dir.root / "notes.txt"
    runs: list[str] = []
    tools = [*default_tools(state_dir.workspace, services.endpoints), _asking_writer(out, runs)]
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state_dir, model=model, tools=tools) as agent:
        agent.start("go", thread_id="t")
        done = _approve_all(agent, "t")
        assert done.status is RunStatus.DONE, done
        assert not done.interrupts  # no question reached anyone: nothing to answer
        (op,) = [o for o in agent.ledger.list(thread_id="t") if o.tool == "file_note"]
        assert op.state is OpState.FAILED, op
        assert "interrupt()" in str(op.error) and "before acting" in str(op.error)
        told = [m for m in agent.messages("t") if getattr(m, "name", None) == "file_note"]
        assert len(told) == 1 and "interrupt()" in str(told[0].content)
        again = agent.resume("t")  # nothing left: the refusal is final, not re-asked
        assert again.status is RunStatus.DONE
    assert not out.exists()
    assert len(services.mails()) == 1
    assert runs == ["db"]  # the body ran up to its question once, and never acted


def test_a_read_tool_that_asks_is_answered_by_interrupt_id(state_dir: StateDir) -> None:
    runs: list[str] = []
    script = {
        "name": "ask",
        "turns": [{"say": "asking", "tool_calls": [{"name": "ask_user", "args": {"topic": "x"}}]}],
        "final": "Done.",
    }
    model = ScriptedChatModel.from_script(script)
    with open_agent(state_dir, model=model, tools=[_asking_reader(runs)]) as agent:
        waiting = agent.start("go", thread_id="t")
        (question,) = waiting.interrupts
        assert question.kind == "question"
        assert question.value["question"] == "What do you know about x?"
        done = agent.resume("t", answers={question.id: "it is fine"})
        assert done.status is RunStatus.DONE, done
        answered = [m for m in agent.messages("t") if getattr(m, "name", None) == "ask_user"]
        assert json.loads(str(answered[0].content))["result"]["answer"] == "it is fine"


def test_the_cli_refuses_an_effect_tool_that_asks(state_dir: StateDir) -> None:
    """Through ``--agent``: the asking tool ends FAILED with the reason; nothing waits, no file."""
    sd = ["--state-dir", str(state_dir.root)]
    agent = "tests.answers._asking_agent:build"
    ran = eg("run", "note it", "--thread", "t", "--agent", agent, "--approve", "all", *sd,
             cwd=ROOT)  # fmt: skip
    assert ran.code == 0, (ran.stdout, ran.stderr)
    assert "nothing is waiting" in eg("pending", *sd, cwd=ROOT).stdout
    listed = json.loads(eg("ledger", "list", *sd, "--json", cwd=ROOT).stdout)
    (op,) = [o for o in listed["operations"] if o["tool"] == "file_note"]
    assert op["state"] == "FAILED" and "interrupt()" in str(op["error"])
    assert not (state_dir.workspace / "notes.txt").exists()
