"""Answers the graph refuses, verdicts that do not fit, and possible duplicates under --approve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import eg, pin, world, write_script


def _decisions(path: Path, value: Any) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_refused_edits_exit_2_with_the_error_and_pending_shows_it(tmp_path: Path) -> None:
    """An edit escaping the workspace, then one renaming the tool: exit 2 each, error shown.

    Nothing is written; ``pending`` shows the refusal; ``--approve all`` still finishes.
    """
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    script = write_script(
        tmp_path / "one.json",
        [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}],
    )
    waiting = eg("run", "write", "--model", f"scripted:{script}", *sd, "--thread", "e")
    assert waiting.code == 4, waiting.stderr
    escape = _decisions(
        tmp_path / "escape.json",
        pin(
            state,
            "e",
            {
                "decisions": [
                    {
                        "type": "edit",
                        "edited_action": {"args": {"path": "../x.txt", "content": "y"}},
                    }
                ]
            },
        ),
    )
    ran = eg("resume", *sd, "--thread", "e", "--decisions", escape, "--json")
    assert ran.code == 2, ran.stderr
    assert "edited arguments refused" in ran.stderr and "paths may not leave" in ran.stderr
    out = ran.json
    assert out["exit_code"] == 2
    assert out["status"] == "waiting_review"
    assert "edited arguments refused" in out["error"]
    assert out["error_type"] == "DecisionError"
    assert world(state)["files"] == {}
    assert not (tmp_path / "x.txt").exists()

    shown = eg("pending", *sd)
    assert shown.code == 0
    assert "refused" in shown.stdout and "paths may not leave" in " ".join(shown.stdout.split())
    listed = eg("pending", *sd, "--json").json["threads"][0]["interrupts"][0]
    assert "edited arguments refused" in listed["error"]

    rename = _decisions(
        tmp_path / "rename.json",
        pin(
            state,
            "e",
            {
                "decisions": [
                    {
                        "type": "edit",
                        "edited_action": {"name": "run_shell", "args": {"command": "true"}},
                    }
                ]
            },
        ),
    )
    again = eg("resume", *sd, "--thread", "e", "--decisions", rename)
    assert again.code == 2, again.stderr
    assert "may not change the tool" in again.stderr
    assert world(state)["files"] == {}

    done = eg("resume", *sd, "--thread", "e", "--approve", "all", "--json")
    assert done.code == 0, done.stderr
    assert world(state)["files"] == {"a.txt": b"alpha\n"}


def test_verdicts_must_name_known_operations_and_answer_every_pending_one(tmp_path: Path) -> None:
    """Two parked unsafe calls: a verdict for an unknown op exits 2 and changes nothing.

    A verdict for one of the two settles that one only; the other's then ends the thread.
    """
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    script = write_script(
        tmp_path / "two.json",
        [
            {"name": "run_shell", "args": {"command": "sleep 2; echo a >> a.txt"}},
            {"name": "run_shell", "args": {"command": "sleep 2; echo b >> b.txt"}},
        ],
    )
    crashed = eg(
        "run", "two", "--model", f"scripted:{script}", *sd, "--thread", "r",
        "--approve", "all", "--crash-at", "AFTER_IN_FLIGHT_COMMIT#2",
    )  # fmt: skip
    assert crashed.code == 137, crashed.stderr
    parked = eg("resume", *sd, "--thread", "r", "--json")
    assert parked.code == 3, parked.stderr
    first, second = sorted(i["value"]["operation_id"] for i in parked.json["interrupts"])

    nope = _decisions(tmp_path / "nope.json", {"verdicts": {"nope": {"verdict": "failed"}}})
    unknown = eg("resume", *sd, "--thread", "r", "--decisions", nope, "--json")
    assert unknown.code == 2, unknown.stderr
    assert "unknown operation 'nope'" in unknown.stderr
    assert unknown.json["error_type"] == "DecisionError"

    # Each pending interrupt is answered on its own: a verdict for one of the
    # two settles that one and leaves the other pending (exit 3).
    half = _decisions(tmp_path / "half.json", {"verdicts": {first: {"verdict": "failed"}}})
    partial = eg("resume", *sd, "--thread", "r", "--decisions", half, "--json")
    assert partial.code == 3, partial.stderr
    assert f"no verdict for {second}" in " ".join(partial.stderr.split())
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        states = {op.operation_id: op.state.value for op in ledger.list(thread_id="r")}
        assert states == {first: "FAILED", second: "NEEDS_RECONCILIATION"}
    finally:
        ledger.close()

    both = _decisions(tmp_path / "both.json", {"verdicts": {second: {"verdict": "failed"}}})
    done = eg("resume", *sd, "--thread", "r", "--decisions", both, "--json")
    assert done.code == 0, done.stderr
    assert [op["state"] for op in done.json["operations"]] == ["FAILED", "FAILED"]


def test_approve_all_leaves_a_possible_duplicate_for_a_person(tmp_path: Path) -> None:
    """The second identical write is a possible duplicate: --approve all stops (exit 4), says why.

    The file is written once; an explicit decision then approves the duplicate.
    """
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    call = {"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}
    script = tmp_path / "dup.json"
    script.write_text(
        json.dumps(
            {
                "name": "dup",
                "turns": [
                    {"say": "once", "tool_calls": [call]},
                    {"say": "twice", "tool_calls": [call]},
                ],
            }
        )
    )
    ran = eg(
        "run", "dup", "--model", f"scripted:{script}", *sd, "--thread", "d",
        "--approve", "all", "--json",
    )  # fmt: skip
    assert ran.code == 4, ran.stderr
    out = ran.json
    [first] = out["operations"]
    assert first["state"] == "SUCCEEDED"
    [interrupt] = out["interrupts"]
    [action] = interrupt["value"]["action_requests"]
    assert action["possible_duplicate_of"] == first["id"]
    [note] = [n for n in out["notes"] if "duplicate" in n]
    assert f"possible duplicate of {first['id']}" in note
    assert "approve it explicitly with --decisions or interactively" in note
    assert note in " ".join(ran.stderr.split())
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        assert [e.dst.value for e in ledger.events(thread_id="d") if e.dst] == [
            "PROPOSED",
            "APPROVED",
            "IN_FLIGHT",
            "SUCCEEDED",
        ]
    finally:
        ledger.close()

    approve = _decisions(
        tmp_path / "approve.json", pin(state, "d", {"decisions": [{"type": "approve"}]})
    )
    done = eg("resume", *sd, "--thread", "d", "--decisions", approve, "--json")
    assert done.code == 0, done.stderr
    assert [op["state"] for op in done.json["operations"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert world(state)["files"] == {"a.txt": b"alpha\n"}


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://%zz@/", 'invalid percent-encoded token: "%zz"'),
        (
            "postgresql://u:pa%zzss@127.0.0.1/db",
            'invalid percent-encoded token: "(part of the password)"',
        ),
        ("postgresql://127.0.0.1/db?bogus=1", 'invalid URI query parameter: "bogus"'),
        (
            "postgresql://u:pa%zzss@[::1:5432/db",  # urllib cannot split it; the raw text is read
            'invalid percent-encoded token: "(part of the password)"',
        ),
        (
            # an unescaped '@' and '/' in the password: libpq quotes from the bad
            # escape on, the password's tail included (a break test saw "rd%X@...")
            "postgresql://odd:p@ss:w/rd%X@127.0.0.1:55433/agents",
            'invalid percent-encoded token: "(part of the password)"',
        ),
    ],
)
def test_a_store_url_libpq_cannot_parse_is_one_line_and_writes_nothing(
    tmp_path: Path, url: str, said: str
) -> None:
    """A URL libpq refuses to parse: exit 2, libpq's reason, no traceback, no password, no marker.

    It used to end in a ``ProgrammingError`` traceback (exit 1).
    """
    pytest.importorskip("psycopg")
    state = tmp_path / "state"
    state.mkdir()  # an empty directory, as `mktemp -d` leaves it
    script = write_script(tmp_path / "one.json", [{"name": "write_file", "args": {"path": "a"}}])
    run = ["run", "hi", "--model", f"scripted:{script}", "--approve", "all"]
    for command in (["demo", "--approve", "all"], run):
        ran = eg(*command, "--state-dir", str(state), "--store", url)
        assert ran.code == 2, ran.stderr
        assert f"not a usable PostgreSQL URL: {said}" in ran.stderr
        secret = url.partition("://")[2].rpartition("@")[0].partition(":")[2]
        shown = ran.stderr + ran.stdout
        assert "Traceback" not in ran.stderr
        assert not secret or (secret not in shown and secret[-4:] not in shown)
        assert list(state.iterdir()) == []


def test_a_read_only_command_on_an_empty_directory_writes_nothing(tmp_path: Path) -> None:
    """threads / pending / ledger list on an empty directory: exit 2 and it stays empty.

    They used to make it a SQLite state directory (marker and workspace),
    which a later ``--store`` would then have had to accept as such.
    """
    state = tmp_path / "empty"
    state.mkdir()
    for command in (["threads"], ["pending"], ["ledger", "list"]):
        ran = eg(*command, "--state-dir", str(state))
        assert ran.code == 2, (command, ran.stdout, ran.stderr)
        assert "is not an effectgate state directory yet (empty)" in ran.stderr
        assert list(state.iterdir()) == [], command


def test_a_libpq_key_value_store_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """``--store 'host=... password=...'``: refused (a URL is expected), the password not said."""
    ran = eg(
        "demo", "--state-dir", str(tmp_path / "s"), "--store",
        "host=127.0.0.1 user=u password=pa55word dbname=x",
    )  # fmt: skip
    assert ran.code == 2 and "expected a postgresql:// URL" in ran.stderr
    assert "pa55word" not in ran.stderr + ran.stdout and "Traceback" not in ran.stderr


@pytest.mark.parametrize("ttl", ["inf", "1e308", "1e12"])
def test_a_worker_lease_ttl_beyond_a_day_is_refused_up_front(tmp_path: Path, ttl: str) -> None:
    """A lease TTL the clock arithmetic cannot hold used to pass and crash at the first thread."""
    ran = eg("worker", "--state-dir", str(tmp_path / "s"), "--until-idle", "--lease-ttl", ttl)
    assert ran.code == 2 and "--lease-ttl" in ran.stderr and "Traceback" not in ran.stderr
