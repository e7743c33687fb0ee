"""A hypothesis state machine sends answers and verdicts in random order, and kills runs.

The real ledger, checkpointer and workspace, the scripted model, and a bell
tool whose first ring loses its answer (so its operation parks and needs a
verdict). Rules: answers bound and unbound, repeated and contradicting;
verdicts, repeated and contradicting; and kills: a CLI process (the same
``--agent`` recipe) answers with ``--approve all`` and is killed at a named
seam (``--crash-at``, exit 137), then this process resumes the thread.

After every step: no effect (a file, a ring) without an approval bound to
the intent shown; every applied answer recorded once; every refused answer
recorded; the message history valid at every checkpoint; every call answered
at most once. At teardown, "nothing wedged": answering every pending review
and verdict validly finishes the thread.

``EG_ANSWER_MACHINE_EXAMPLES`` (default 5) and ``EG_ANSWER_MACHINE_STEPS``
(default 10) scale it up, e.g. ``make answer-machine``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from effectgate import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import Agent, RunStatus
from effectgate.ledger import EventKind, OpState
from tests.answers import _machine_agent
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.answers._machine_agent:build"
SEAMS = [
    "AFTER_REVIEW_RECORDED",
    "AFTER_IN_FLIGHT_COMMIT",
    "AFTER_EXTERNAL_COMMIT",
    "AFTER_LEDGER_RESULT",
    "MID_SUPERSTEP",
]
VERDICTS: dict[str, dict[str, Any]] = {
    "succeeded": {"verdict": "succeeded", "reference": "seen-it"},
    "failed": {"verdict": "failed", "evidence": "no ring heard"},
    "retry": {"verdict": "retry", "acknowledge_duplicate_risk": True},
}
REVIEWER = "sm"


def _answer(kind: str, n: int) -> dict[str, Any]:
    decision: dict[str, Any] = {"type": kind}
    if kind == "reject":
        decision["message"] = "no"
    return {"decisions": [dict(decision) for _ in range(n)], "reviewer": REVIEWER}


def valid_history(messages: list[AnyMessage]) -> str | None:
    """Why a message history is not one a provider accepts, or ``None``.

    Every tool message answers a call of the AI message before it, once; no
    human or AI message comes while a call is unanswered.
    """
    open_calls: set[str] = set()
    answered: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id not in open_calls:
                return f"tool message for {m.tool_call_id}, which is not an open call"
            open_calls.discard(m.tool_call_id)
            answered.add(m.tool_call_id)
        elif isinstance(m, AIMessage | HumanMessage):
            if open_calls:
                return f"{m.type} message while {sorted(open_calls)} are unanswered"
            if isinstance(m, AIMessage):
                open_calls = {str(c["id"]) for c in m.tool_calls} - answered
    return None


pytestmark = pytest.mark.slow


class AnswerMachine(RuleBasedStateMachine):
    """Answers, verdicts and kills on one thread, in any order, against the real graph."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="eg-answers-"))
        self.stack = ExitStack()
        self.sd = StateDir.open(self.tmp / "state")
        self.agent = self._open()
        # Started from the CLI, so the killed processes find the recipe for the thread.
        started = eg("run", "go", "--thread", "t", "--agent", AGENT, *self._sd(), cwd=ROOT)
        assert started.code == 4, started.stderr
        self.result = self.agent.status("t")
        self.given: list[tuple[str, dict[str, Any]]] = []
        """Review answers applied: (interrupt id, answer)."""
        self.verdicts: list[tuple[str, dict[str, Any]]] = []
        """Verdicts applied: (operation id, verdict bound to its attempt)."""
        self.contradictions = 0

    def _sd(self) -> list[str]:
        return ["--state-dir", str(self.sd.root)]

    def _open(self) -> Agent:
        recipe = _machine_agent.build(self.sd)
        return self.stack.enter_context(
            open_agent(self.sd, model=recipe.model or "", tools=recipe.tools, policy=recipe.policy)
        )

    def teardown(self) -> None:
        try:
            self._finish()
        finally:
            self.stack.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _finish(self) -> None:
        """Nothing wedged: valid answers to whatever waits finish the thread."""
        for _ in range(12):
            status = self.agent.status("t")
            if status.status is RunStatus.DONE:
                break
            answers: dict[str, Any] = {}
            for item in status.interrupts:
                if item.kind == "review":
                    answers[item.id] = _answer("approve", len(item.value["action_requests"]))
                elif item.kind == "reconciliation":
                    answers[item.id] = VERDICTS["succeeded"]
            self.result = self.agent.resume("t", answers=answers or None)
        assert self.agent.status("t").status is RunStatus.DONE
        self.no_effect_without_a_bound_approval()
        self.history_valid_at_every_checkpoint()

    def _pending(self, kind: str) -> list[Any]:
        return [i for i in self.agent.status("t").interrupts if i.kind == kind]

    # ------------------------------------------------------------------ answers

    @precondition(lambda self: self.result.status is RunStatus.WAITING_REVIEW)
    @rule(kind=st.sampled_from(["approve", "reject"]))
    def answer_bound(self, kind: str) -> None:
        reviews = self._pending("review")
        if not reviews:
            return
        item = reviews[0]
        answer = _answer(kind, len(item.value["action_requests"]))
        self.result = self.agent.resume("t", answers={item.id: answer})
        self.given.append((item.id, answer))

    @rule(kind=st.sampled_from(["approve", "reject"]))
    def answer_unbound(self, kind: str) -> None:
        before = [op.state for op in self.agent.ledger.list(thread_id="t")]
        with pytest.raises(DecisionError, match="names no review"):
            self.agent.resume("t", decisions=_answer(kind, 1))
        assert [op.state for op in self.agent.ledger.list(thread_id="t")] == before

    @precondition(lambda self: bool(self.given))
    @rule(data=st.data())
    def answer_again(self, data: st.DataObject) -> None:
        interrupt_id, answer = data.draw(st.sampled_from(self.given))
        if data.draw(st.booleans()):
            self.result = self.agent.resume("t", answers={interrupt_id: answer})
            assert self.result.already_decided
            return
        kind = "reject" if answer["decisions"][0]["type"] == "approve" else "approve"
        with pytest.raises(DecisionError, match="already decided"):
            self.agent.resume("t", answers={interrupt_id: _answer(kind, len(answer["decisions"]))})
        self.contradictions += len(answer["decisions"])  # one refusal note per call

    # ----------------------------------------------------------------- verdicts

    @precondition(lambda self: self.result.status is RunStatus.WAITING_RECONCILIATION)
    @rule(kind=st.sampled_from(sorted(VERDICTS)))
    def verdict(self, kind: str) -> None:
        asked = self._pending("reconciliation")
        if not asked:
            return
        item = asked[0]
        op_id = str(item.value["operation_id"])
        given = {**VERDICTS[kind], "reviewer": REVIEWER, "attempt": item.value["attempt"]}
        self.result = self.agent.resume("t", answers={item.id: given})
        self.verdicts.append((op_id, given))
        event(f"verdict {kind}")

    @precondition(lambda self: bool(self.verdicts))
    @rule(data=st.data())
    def verdict_again(self, data: st.DataObject) -> None:
        op_id, given = data.draw(st.sampled_from(self.verdicts))
        op = self.agent.ledger.get(op_id)
        assert op is not None
        if op.state is OpState.NEEDS_RECONCILIATION:
            return  # asked again about a later attempt: a new question, not a repeat
        if data.draw(st.booleans()):
            again = self.agent.resume("t", verdicts={op_id: given})  # type: ignore[dict-item]
            assert again.already_decided, again
            self.result = again
            return
        other = next(k for k in ("failed", "succeeded") if k != given["verdict"])
        contra = {**VERDICTS[other], "attempt": given["attempt"]}
        with pytest.raises(DecisionError, match="refused"):
            self.agent.resume("t", verdicts={op_id: contra})  # type: ignore[dict-item]
        self.contradictions += 1

    # -------------------------------------------------------------------- kills

    @precondition(lambda self: self.result.status is RunStatus.WAITING_REVIEW)
    @rule(seam=st.sampled_from(SEAMS))
    def kill_at_a_seam_and_resume(self, seam: str) -> None:
        killed = eg("resume", "--thread", "t", "--approve", "all", "--reviewer", REVIEWER,
                    "--crash-at", seam, *self._sd(), cwd=ROOT)  # fmt: skip
        assert killed.code in (0, 3, 4, 137), (killed.code, killed.stderr[-800:])
        event(f"runner at {seam}: exit {killed.code}")
        self.result = self.agent.resume("t")  # a new runner continues the thread

    @rule()
    def resume_without_answer(self) -> None:
        self.result = self.agent.resume("t")

    # --------------------------------------------------------------- invariants

    @invariant()
    def no_effect_without_a_bound_approval(self) -> None:
        ws = self.sd.workspace
        written = {p.name for p in ws.iterdir()} if ws.exists() else set()
        rings = self.sd.root / "rings.txt"
        rung = (
            {line.rsplit("|", 1)[0] for line in rings.read_text().splitlines()}
            if rings.exists()
            else set()
        )
        for op in self.agent.ledger.list(thread_id="t"):
            took_effect = op.operation_id in rung or str(op.args.get("path")) in written
            approvals = [
                a for a in self.agent.ledger.approvals(op.operation_id) if a.reviewer == REVIEWER
            ]
            # every applied answer recorded once
            assert len(approvals) <= 1, approvals
            if took_effect:
                (approval,) = approvals
                assert approval.decision == "approve"
                assert approval.intent_hash == op.intent_hash
            else:
                assert op.state is not OpState.SUCCEEDED or op.receipt is not None

    @invariant()
    def refusals_are_recorded(self) -> None:
        notes = [
            e
            for e in self.agent.ledger.events(thread_id="t")
            if e.kind is EventKind.NOTE
            and ("refused_answer" in e.detail or "refused_verdict" in e.detail)
        ]
        assert len(notes) == self.contradictions

    @invariant()
    def history_valid_at_every_checkpoint(self) -> None:
        config = {"configurable": {"thread_id": "t"}}
        for snap in self.agent.graph.get_state_history(config):  # type: ignore[arg-type]
            problem = valid_history(list(snap.values.get("messages", [])))
            assert problem is None, (problem, snap.config)

    @invariant()
    def every_call_answered_at_most_once(self) -> None:
        counts = Counter(
            m.tool_call_id for m in self.agent.messages("t") if isinstance(m, ToolMessage)
        )
        assert all(n == 1 for n in counts.values()), counts


AnswerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("EG_ANSWER_MACHINE_EXAMPLES", "5")),
    stateful_step_count=int(os.environ.get("EG_ANSWER_MACHINE_STEPS", "10")),
    deadline=None,
    derandomize=True,
    # Each step runs real processes: report the failing run as found, unshrunk.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=True,
)
TestAnswerMachine = AnswerMachine.TestCase
