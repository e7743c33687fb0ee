"""A decisions file's ``answers`` map answers a review as ``Agent.resume(answers=...)`` does.

``{"answers": {review_id: {"decisions": [...]}}}`` used to be read only for a
tool's question: a review answered that way was dropped silently (exit 4,
nothing recorded). And an ``answers`` key that named nothing pending was
dropped too, so a process that lost a race to answer a question was never
told. Now the review takes the answer, a bad shape is refused in one line,
and an answer to an interrupt that is not pending is refused, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.conftest import eg, world


def _waiting(tmp_path: Path) -> tuple[Path, str]:
    state = tmp_path / "state"
    waiting = eg("demo", "--state-dir", str(state), "--thread", "w", "--json")
    assert waiting.code == 4, waiting.stderr
    [interrupt] = waiting.json["interrupts"]
    return state, str(interrupt["id"])


def _resume(state: Path, tmp_path: Path, body: Any) -> Any:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    return eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(path))


def test_a_review_answered_in_the_answers_map_is_applied(tmp_path: Path) -> None:
    state, review = _waiting(tmp_path)
    no = {"decisions": [{"type": "reject", "message": "not now"}]}
    ran = _resume(state, tmp_path, {"answers": {review: no}})
    assert ran.code in (0, 4), ran.stdout + ran.stderr
    assert world(state)["tickets"] == []  # rejected: no ticket
    listed = eg("ledger", "list", "--state-dir", str(state), "--json").json
    [ticket] = [o for o in listed["operations"] if o["tool"] == "create_ticket"]
    assert ticket["state"] == "REJECTED"
    pending = eg("pending", "--state-dir", str(state), "--json").json
    waiting = [i["id"] for t in pending["threads"] for i in t["interrupts"]]
    assert review not in waiting


def test_a_bad_review_answer_in_the_answers_map_is_refused_in_one_line(tmp_path: Path) -> None:
    state, review = _waiting(tmp_path)
    ran = _resume(state, tmp_path, {"answers": {review: "yes"}})
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    assert f"review {review}" in ran.stderr and '{"decisions": [...]}' in ran.stderr
    assert world(state)["tickets"] == []
    still = eg("pending", "--state-dir", str(state), "--json").json
    assert still["threads"][0]["interrupts"][0]["id"] == review


def test_an_answer_to_nothing_pending_is_refused(tmp_path: Path) -> None:
    state, _ = _waiting(tmp_path)
    ran = _resume(state, tmp_path, {"answers": {"0123456789abcdef": "late"}})
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "not pending" in ran.stderr and "Traceback" not in ran.stderr
    assert world(state)["tickets"] == []


def test_a_key_named_twice_refuses_the_file(tmp_path: Path) -> None:
    """JSON keeps the last of two equal keys; a person's file is refused instead."""
    state, review = _waiting(tmp_path)
    no = '{"decisions": [{"type": "reject", "message": "no"}]}'
    yes = '{"decisions": [{"type": "approve"}]}'
    path = tmp_path / "twice.json"
    path.write_text(f'{{"answers": {{"{review}": {no}, "{review}": {yes}}}}}', encoding="utf-8")
    ran = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(path))
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "appears twice" in ran.stderr and "Traceback" not in ran.stderr
    assert world(state)["tickets"] == []


def test_an_answer_naming_another_review_inside_the_map_is_refused(tmp_path: Path) -> None:
    state, review = _waiting(tmp_path)
    other = {"interrupt_id": "deadbeef", "decisions": [{"type": "approve"}]}
    ran = _resume(state, tmp_path, {"answers": {review: other}})
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "names another review" in ran.stderr
    assert world(state)["tickets"] == []
