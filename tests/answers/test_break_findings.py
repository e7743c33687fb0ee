"""Findings of a break test of answer refusals (CLI ``resume --decisions``, ``Agent.resume``).

Each refusal says what is true: it names what waits, a file the graph would
refuse is refused before anything runs (the pending interrupt keeps its id),
and one rule has one wording whichever path it is reached by.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langgraph.types import Command

from effectgate import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import RunStatus
from effectgate.ledger import EventKind, OpState
from tests.answers import _parking_agent
from tests.answers.test_binding import _agent, _files, _write
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]
TWICE = "tests.answers._parking_agent:build_twice"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_refused_verdict_names_the_review_that_waits(state_dir: StateDir, tmp_path: Path) -> None:
    """Finding 1: the refusal of a contradicting verdict names the later review, not "nothing"."""
    sd = ["--state-dir", str(state_dir.root)]
    parked = eg("run", "ring", "--thread", "t", "--agent", TWICE, "--approve", "all", *sd,
                cwd=ROOT)  # fmt: skip
    assert parked.code == 3, (parked.stdout, parked.stderr)
    ((op_id, _),) = [
        line.rsplit(":", 1) for line in (state_dir.workspace / "rings.txt").read_text().splitlines()
    ]
    good = tmp_path / "v.json"
    good.write_text(json.dumps({"verdicts": {op_id: {"verdict": "succeeded", "reference": "B-1"}}}))
    waits = eg("resume", "--thread", "t", "--decisions", str(good), *sd, cwd=ROOT)
    assert waits.code == 4, (waits.stdout, waits.stderr)  # the second ring's review waits
    (item,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    assert item["kind"] == "review"
    bad = tmp_path / "w.json"
    bad.write_text(json.dumps({"verdicts": {op_id: {"verdict": "failed"}}}))
    refused = eg("resume", "--thread", "t", "--decisions", str(bad), *sd, cwd=ROOT)
    text = _one_line(refused.stderr)
    assert refused.code == 2, (refused.stdout, refused.stderr)
    assert "already decided: verdict succeeded" in text, text
    assert f"pending: review {item['id']}" in text, text
    assert "no review is pending" not in text, text
    (still,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    assert still["id"] == item["id"]
    assert (state_dir.workspace / "rings.txt").read_text().count("\n") == 1


def test_a_respond_without_a_message_is_refused_up_front(tmp_path: Path) -> None:
    """Finding 2: exit 2, one line, nothing written, the same interrupt id still pending."""
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {"name": "s", "final": "Done.",
             "turns": [{"say": "w", "tool_calls": [_write("a.txt", "a\n")]}]}
        )
    )  # fmt: skip
    assert eg("run", "write", "--model", f"scripted:{script}", *sd, "--thread", "t").code == 4
    (item,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    before = (state / "ledger.db").read_bytes() if (state / "ledger.db").exists() else None
    for decision in ({"type": "respond"}, {"type": "respond", "message": "  "}):
        answer = tmp_path / "respond.json"
        answer.write_text(json.dumps({"interrupt_id": item["id"], "decisions": [decision]}))
        refused = eg("resume", *sd, "--thread", "t", "--decisions", str(answer))
        assert refused.code == 2, (refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "needs a message" in lines[0], refused.stderr
        assert "decision 0" in lines[0], lines
        (still,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
        assert still["id"] == item["id"]
    if before is not None:
        assert (state / "ledger.db").read_bytes() == before
    assert not (state / "workspace" / "a.txt").exists()


def test_a_wrong_count_for_a_shown_review_says_so(state_dir: StateDir) -> None:
    """Finding 3a: a review the thread showed is not called "not a review of this thread"."""
    with _agent(state_dir, [[_write("a.txt", "a\n")], [_write("b.txt", "b\n")]]) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        agent.resume("t", answers={review.id: {"decisions": [{"type": "approve"}]}})
        (later,) = agent.status("t").interrupts
        with pytest.raises(DecisionError) as refused:
            agent.resume(
                "t",
                answers={review.id: {"decisions": [{"type": "approve"}, {"type": "approve"}]}},
            )
        text = str(refused.value)
        assert "not a review of this thread" not in text, text
        assert f"review {review.id}" in text and "showed 1 call" in text, text
        assert f"pending: review {later.id}" in text, text
        assert agent.status("t").interrupts[0].id == later.id
    assert _files(state_dir) == {"a.txt": "a\n"}


def test_a_verdict_naming_no_attempt_says_so(state_dir: StateDir, tmp_path: Path) -> None:
    """Finding 3b: a verdict for attempt 7 of a one-attempt operation names no attempt."""
    sd = ["--state-dir", str(state_dir.root)]
    agent = "tests.answers._parking_agent:build"
    parked = eg("run", "ring", "--thread", "t", "--agent", agent, "--approve", "all", *sd,
                cwd=ROOT)  # fmt: skip
    assert parked.code == 3, (parked.stdout, parked.stderr)
    ((op_id, _),) = [
        line.rsplit(":", 1) for line in (state_dir.workspace / "rings.txt").read_text().splitlines()
    ]
    given = tmp_path / "v.json"
    given.write_text(
        json.dumps({"verdicts": {op_id: {"verdict": "failed", "reference": "x", "attempt": 7}}})
    )
    ran = eg("resume", "--thread", "t", "--decisions", str(given), *sd, cwd=ROOT)
    text = _one_line(ran.stderr)
    assert "used for an earlier attempt" not in text, text
    assert "attempt 7" in text and "names no attempt" in text, text
    recipe = _parking_agent.build(state_dir)
    with open_agent(state_dir, model=recipe.model or "", tools=recipe.tools) as reader:
        op = reader.ledger.get(op_id)
        assert op is not None and op.state is OpState.NEEDS_RECONCILIATION
        assert not [
            e
            for e in reader.ledger.events(operation_id=op_id)
            if e.kind is EventKind.TRANSITION and e.src is OpState.NEEDS_RECONCILIATION
        ]


def test_a_non_object_decision_has_one_wording(state_dir: StateDir, tmp_path: Path) -> None:
    """Finding 3c: ``Agent.resume`` and the CLI say "must be an object" alike."""
    with _agent(state_dir, [[_write("a.txt", "a\n")]]) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        with pytest.raises(DecisionError) as refused:
            agent.resume("t", answers={review.id: {"decisions": [None]}})
        text = str(refused.value)
        assert "must be an object" in text and "is not allowed" not in text, text
        assert agent.status("t").status is RunStatus.WAITING_REVIEW
        assert agent.status("t").interrupts[0].id == review.id
    assert _files(state_dir) == {}


def test_an_answer_to_a_review_asked_again_under_a_new_id_says_so(state_dir: StateDir) -> None:
    """A raw client's refused answer makes the graph ask again under a new id.

    An answer that then names the old id is refused, and the refusal says the
    review may have been asked again, naming the new id; it does not say only
    "answered elsewhere" (nobody answered it).
    """
    with _agent(state_dir, [[_write("a.txt", "a\n")]]) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        agent.graph.invoke(
            Command(resume={review.id: {"decisions": [{"type": "approve"}] * 2}}),
            {"configurable": {"thread_id": "t"}},
        )
        (again,) = agent.status("t").interrupts
        assert again.id != review.id
        with pytest.raises(DecisionError) as refused:
            agent.resume("t", answers={review.id: {"decisions": [{"type": "approve"}]}})
        text = _one_line(str(refused.value))
        assert f"review {review.id}, which is not pending" in text, text
        assert "asked again under a new id" in text, text
        assert f"pending: review {again.id}" in text, text
        assert _files(state_dir) == {}
        agent.resume("t", answers={again.id: {"decisions": [{"type": "approve"}]}})
        assert _files(state_dir) == {"a.txt": "a\n"}
