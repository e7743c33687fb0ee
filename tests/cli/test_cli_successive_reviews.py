"""A decisions file may answer the successive reviews of one run, each bound by its calls.

An answer bound by ``operation_id`` and ``intent_hash`` names calls that the
model proposes only later in the run. Before, the first review took its own
answer and handed every other one to the agent at once, which refused them
("not pending and has no recorded decision"): a file answering the demo's two
reviews ended with exit 2 after the ticket. The external systems' own
storage is counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import eg, world

THREAD = "succ-1"


@pytest.fixture(scope="module")
def bindings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Each demo call's operation id and intent hash, learnt from one approved run."""
    state = tmp_path_factory.mktemp("learn") / "state"
    ran = eg("demo", "--state-dir", str(state), "--thread", THREAD, "--approve", "all")
    assert ran.code == 0, ran.stderr[-2000:]
    listed = eg("ledger", "list", "--state-dir", str(state), "--json").json
    ops = listed["operations"] if isinstance(listed, dict) else listed
    return {op["tool"]: {"operation_id": op["id"], "intent_hash": op["intent_hash"]} for op in ops}


def _approve(binding: dict[str, str]) -> dict[str, Any]:
    return {"type": "approve", **binding}


def _run(tmp_path: Path, entries: list[dict[str, Any]]) -> tuple[Any, Path]:
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(entries))
    state = tmp_path / "state"
    ran = eg("demo", "--state-dir", str(state), "--thread", THREAD, "--decisions", str(path))
    return ran, state


@pytest.mark.parametrize("order", ["in-order", "later-first"])
def test_a_file_answers_both_reviews_of_the_demo_in_any_order(
    tmp_path: Path, bindings: dict[str, dict[str, str]], order: str
) -> None:
    b = bindings
    entries = [
        {"decisions": [_approve(b["create_ticket"])]},
        {"decisions": [_approve(b["send_email"]), _approve(b["write_file"])]},
    ]
    ran, state = _run(tmp_path, entries if order == "in-order" else entries[::-1])
    assert ran.code == 0, ran.stderr[-2000:]
    seen = world(state)
    assert (len(seen["tickets"]), len(seen["mails"]), len(seen["files"])) == (1, 1, 1)


def test_an_answer_that_fits_no_review_is_still_refused_when_its_review_comes(
    tmp_path: Path, bindings: dict[str, dict[str, str]]
) -> None:
    """One call of the second answer is shown in the review, the other never: refused, exit 2."""
    b = bindings
    wrong = {**b["send_email"], "operation_id": f"{THREAD}:call_never_proposed"}
    ran, state = _run(
        tmp_path,
        [
            {"decisions": [_approve(b["create_ticket"])]},
            {"decisions": [_approve(wrong), _approve(b["write_file"])]},
        ],
    )
    assert ran.code == 2, ran.stderr[-2000:]
    assert "call_never_proposed" in ran.stderr
    seen = world(state)
    assert (len(seen["tickets"]), len(seen["mails"]), len(seen["files"])) == (1, 0, 0)


def test_an_answer_to_calls_never_proposed_is_refused_when_the_run_ends(
    tmp_path: Path, bindings: dict[str, dict[str, str]]
) -> None:
    b = bindings
    ghost = {"operation_id": f"{THREAD}:call_ghost", "intent_hash": "0" * 64}
    ran, state = _run(
        tmp_path,
        [
            {"decisions": [_approve(b["create_ticket"])]},
            {"decisions": [_approve(b["send_email"]), _approve(b["write_file"])]},
            {"decisions": [_approve(ghost)]},
        ],
    )
    assert ran.code == 2, ran.stderr[-2000:]
    assert "call_ghost" in ran.stderr
    assert len(world(state)["mails"]) == 1


def test_resume_with_answers_only_for_a_later_review_names_the_one_pending(
    tmp_path: Path, bindings: dict[str, dict[str, str]]
) -> None:
    """Exit 2, and the error names the review that waits (it said "no review was pending")."""
    b = bindings
    state = tmp_path / "state"
    stopped = eg("demo", "--state-dir", str(state), "--thread", THREAD)
    assert stopped.code == 4, stopped.stderr[-2000:]
    path = tmp_path / "later.json"
    path.write_text(
        json.dumps([{"decisions": [_approve(b["send_email"]), _approve(b["write_file"])]}])
    )
    ran = eg("resume", "--state-dir", str(state), "--thread", THREAD, "--decisions", str(path))
    assert ran.code == 2, ran.stderr[-2000:]
    assert "answers none of the reviews pending" in ran.stderr
    assert "create_ticket" in ran.stderr
    assert world(state)["tickets"] == []
