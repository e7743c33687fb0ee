"""``effectgate prune`` on the command line: dry run, tombstone shown by ``threads``, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.cli.conftest import Ran, eg, finished_demo

__all__ = ["finished_demo"]  # the fixture, shared with tests/cli


def _copy(finished: tuple[Path, Ran], tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(finished[0], state)
    return state


def test_dry_run_then_delete_then_threads_says_deleted_and_resume_refuses(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """The dry run changes no byte; the real run deletes; threads and resume say so."""
    state = _copy(finished_demo, tmp_path)
    before = (state / "checkpoints.sqlite3").read_bytes()
    dry = eg("prune", "--state-dir", str(state), "--thread", "demo-1", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert dry.json["threads_deleted"] == ["demo-1"] and dry.json["dry_run"] is True
    assert dry.json["payload_bytes"] > 0
    assert (state / "checkpoints.sqlite3").read_bytes() == before
    ran = eg(
        "prune", "--state-dir", str(state), "--thread", "demo-1", "--reason", "done with it",
        "--reviewer", "ops", "--json",
    )  # fmt: skip
    assert ran.code == 0, ran.stderr
    files = ran.json["files"]["checkpoints"]
    assert files["after"] < files["before"]
    listed = eg("threads", "--state-dir", str(state), "--json")
    (thread,) = listed.json["threads"]
    assert thread["status"].startswith("deleted (") and "ops: done with it" in thread["status"]
    refused = eg("resume", "--state-dir", str(state), "--thread", "demo-1")
    assert refused.code == 2
    assert "was deleted" in refused.stderr and "Traceback" not in refused.stderr


def test_bad_duration_is_bad_input_and_changes_nothing(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """``--finished-older-than 3x``: exit 2, one line naming the flag, no file touched."""
    state = _copy(finished_demo, tmp_path)
    before = {p.name: p.read_bytes() for p in state.glob("*.sqlite3")}
    ran = eg("prune", "--state-dir", str(state), "--finished-older-than", "3x")
    assert ran.code == 2
    assert "--finished-older-than" in ran.stderr and "Traceback" not in ran.stderr
    assert {p.name: p.read_bytes() for p in state.glob("*.sqlite3")} == before


def test_unknown_thread_is_bad_input_and_nothing_is_pruned(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """``--thread nope`` exits 2 naming it; the demo thread is not deleted either."""
    state = _copy(finished_demo, tmp_path)
    ran = eg("prune", "--state-dir", str(state), "--thread", "demo-1", "--thread", "nope")
    assert ran.code == 2
    assert "unknown thread 'nope'" in ran.stderr and "Traceback" not in ran.stderr
    listed = eg("threads", "--state-dir", str(state), "--json")
    assert [t["status"] for t in listed.json["threads"]] == ["done"]


def test_a_duration_past_any_date_is_bad_input(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """An age so long that ``now - age`` is no date: exit 2 naming the flag, no traceback."""
    state = _copy(finished_demo, tmp_path)
    for flag, value in (
        ("--finished-older-than", "99999999999d"),
        ("--operations-after", "1e300w"),
    ):
        ran = eg("prune", "--state-dir", str(state), flag, value, "--dry-run")
        assert ran.code == 2, ran.stderr
        assert flag in ran.stderr and "Traceback" not in ran.stderr


def test_a_new_run_onto_a_compacted_operation_is_left_for_a_person(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    """The demo's operations are compacted; the demo runs again in a new thread.

    Its ticket call maps to the same business key, whose operation is now a
    tombstone: ``--approve all`` leaves it for a person (exit 4), saying the
    operation was compacted, when, with its intent hash and receipt; the
    review screen and ``pending`` (text and ``--json``) carry the same flag.
    """
    state = _copy(finished_demo, tmp_path)
    sd = ("--state-dir", str(state))
    shown = eg("ledger", "list", *sd, "--json")
    assert shown.code == 0, shown.stderr
    (ticket,) = [op for op in shown.json["operations"] if op["tool"] == "create_ticket"]
    pruned = eg("prune", *sd, "--operations-after", "0s", "--tombstones-after", "none", "--json")
    assert pruned.code == 0, pruned.stderr
    assert pruned.json["operations_compacted"] == 3
    again = eg("demo", *sd, "--thread", "demo-2", "--approve", "all")
    assert again.code == 4, again.stderr
    said = " ".join(again.stderr.split())
    assert f"operation {ticket['id']} was compacted on " in said
    assert f"intent hash {ticket['intent_hash']}" in said
    assert "left for review" in said
    pending = eg("pending", *sd, "--json")
    assert pending.code == 0, pending.stderr
    (waiting,) = pending.json["threads"]
    (item,) = waiting["interrupts"]
    (action, *_) = item["value"]["action_requests"]
    flag = action["compacted_operation"]
    assert (flag["operation_id"], flag["intent_hash"]) == (ticket["id"], ticket["intent_hash"])
    assert flag["reference"] == ticket["reference"] == "TICKET-1"
    text = eg("pending", *sd)
    assert f"operation {ticket['id']} was compacted on " in " ".join(text.stdout.split())


def test_the_review_screen_shows_a_compacted_operation() -> None:
    """The interactive review panel warns about a call whose operation id was compacted."""
    import io

    from effectgate.cli._render import SafeConsole
    from effectgate.cli._review_ui import action_panel

    message = "operation ticket:k was compacted on 2026-01-01T00:00:00+00:00; it had ..."
    action = {
        "name": "create_ticket",
        "args": {"title": "t"},
        "effect_kind": "keyed",
        "operation_id": "ticket:k",
        "intent_hash": "0" * 64,
        "tool_call_id": "c1",
        "preview": "",
        "compacted_operation": {"operation_id": "ticket:k", "message": message},
    }
    screen = io.StringIO()
    SafeConsole(file=screen, width=400, color_system=None).print(action_panel(action, 1, 1))
    shown = " ".join(screen.getvalue().replace("│", " ").split())
    assert f"COMPACTED: {message}" in shown


def test_prune_on_a_postgresql_state(tmp_path: Path, postgres_url: str) -> None:
    """A state directory whose store is PostgreSQL: dry run, delete, threads says deleted.

    The sizes are the tables' (``pg_total_relation_size``), and the run ends
    with a VACUUM.
    """
    state = str(tmp_path / "state")
    sd = ("--state-dir", state)
    ran = eg("demo", *sd, "--store", postgres_url, "--thread", "demo-1", "--approve", "all")
    assert ran.code == 0, ran.stderr
    dry = eg("prune", *sd, "--thread", "demo-1", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert dry.json["threads_deleted"] == ["demo-1"] and dry.json["payload_bytes"] > 0
    assert eg("threads", *sd, "--json").json["threads"][0]["status"] == "done"
    gone = eg("prune", *sd, "--thread", "demo-1", "--reason", "done with it", "--json")
    assert gone.code == 0, gone.stderr
    assert gone.json["checkpoints_removed"] == dry.json["checkpoints_removed"] > 0
    files = gone.json["files"]
    assert set(files) == {"checkpoints", "ledger"}
    # not smaller for sure: VACUUM keeps rows an open transaction elsewhere on the
    # server may still see (the library test covers the size bound)
    assert files["checkpoints"]["after"] <= files["checkpoints"]["before"]
    (thread,) = eg("threads", *sd, "--json").json["threads"]
    assert thread["status"].startswith("deleted (") and "done with it" in thread["status"]
    refused = eg("resume", *sd, "--thread", "demo-1")
    assert refused.code == 2
    assert "was deleted" in refused.stderr and "Traceback" not in refused.stderr


def test_a_blank_thread_id_is_refused_as_bad_input(
    finished_demo: tuple[Path, Ran], tmp_path: Path
) -> None:
    state = _copy(finished_demo, tmp_path)
    for blank in ("", " "):
        ran = eg("prune", "--state-dir", str(state), "--thread", blank)
        assert ran.code == 2, (ran.stdout, ran.stderr)
        assert "may not be empty, blank" in " ".join(ran.stderr.split())
    listed = eg("threads", "--state-dir", str(state), "--json")
    assert [t["status"] for t in listed.json["threads"]] == ["done"]
