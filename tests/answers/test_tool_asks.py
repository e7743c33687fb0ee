"""A tool whose body asks the user with LangGraph's ``interrupt()``.

The question is control flow, not a failure: it passes through dispatch
without using an attempt, reaches the caller as its own pending interrupt
(kind ``question``), the answer is delivered to the body on the re-run, and
the effect happens once (asserted on the external systems' own state).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langgraph.types import interrupt
from pydantic import BaseModel

from effectgate._app import StateDir, default_tools, open_agent
from effectgate.demo.services import DemoServices
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import Budget, OpState
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


def test_an_effect_tool_that_asks_gets_its_answer_and_acts_once(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Mail and asking note in one message: one mail, one line, no attempt used by the question."""
    out = state_dir.root / "notes.txt"
    runs: list[str] = []
    tools = [*default_tools(state_dir.workspace, services.endpoints), _asking_writer(out, runs)]
    policy = Policy(budget=Budget(max_attempts=1))
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state_dir, model=model, tools=tools, policy=policy) as agent:
        agent.start("go", thread_id="t")
        asked = _approve_all(agent, "t")
        assert asked.status is RunStatus.WAITING_REVIEW, asked
        (question,) = asked.interrupts
        assert question.kind == "question"
        assert question.value["question"] == {"question": "Which priority for db?"}
        (op,) = [o for o in agent.ledger.list(thread_id="t") if o.tool == "file_note"]
        assert op.state is OpState.APPROVED and op.attempt == 0  # the question used no attempt
        assert not out.exists()
        assert agent.status("t").interrupts == asked.interrupts
        done = agent.resume("t", answers={question.id: "high"})
        assert done.status is RunStatus.DONE, done
        (op,) = [o for o in agent.ledger.list(thread_id="t") if o.tool == "file_note"]
        assert op.state is OpState.SUCCEEDED and op.attempt == 1
    assert out.read_text(encoding="utf-8") == "db:high\n"
    assert len(services.mails()) == 1
    assert runs == ["db", "db"]  # asked once, then ran with the answer


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


def test_the_cli_shows_a_tools_question_and_answers_it_from_a_file(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """``pending`` shows the question; ``--approve all`` never answers it; a file does."""
    sd = ["--state-dir", str(state_dir.root)]
    agent = "tests.answers._asking_agent:build"
    started = eg("run", "note it", "--thread", "t", "--agent", agent, "--approve", "all", *sd,
                 cwd=ROOT)  # fmt: skip
    assert started.code == 4, (started.stdout, started.stderr)
    shown = json.loads(eg("pending", *sd, "--json", cwd=ROOT).stdout)
    (entry,) = shown["threads"]
    (item,) = entry["interrupts"]
    assert item["kind"] == "question"
    assert item["value"]["question"] == {"question": "Which priority for db?"}
    assert "a tool asks" in eg("pending", *sd, cwd=ROOT).stdout
    blanket = eg("resume", "--thread", "t", "--approve", "all", *sd, cwd=ROOT)
    assert blanket.code == 4 and not (state_dir.workspace / "notes.txt").exists()
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"answers": {item["id"]: "low"}}), encoding="utf-8")
    done = eg("resume", "--thread", "t", "--decisions", str(answers), *sd, "--json", cwd=ROOT)
    assert done.code == 0, (done.stdout, done.stderr)
    assert (state_dir.workspace / "notes.txt").read_text(encoding="utf-8") == "db:low\n"
    again = eg("resume", "--thread", "t", "--approve", "all", *sd, cwd=ROOT)
    assert again.code == 0
    assert (state_dir.workspace / "notes.txt").read_text(encoding="utf-8") == "db:low\n"
