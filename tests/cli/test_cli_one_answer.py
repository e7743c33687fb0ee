"""A decisions file answers each review, call, operation and question once.

Two different answers to one review in one file used to let the last one win
silently (an approve ran although the same file rejected the call). The file
is refused as a whole, exit 2, before anything runs; the same answer twice is
fine. And a contradicting answer refused after the recorded decision ran in
the same command says so, never "nothing ran".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import eg, world


def _waiting_demo(tmp_path: Path) -> tuple[Path, str]:
    state, interrupt = _waiting(tmp_path)
    return state, str(interrupt["id"])


def _waiting(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    state = tmp_path / "state"
    waiting = eg("demo", "--state-dir", str(state), "--thread", "w", "--json")
    assert waiting.code == 4, waiting.stderr
    [interrupt] = waiting.json["interrupts"]
    return state, dict(interrupt)


def _notes(state: Path) -> list[dict[str, object]]:
    with SqliteLedger(state / "ledger.sqlite3") as ledger:
        return [e.detail for e in ledger.events() if "refused_answer" in e.detail]


def test_two_different_answers_to_one_review_refuse_the_file(tmp_path: Path) -> None:
    state, review = _waiting_demo(tmp_path)
    both = tmp_path / "both.json"
    both.write_text(
        json.dumps(
            [
                {"interrupt_id": review, "decisions": [{"type": "reject", "message": "no"}]},
                {"interrupt_id": review, "decisions": [{"type": "approve"}]},
            ]
        )
    )
    ran = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(both))
    assert ran.code == 2, ran.stdout + ran.stderr
    [line] = [x for x in ran.stderr.splitlines() if "two different answers" in x]
    assert f"review {review}" in line
    assert "entry 0 gives reject ('no'), entry 1 gives approve" in line
    assert "Traceback" not in ran.stderr
    assert world(state)["tickets"] == []  # nothing ran
    pending = eg("pending", "--state-dir", str(state), "--json").json
    assert pending["threads"][0]["interrupts"][0]["id"] == review  # still waits

    # the same answer twice is one answer
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps([{"interrupt_id": review, "decisions": [{"type": "approve"}]}] * 2))
    ok = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(twice))
    assert ok.code == 4, ok.stdout + ok.stderr  # the next review waits
    assert len(world(state)["tickets"]) == 1


def test_two_different_answers_for_one_call_or_operation_refuse_the_file(tmp_path: Path) -> None:
    state, interrupt = _waiting(tmp_path)
    [action] = interrupt["value"]["action_requests"]
    call = {"operation_id": action["operation_id"], "intent_hash": action["intent_hash"]}
    by_call = tmp_path / "by_call.json"
    by_call.write_text(
        json.dumps(
            [
                {"decisions": [{**call, "type": "approve"}]},
                {"decisions": [{**call, "type": "reject", "message": "no"}]},
            ]
        )
    )
    ran = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(by_call))
    assert ran.code == 2 and "two different answers for call ticket:orders-error-rate" in (
        ran.stderr
    ), ran.stderr
    verdicts = tmp_path / "verdicts.json"
    verdicts.write_text(
        json.dumps(
            [
                {"verdicts": {"op:1": {"verdict": "failed"}}},
                {"verdicts": {"op:1": {"verdict": "succeeded", "reference": "R-1"}}},
            ]
        )
    )
    ran = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(verdicts))
    assert ran.code == 2, ran.stderr
    assert (
        "two different answers for operation op:1: entry 0 gives verdict failed, entry 1 gives "
        "verdict succeeded (reference R-1)"
    ) in ran.stderr
    assert world(state)["tickets"] == []


def test_late_reject_after_the_recorded_approve_ran_does_not_say_nothing_ran(
    tmp_path: Path,
) -> None:
    state, review = _waiting_demo(tmp_path)
    approve = tmp_path / "approve.json"
    approve.write_text(json.dumps({"interrupt_id": review, "decisions": [{"type": "approve"}]}))
    crashed = eg(
        "resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(approve),
        "--crash-at", "AFTER_REVIEW_RECORDED",
    )  # fmt: skip
    assert crashed.code == 137, crashed.stderr
    assert world(state)["tickets"] == []
    reject = tmp_path / "reject.json"
    reject.write_text(
        json.dumps({"interrupt_id": review, "decisions": [{"type": "reject", "message": "no"}]})
    )
    ran = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(reject))
    # the recorded approval stood and ran in this command: the ticket exists
    assert len(world(state)["tickets"]) == 1
    assert ran.code == 2, ran.stdout + ran.stderr
    flat = " ".join(ran.stderr.split())
    assert "nothing ran" not in flat
    assert "already decided: approve" in flat and "(this answer: reject)" in flat
    assert "ticket:orders-error-rate is now succeeded" in flat
    assert "the recorded decision stands" in flat
    assert [n["refused_answer"]["decision"] for n in _notes(state)] == ["reject"]  # type: ignore[index]
