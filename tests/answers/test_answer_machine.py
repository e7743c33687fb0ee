"""A hypothesis state machine sends answers in random order: bound, unbound, stale, repeated.

In process, with the scripted model and the real ledger, checkpointer and
workspace. After every step: no file without an approval bound to the intent
shown; every refused contradiction recorded in the ledger; every call
answered at most once; and the thread is never wedged (done, or waiting at
something a valid answer can take).
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from langchain_core.messages import ToolMessage

from effectgate._app import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.ledger import EventKind, OpState
from effectgate.models import ScriptedChatModel

FILES = ["a", "b", "c", "d"]
SCRIPT: dict[str, Any] = {
    "name": "four-files",
    "turns": [
        {
            "say": f"writing {name}",
            "tool_calls": [
                {"name": "write_file", "args": {"path": f"{name}.txt", "content": f"{name}\n"}}
            ],
        }
        for name in FILES
    ],
    "final": "All done.",
}


def _answer(kind: str) -> dict[str, Any]:
    decision: dict[str, Any] = {"type": kind}
    if kind == "reject":
        decision["message"] = "no"
    return {"decisions": [decision], "reviewer": "sm"}


pytestmark = pytest.mark.slow


class AnswerMachine(RuleBasedStateMachine):
    """Answers to one thread, in any order, against the real graph."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="eg-answers-"))
        self.stack = ExitStack()
        self.sd = StateDir.open(self.tmp / "state")
        model = ScriptedChatModel.from_script(SCRIPT)
        self.agent: Agent = self.stack.enter_context(
            open_agent(self.sd, model=model, policy=Policy(approval_ttl=None))
        )
        self.result = self.agent.start("write", thread_id="t")
        self.given: list[tuple[str, dict[str, Any]]] = []
        """Answers applied: (interrupt id, answer)."""
        self.contradictions = 0

    def teardown(self) -> None:
        self.stack.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _pending(self) -> list[Any]:
        return [i for i in self.agent.status("t").interrupts if i.kind == "review"]

    @precondition(lambda self: self.result.status is RunStatus.WAITING_REVIEW)
    @rule(kind=st.sampled_from(["approve", "reject"]))
    def answer_bound(self, kind: str) -> None:
        (item,) = self._pending()
        answer = _answer(kind)
        self.result = self.agent.resume("t", answers={item.id: answer})
        self.given.append((item.id, answer))

    @rule(kind=st.sampled_from(["approve", "reject"]))
    def answer_unbound(self, kind: str) -> None:
        before = [op.state for op in self.agent.ledger.list(thread_id="t")]
        with pytest.raises(DecisionError, match="names no review"):
            self.agent.resume("t", decisions=_answer(kind))
        assert [op.state for op in self.agent.ledger.list(thread_id="t")] == before

    @precondition(lambda self: bool(self.given))
    @rule(data=st.data())
    def answer_again(self, data: st.DataObject) -> None:
        interrupt_id, answer = data.draw(st.sampled_from(self.given))
        same = data.draw(st.booleans())
        if same:
            self.result = self.agent.resume("t", answers={interrupt_id: answer})
            assert self.result.already_decided
            return
        kind = "reject" if answer["decisions"][0]["type"] == "approve" else "approve"
        with pytest.raises(DecisionError, match="already decided"):
            self.agent.resume("t", answers={interrupt_id: _answer(kind)})
        self.contradictions += 1

    @rule()
    def resume_without_answer(self) -> None:
        self.result = self.agent.resume("t")

    @invariant()
    def only_approved_intents_ran(self) -> None:
        written = (
            {p.name for p in self.sd.workspace.iterdir()} if self.sd.workspace.exists() else set()
        )
        for op in self.agent.ledger.list(thread_id="t"):
            approval = self.agent.ledger.latest_approval(op.operation_id)
            path = str(op.args["path"])
            if path in written:
                assert op.state is OpState.SUCCEEDED
                assert approval is not None and approval.decision == "approve"
                assert approval.intent_hash == op.intent_hash and approval.reviewer == "sm"
            else:
                assert op.state is not OpState.SUCCEEDED

    @invariant()
    def refusals_are_recorded(self) -> None:
        notes = [
            e
            for e in self.agent.ledger.events(thread_id="t")
            if e.kind is EventKind.NOTE and "refused_answer" in e.detail
        ]
        assert len(notes) == self.contradictions

    @invariant()
    def every_call_answered_at_most_once_and_never_wedged(self) -> None:
        counts = Counter(
            m.tool_call_id for m in self.agent.messages("t") if isinstance(m, ToolMessage)
        )
        assert all(n == 1 for n in counts.values())
        status = self.agent.status("t")
        assert status.status is RunStatus.DONE or status.interrupts, status


AnswerMachine.TestCase.settings = settings(
    max_examples=8, stateful_step_count=8, deadline=None, derandomize=True
)
TestAnswerMachine = AnswerMachine.TestCase
