"""Bad input ends with a clear message, the right exit code, and nothing written."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import Ran, eg, pin, world


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _ledger_facts(state: Path) -> tuple[list[tuple[str, str, int]], int]:
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        ops = [(op.operation_id, op.state.value, op.attempt) for op in ledger.list()]
        return ops, len(ledger.events())
    finally:
        ledger.close()


def _checkpoints(state: Path) -> int:
    with sqlite3.connect(state / "checkpoints.sqlite3") as conn:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


def test_unknown_thread_is_bad_input(finished_demo: tuple[Path, Ran]) -> None:
    """``resume --thread nope`` exits 2 naming the thread; the JSON error says so too."""
    state, _ = finished_demo
    ran = eg("resume", "--state-dir", str(state), "--thread", "nope", "--json")
    assert ran.code == 2
    assert "unknown thread 'nope'" in ran.stderr
    assert ran.json["exit_code"] == 2
    assert ran.json["error_type"] == "ConfigError"


def test_resume_of_finished_thread_says_done_and_writes_nothing(
    finished_demo: tuple[Path, Ran],
) -> None:
    """Resuming a done thread exits 0, prints the summary, changes no row, mail or file."""
    state, _ = finished_demo
    before = (_ledger_facts(state), _checkpoints(state), world(state))
    ran = eg("resume", "--state-dir", str(state), "--thread", "demo-1")
    assert ran.code == 0, ran.stderr
    assert "already done" in ran.stderr
    assert "done (exit code 0)" in ran.stdout
    assert "TICKET-1" in ran.stdout
    assert (_ledger_facts(state), _checkpoints(state), world(state)) == before


def test_malformed_decisions_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Invalid JSON or a wrong shape: exit 2 and the state directory is not even created."""
    state = tmp_path / "state"
    cases = {
        "broken.json": "{not json",
        "shape.json": json.dumps({"decisions": [{"type": "maybe"}]}),
        "keys.json": json.dumps({"decision": []}),
        "verdict.json": json.dumps({"verdicts": {"op": {"verdict": "succeeded"}}}),
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        ran = eg("demo", "--state-dir", str(state), "--decisions", str(path))
        assert ran.code == 2, (name, ran.stderr)
        assert "DecisionError" in ran.stderr and name in ran.stderr
    assert not state.exists()


def test_decisions_not_fitting_the_review_dispatch_nothing(tmp_path: Path) -> None:
    """Two decisions for one pending call: exit 2, no IN_FLIGHT/SUCCEEDED row, no ticket.

    The thread stays resumable: a later ``resume --approve all`` finishes it.
    """
    state = tmp_path / "state"
    shown = eg("demo", "--state-dir", str(state), "--thread", "t")
    assert shown.code == 4, shown.stderr
    path = tmp_path / "two.json"
    two = {"decisions": [{"type": "approve"}, {"type": "approve"}]}
    path.write_text(json.dumps(pin(state, "t", two)))
    ran = eg(
        "resume", "--state-dir", str(state), "--thread", "t", "--decisions", str(path), "--json"
    )
    assert ran.code == 2, ran.stderr
    assert "2 decision(s) for 1 pending call(s)" in ran.stderr
    assert ran.json["error_type"] == "DecisionError"
    ops, _ = _ledger_facts(state)
    assert [op for op in ops if op[1] in ("IN_FLIGHT", "SUCCEEDED")] == []
    assert world(state)["tickets"] == []
    again = eg("resume", "--state-dir", str(state), "--thread", "t", "--approve", "all", "--json")
    assert again.code == 0, again.stderr
    assert len(world(state)["tickets"]) == 1


def test_state_dir_that_is_not_ours_is_left_untouched(tmp_path: Path) -> None:
    """A non-empty directory without our marker: exit 2, not a byte added or changed."""
    other = tmp_path / "project"
    other.mkdir()
    (other / "precious.txt").write_bytes(b"keep me\n")
    (other / "sub").mkdir()
    (other / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _snapshot(other)
    for args in (
        ["demo", "--approve", "all"],
        ["run", "hi", "--model", "scripted:incident", "--with-services"],
        ["resume", "--thread", "t"],
        ["ledger", "list"],
        ["threads"],
    ):
        ran = eg(*args, "--state-dir", str(other))
        assert ran.code == 2, (args, ran.stderr)
        assert "not an effectgate state directory" in ran.stderr
    assert _snapshot(other) == before
    assert sorted(p.name for p in other.rglob("*")) == ["data.bin", "precious.txt", "sub"]


def test_unknown_failpoint_is_bad_input(tmp_path: Path) -> None:
    """``--crash-at`` must name a seam; the error lists them and nothing is created."""
    state = tmp_path / "state"
    ran = eg("demo", "--state-dir", str(state), "--approve", "all", "--crash-at", "NOPE")
    assert ran.code == 2
    assert "unknown failpoint 'NOPE'" in ran.stderr
    assert "AFTER_IN_FLIGHT_COMMIT" in ran.stderr
    assert not state.exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    """Unknown options, bad --approve values and exclusive flags are usage errors (2)."""
    state = str(tmp_path / "state")
    decisions = tmp_path / "d.json"
    decisions.write_text(json.dumps({"decisions": [{"type": "approve"}]}))
    assert eg("demo", "--state-dir", state, "--bogus").code == 2
    assert eg("demo", "--state-dir", state, "--approve", "some").code == 2
    both = eg("demo", "--state-dir", state, "--approve", "all", "--decisions", str(decisions))
    assert both.code == 2
    assert "exclude each other" in both.stderr
    assert eg("run", "task", "--model", "nonsense", "--state-dir", state).code == 2
    assert not Path(state).exists()


def test_failpoints_lists_every_seam_one_per_line() -> None:
    """``effectgate failpoints`` prints each Failpoint name on its own line."""
    ran = eg("failpoints")
    assert ran.code == 0
    assert ran.stdout.splitlines() == [
        "AFTER_REVIEW_RECORDED",
        "AFTER_IN_FLIGHT_COMMIT",
        "AFTER_EXTERNAL_COMMIT",
        "AFTER_LEDGER_RESULT",
        "MID_SUPERSTEP",
        "MID_MIGRATION",
    ]


def test_help_documents_exit_codes() -> None:
    """``--help`` lists the exit codes."""
    ran = eg("--help")
    assert ran.code == 0
    flat = " ".join(ran.stdout.split())
    for text in (
        "0 done",
        "2 bad input",
        "3 waiting for reconciliation",
        "4 waiting for review",
        "5 incomplete",
        "75 thread busy",
        "137 killed",
    ):
        assert text in flat


def test_failpoint_that_could_never_fire_is_bad_input_or_reported(tmp_path: Path) -> None:
    """``@tool`` on a seam not passed per tool is refused before anything is created;
    a seam the run never passed is reported instead of passing for a crash test."""
    state = tmp_path / "state"
    refused = eg(
        "demo", "--state-dir", str(state), "--approve", "all",
        "--crash-at", "AFTER_REVIEW_RECORDED@create_ticket",
    )  # fmt: skip
    assert refused.code == 2 and "is not reached per tool" in refused.stderr
    assert not state.exists()
    unknown_tool = eg(
        "demo", "--state-dir", str(state), "--approve", "all",
        "--crash-at", "AFTER_IN_FLIGHT_COMMIT@no_such_tool",
    )  # fmt: skip
    assert unknown_tool.code == 2 and "no side-effecting tool named 'no_such_tool'" in (
        unknown_tool.stderr
    )
    assert not state.exists()  # refused before the state directory or the services
    never = eg(
        "demo", "--state-dir", str(state), "--thread", "t2", "--approve", "all",
        "--crash-at", "MID_SUPERSTEP@create_ticket",
    )  # fmt: skip
    assert never.code == 0, never.stderr
    assert "that seam was never reached in this run" in never.stderr


def test_blank_task_is_bad_input(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ran = eg(
        "run", "  ", "--model", "scripted:incident", "--with-services", "--state-dir", str(state)
    )
    assert ran.code == 2 and "the task is empty" in ran.stderr
    if (state / "ledger.sqlite3").exists():
        with SqliteLedger(state / "ledger.sqlite3") as ledger:
            assert ledger.list_threads() == []  # refused before the thread was recorded


def test_decisions_file_for_a_finished_thread_exits_2(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """A reject that arrives after someone else finished the thread must not exit 0."""
    state, _ = finished_demo
    reject = tmp_path / "reject.json"
    reject.write_text(json.dumps({"decisions": [{"type": "reject", "message": "no"}]}))
    ran = eg("resume", "--state-dir", str(state), "--thread", "demo-1", "--decisions", str(reject))
    assert ran.code == 2, ran.stdout + ran.stderr
    assert "names no review" in ran.stderr
    assert len(world(state)["tickets"]) == 1


def test_damaged_checkpoint_file_is_a_clear_error_and_the_ledger_still_reads(
    tmp_path: Path,
) -> None:
    """Pages of checkpoints.sqlite3 overwritten: exit 1 with a message, no traceback.

    The ledger is a separate file and still lists what was done.
    """
    state = tmp_path / "state"
    first = eg("demo", "--approve", "all", "--state-dir", str(state), "--thread", "t1")
    assert first.code == 0, first.stderr
    path = state / "checkpoints.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    for page in range(4096, len(data), 4096):  # every b-tree page header after the first
        data[page : page + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    before = world(state)
    for args in (["threads"], ["pending", "--thread", "t1"], ["resume", "--thread", "t1"]):
        ran = eg(*args, "--state-dir", str(state), "--json")
        assert ran.code == 1, (args, ran.stderr)
        assert "a state file is damaged (SQLITE_CORRUPT" in ran.stderr, ran.stderr
        assert "Traceback" not in ran.stderr
        assert ran.json["error_type"] == "DatabaseError"
    assert world(state) == before  # nothing dispatched again
    listed = eg("ledger", "list", "--state-dir", str(state), "--json")
    assert listed.code == 0, listed.stderr
    done = {(op["tool"], op["state"]) for op in listed.json["operations"]}
    assert {("create_ticket", "SUCCEEDED"), ("send_email", "SUCCEEDED")} <= done


def test_checkpoint_file_with_a_damaged_header_exits_1_like_other_damage(
    tmp_path: Path,
) -> None:
    """The first page overwritten (SQLite: "not a database"): exit 1, as the docs say, not 2."""
    state = tmp_path / "state"
    assert eg("demo", "--approve", "all", "--state-dir", str(state), "--thread", "t1").code == 0
    path = state / "checkpoints.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[:100] = b"\xff" * 100
    path.write_bytes(bytes(data))
    ran = eg("resume", "--thread", "t1", "--state-dir", str(state), "--json")
    assert ran.code == 1, ran.stderr
    assert "a state file is damaged (SQLITE_NOTADB" in ran.stderr, ran.stderr
    assert ran.json["error_type"] == "DatabaseError"


def test_a_demo_service_that_cannot_start_is_a_clear_error_with_json(tmp_path: Path) -> None:
    """The mail sink's database held by another program: exit 1, one JSON error object."""
    state = tmp_path / "state"
    assert eg("demo", "--state-dir", str(state), "--thread", "r1").code == 4
    holder = sqlite3.connect(state / "services" / "mail.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        ran = eg(
            "resume", "--state-dir", str(state), "--thread", "r1", "--approve", "all", "--json"
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert ran.code == 1, ran.stderr
    assert ran.json["error_type"] == "ServiceStartError"
    assert "mail server exited" in ran.json["error"]
    assert "Traceback" not in ran.stderr


def test_usage_errors_with_json_print_one_error_object(tmp_path: Path) -> None:
    """With --json a usage error (unknown option, missing value or argument) is one JSON object.

    The human message stays on stderr; stdout has exactly the object other
    errors print: status ``error``, exit code 2, the message.
    """
    state = str(tmp_path / "state")
    cases = {
        "No such option": ("demo", "--state-dir", state, "--bogus", "--json"),
        "requires an argument": ("resume", "--json", "--state-dir", state, "--thread"),
        "Missing argument": ("run", "--json", "--state-dir", state),
        "Invalid value": ("demo", "--approve", "some", "--json"),
    }
    for says, argv in cases.items():
        ran = eg(*argv)
        assert ran.code == 2, (argv, ran.stderr)
        assert ran.json["status"] == "error" and ran.json["exit_code"] == 2, ran.stdout
        assert says in ran.json["error"] and ran.json["error_type"] == "UsageError"
        assert says in ran.stderr
    plain = eg("demo", "--state-dir", state, "--bogus")
    assert plain.code == 2 and plain.stdout == "" and "No such option" in plain.stderr
    assert not Path(state).exists()


def test_a_scripted_model_calling_demo_tools_without_services_is_refused(tmp_path: Path) -> None:
    """``run --model scripted:incident`` without ``--with-services`` says what is missing.

    Before, the run ended ``done`` (exit 0) after its first call failed as an
    unknown tool, and nothing said that ``--with-services`` brings the tools.
    """
    state = tmp_path / "state"
    ran = eg("run", "orders error rate", "--model", "scripted:incident", "--state-dir", str(state))
    assert ran.code == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert "get_error_rate, create_ticket, send_email" in lines[0]
    assert "--with-services" in lines[0]
    assert not state.exists()  # refused before the state directory was made

    script = tmp_path / "notes.yaml"  # a script that needs no service tool still runs
    script.write_text(
        "name: notes\nturns:\n  - say: listing\n    tool_calls:\n"
        "      - name: list_dir\n        args: {path: .}\n",
        encoding="utf-8",
    )
    ran = eg("run", "list", "--model", f"scripted:{script}", "--state-dir", str(state))
    assert ran.code == 0, ran.stderr
