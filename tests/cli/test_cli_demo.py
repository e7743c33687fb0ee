"""``effectgate demo`` end to end, and kill-at-every-seam then ``effectgate resume``."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.testing import Failpoint
from tests.cli.conftest import EXPECTED_NOTE, NOTE, Ran, eg, world


def _assert_one_of_each(state: Path) -> None:
    seen = world(state)
    assert len(seen["tickets"]) == 1
    assert seen["tickets"][0]["idempotency_key"] == "ticket:orders-error-rate"
    assert len(seen["mails"]) == 1
    assert seen["mails"][0]["rcpt_tos"] == ["oncall@example.com"]
    assert "TICKET-1" in seen["mails"][0]["subject"]
    assert seen["files"] == {NOTE.as_posix(): EXPECTED_NOTE}


def test_demo_approve_all_json_from_fresh_state_dir(finished_demo: tuple[Path, Ran]) -> None:
    """One ticket, one mail, the note's exact bytes; every operation SUCCEEDED at attempt 1."""
    state, ran = finished_demo
    out = ran.json
    assert out["thread_id"] == "demo-1"
    assert (out["status"], out["exit_code"]) == ("done", 0)
    assert out["interrupts"] == []
    ops = {op["tool"]: op for op in out["operations"]}
    assert sorted(ops) == ["create_ticket", "send_email", "write_file"]
    assert {(op["state"], op["attempt"]) for op in ops.values()} == {("SUCCEEDED", 1)}
    assert ops["create_ticket"]["reference"] == "TICKET-1"
    assert ops["send_email"]["reference"] == world(state)["mails"][0]["message_id"]
    assert out["external"]["tickets"] == 1
    assert out["external"]["mails_delivered"] == 1
    assert out["external"]["files"][0]["path"] == NOTE.as_posix()
    assert out["external"]["files"][0]["bytes"] == len(EXPECTED_NOTE)
    assert "TICKET-1" in out["final_message"]
    _assert_one_of_each(state)


@pytest.mark.crash
# MID_MIGRATION is a PostgreSQL start-up seam: the demo (SQLite) never passes it
# (tests/postgres/test_rolling_upgrade.py kills a start-up there)
@pytest.mark.parametrize("seam", [fp for fp in Failpoint if fp is not Failpoint.MID_MIGRATION])
def test_kill_at_seam_then_resume_repeats_nothing(tmp_path: Path, seam: Failpoint) -> None:
    """Killed at SEAM (exit 137), ``resume`` finishes: still one ticket, one mail, one note."""
    state = tmp_path / "state"
    crashed = eg(
        "demo",
        "--state-dir",
        str(state),
        "--thread",
        "t1",
        "--approve",
        "all",
        "--json",
        "--crash-at",
        seam.value,
    )
    assert crashed.code == 137, crashed.stderr
    assert f"failpoint {seam.value} reached" in crashed.stderr
    assert crashed.stdout == ""  # killed before the summary: nothing half-printed
    resumed = eg(
        "resume", "--state-dir", str(state), "--thread", "t1", "--approve", "all", "--json"
    )
    assert resumed.code == 0, resumed.stderr
    out = resumed.json
    assert out["status"] == "done"
    assert {op["state"] for op in out["operations"]} == {"SUCCEEDED"}
    assert len(out["operations"]) == 3
    assert (out["external"]["tickets"], out["external"]["mails_delivered"]) == (1, 1)
    _assert_one_of_each(state)


def test_demo_after_services_ran_without_a_stored_rate_still_handles_the_incident(
    tmp_path: Path,
) -> None:
    """Service files exist but no error rate was ever stored: the demo still starts at 0.12.

    Found by a fresh user: a first ``demo`` killed after the services created
    their files but before the rate was stored (or an earlier ``effectgate
    services``) left a world reporting 0.0, and every later ``demo`` did nothing.
    """
    from effectgate import StateDir
    from effectgate.demo import DemoServices

    state = tmp_path / "state"
    sd = StateDir.open(state)
    with DemoServices(sd.services):
        pass  # the services' files now exist, with no error rate stored
    ran = eg("demo", "--state-dir", str(state), "--thread", "t1", "--approve", "all", "--json")
    assert ran.code == 0, ran.stderr
    _assert_one_of_each(state)


def test_a_second_demo_reuses_the_ticket_and_stops_at_the_possible_duplicate_mail(
    tmp_path: Path,
) -> None:
    """Same state dir, new thread: no second ticket, the mail waits for a person, and the
    summary lists the first thread's ticket operation as one this thread met by its key."""
    state = str(tmp_path / "state")
    assert eg("demo", "--approve", "all", "--state-dir", state, "--thread", "d1").code == 0
    again = eg("demo", "--approve", "all", "--state-dir", state, "--thread", "d2")
    assert again.code == 4, again.stderr
    assert "possible duplicate of d1:" in " ".join(again.stderr.split())
    out = " ".join(again.stdout.split())
    assert "operations of other threads this thread met by business key" in out
    listed = eg("resume", "--state-dir", state, "--thread", "d2", "--json")
    assert listed.code == 4, listed.stderr
    shared = [(op["id"], op["thread_id"]) for op in listed.json["shared_operations"]]
    assert shared == [("ticket:orders-error-rate", "d1")]
    assert all(op["thread_id"] == "d2" for op in listed.json["operations"])
    counts = world(tmp_path / "state")
    assert (len(counts["tickets"]), len(counts["mails"])) == (1, 1)
