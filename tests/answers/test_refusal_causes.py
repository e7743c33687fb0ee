"""A refused answer names its true cause and what is pending now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate import StateDir
from effectgate.errors import DecisionError
from tests.answers.test_binding import _agent, _files, _write
from tests.cli.conftest import eg

TWO_THEN_ONE = [[_write("a.txt", "a\n"), _write("b.txt", "b\n")], [_write("c.txt", "c\n")]]


def _ids(review: Any) -> list[dict[str, str]]:
    return [
        {"operation_id": a["operation_id"], "intent_hash": a["intent_hash"]}
        for a in review.value["action_requests"]
    ]


def test_decisions_in_the_wrong_order_are_refused_as_such(state_dir: StateDir) -> None:
    """Bound to the calls, but in reverse: the refusal says so, and names the pending review."""
    with _agent(state_dir, TWO_THEN_ONE) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        first, second = _ids(review)
        reversed_ = {"decisions": [{"type": "approve", **second}, {"type": "reject", **first}]}
        for given in ({"decisions": reversed_}, {"answers": {review.id: reversed_}}):
            with pytest.raises(DecisionError) as refused:
                agent.resume("t", **given)
            text = str(refused.value)
            assert "in another order" in text, text
            assert f"review {review.id}" in text
            assert "no recorded decision" not in text
        assert agent.status("t").interrupts[0].id == review.id
    assert not state_dir.workspace.exists() or _files(state_dir) == {}


def test_a_contradicting_answer_to_a_decided_review_names_the_newer_one(
    state_dir: StateDir,
) -> None:
    """Review A decided, B waits: "reject A" is refused as already decided, and B is named."""
    with _agent(state_dir, TWO_THEN_ONE) as agent:
        (review_a,) = agent.start("write", thread_id="t").interrupts
        approve_a = {"decisions": [{"type": "approve"}] * 2, "reviewer": "ann"}
        (review_b,) = agent.resume("t", answers={review_a.id: approve_a}).interrupts
        first, second = _ids(review_a)
        contradictions = [
            {"answers": {review_a.id: {"decisions": [{"type": "reject"}] * 2}}},
            {
                "decisions": {
                    "decisions": [{"type": "reject", **first}, {"type": "reject", **second}]
                }
            },
        ]
        for given in contradictions:
            with pytest.raises(DecisionError) as refused:
                agent.resume("t", **given)
            text = str(refused.value)
            assert "no longer open" in text and "already decided: approve by ann" in text, text
            assert f"pending: review {review_b.id}" in text
        assert agent.status("t").interrupts[0].id == review_b.id
    assert _files(state_dir) == {"a.txt": "a\n", "b.txt": "b\n"}


def test_cli_refusals_name_their_cause_and_the_pending_review(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "name": "s",
                "final": "Done.",
                "turns": [
                    {"say": f"step {n}", "tool_calls": c} for n, c in enumerate(TWO_THEN_ONE)
                ],
            }
        )
    )
    assert eg("run", "write", "--model", f"scripted:{script}", *sd, "--thread", "t").code == 4
    (item,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    first, second = (
        {"operation_id": a["operation_id"], "intent_hash": a["intent_hash"]}
        for a in item["value"]["action_requests"]
    )
    wrong = tmp_path / "wrong.json"
    wrong.write_text(
        json.dumps({"decisions": [{"type": "approve", **second}, {"type": "approve", **first}]})
    )
    refused = eg("resume", *sd, "--thread", "t", "--decisions", str(wrong))
    text = " ".join(refused.stderr.split())
    assert refused.code == 2 and "in another order" in text and item["id"] in text, text
    assert not (state / "workspace" / "a.txt").exists()
    approve = tmp_path / "approve.json"
    approve.write_text(
        json.dumps({"interrupt_id": item["id"], "decisions": [{"type": "approve"}] * 2})
    )
    assert eg("resume", *sd, "--thread", "t", "--decisions", str(approve)).code == 4
    (item_b,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    reject = tmp_path / "reject.json"
    reject.write_text(
        json.dumps({"interrupt_id": item["id"], "decisions": [{"type": "reject"}] * 2})
    )
    refused = eg("resume", *sd, "--thread", "t", "--decisions", str(reject))
    text = " ".join(refused.stderr.split())
    assert refused.code == 2 and "already decided: approve" in text, text
    assert f"pending: review {item_b['id']}" in text
    assert not (state / "workspace" / "c.txt").exists()
