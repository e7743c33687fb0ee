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
