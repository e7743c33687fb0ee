"""Review without a terminal: waiting for review, decisions files, --approve none, pending."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import eg, pin, world


def test_no_tty_no_flags_waits_for_review_then_decisions_file_finishes(tmp_path: Path) -> None:
    """Exit 4 with the review payload; ``pending`` shows it; a decisions list answers both reviews.

    The second review is answered with an edit, so the note's content is the edited one.
    """
    state = tmp_path / "state"
    waiting = eg("demo", "--state-dir", str(state), "--thread", "w", "--json")
    assert waiting.code == 4, waiting.stderr
    out = waiting.json
    assert (out["status"], out["exit_code"]) == ("waiting_review", 4)
    [interrupt] = out["interrupts"]
    [action] = interrupt["value"]["action_requests"]
    assert (action["name"], action["operation_id"]) == ("create_ticket", "ticket:orders-error-rate")
    assert action["effect_kind"] == "keyed"
    assert out["operations"] == []
    assert world(state)["tickets"] == []

    pending = eg("pending", "--state-dir", str(state), "--json")
    assert pending.code == 0
    assert [t["thread_id"] for t in pending.json["threads"]] == ["w"]
    assert pending.json["threads"][0]["interrupts"][0]["id"] == interrupt["id"]

    # Each answer names the review it answers (its interrupt id, as printed
    # by ``pending --json``); the next review is answered once it is shown.
    first = tmp_path / "first.json"
    first.write_text(
        json.dumps(
            [
                {
                    "decisions": [{"type": "approve"}],
                    "reviewer": "dana",
                    "interrupt_id": interrupt["id"],
                }
            ]
        )
    )
    half = eg("resume", "--state-dir", str(state), "--thread", "w", "--decisions", str(first))
    assert half.code == 4, half.stderr
    decisions = tmp_path / "decisions.json"
    decisions.write_text(
        json.dumps(
            pin(
                state,
                "w",
                {
                    "decisions": [
                        {"type": "reject", "message": "no mail at night"},
                        {
                            "type": "edit",
                            "edited_action": {
                                "args": {
                                    "path": "incidents/orders-error-rate.md",
                                    "content": "edited note\n",
                                }
                            },
                        },
                    ]
                },
            )
        )
    )
    done = eg(
        "resume",
        "--state-dir",
        str(state),
        "--thread",
        "w",
        "--decisions",
        str(decisions),
        "--json",
    )
    assert done.code == 0, done.stderr
    states = {op["tool"]: op["state"] for op in done.json["operations"]}
    assert states == {
        "create_ticket": "SUCCEEDED",
        "send_email": "REJECTED",
        "write_file": "SUCCEEDED",
    }
    seen = world(state)
    assert len(seen["tickets"]) == 1
    assert seen["mails"] == []
    assert seen["files"] == {"incidents/orders-error-rate.md": b"edited note\n"}
    assert eg("pending", "--state-dir", str(state), "--json").json["threads"] == []


def test_approve_none_rejects_and_nothing_happens(tmp_path: Path) -> None:
    """``--approve none`` rejects the ticket; the model stops; no external write at all.

    The thread is done (exit 0), but the output says an operation did not take
    effect, and ``--json`` counts operations by state.
    """
    state = tmp_path / "state"
    ran = eg("demo", "--state-dir", str(state), "--thread", "n", "--approve", "none", "--json")
    assert ran.code == 0, ran.stderr
    assert [(op["tool"], op["state"], op["attempt"]) for op in ran.json["operations"]] == [
        ("create_ticket", "REJECTED", 0)
    ]
    assert ran.json["state_counts"] == {"REJECTED": 1}
    seen = world(state)
    assert (seen["tickets"], seen["mails"], seen["files"]) == ([], [], {})
    human = eg("resume", "--state-dir", str(state), "--thread", "n")
    assert human.code == 0, human.stderr
    flat = " ".join(human.stdout.split())
    assert "1 operation did not take effect: create_ticket (ticket:orders-error-rate) REJECTED" in (
        flat
    )
    assert "done (exit code 0)" in flat


def test_interrupted_decisions_list_stops_waiting(tmp_path: Path) -> None:
    """A file answering only the first review leaves the thread waiting for the second (4)."""
    state = tmp_path / "state"
    shown = eg("demo", "--state-dir", str(state), "--thread", "demo-1")
    assert shown.code == 4, shown.stderr
    decisions = tmp_path / "one.json"
    decisions.write_text(json.dumps(pin(state, "demo-1", {"decisions": [{"type": "approve"}]})))
    ran = eg("resume", "--state-dir", str(state), "--thread", "demo-1", "--decisions",
             str(decisions), "--json")  # fmt: skip
    assert ran.code == 4, ran.stderr
    [interrupt] = ran.json["interrupts"]
    names = [a["name"] for a in interrupt["value"]["action_requests"]]
    assert sorted(names) == ["send_email", "write_file"]
    assert len(world(state)["tickets"]) == 1
