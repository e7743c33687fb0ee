"""After a crash the CLI prints the resume command, IN_FLIGHT in pending, the recovery path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate.testing.oracle import world
from tests.cli.conftest import eg

pytestmark = pytest.mark.crash


def test_kill_after_the_ticket_was_created_then_pending_resume_and_a_second_demo(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    crash = "AFTER_EXTERNAL_COMMIT@create_ticket"
    killed = eg("demo", "--thread", "d1", "--approve", "all", "--crash-at", crash, *sd)
    assert killed.code == 137, killed.stderr
    assert f"continue with: effectgate resume --thread d1 --state-dir {state}" in killed.stderr
    assert world(state).tickets == 1  # the ticket service committed before the kill

    pending = eg("pending", *sd, "--json")
    assert pending.code == 0, pending.stderr
    (op,) = json.loads(pending.stdout)["operations"]
    assert (op["tool"], op["state"], op["attempt"]) == ("create_ticket", "IN_FLIGHT", 1)
    shown = eg("pending", *sd)
    assert "nothing is waiting" not in shown.stdout and "IN_FLIGHT" in shown.stdout

    resumed = eg("resume", "--thread", "d1", "--approve", "all", *sd)
    assert resumed.code == 0, resumed.stderr
    text = " ".join(resumed.stdout.split())  # rich wraps long lines
    assert "recovered create_ticket (ticket:orders-error-rate, thread d1): IN_FLIGHT -> " in text
    assert "UNKNOWN -> looked up by idempotency key (GET " in text
    assert "-> SUCCEEDED (TICKET-1), attempt 1" in text
    assert world(state).tickets == 1

    second = eg("demo", "--thread", "d2", "--approve", "all", *sd)
    text = " ".join(second.stdout.split())
    assert "reused create_ticket (ticket:orders-error-rate, thread d1)" in text, text
    assert "from attempt 1 for thread d2; not run again" in text, text
    assert "recovered" not in text
    assert world(state).tickets == 1


def test_a_directory_that_is_not_ours_is_not_written_by_the_recovery_report(
    tmp_path: Path,
) -> None:
    """The recovery lines read the ledger only of a state directory; a stray file stays empty."""
    stray = tmp_path / "project"
    stray.mkdir()
    (stray / "ledger.sqlite3").write_bytes(b"")
    for args in (
        ["run", "x", "--thread", "t", "--model", "scripted:incident", "--with-services"],
        ["resume", "--thread", "t"],
        ["demo", "--thread", "t"],
    ):
        ran = eg(*args, "--state-dir", str(stray))
        assert ran.code == 2 and "not an effectgate state directory" in ran.stderr, ran.stderr
    assert sorted(p.name for p in stray.iterdir()) == ["ledger.sqlite3"]
    assert (stray / "ledger.sqlite3").read_bytes() == b""
