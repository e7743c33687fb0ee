"""A state file that vanished or was emptied is refused, not recreated empty.

SQLite takes a missing or 0-byte file for a new database. Before, a ledger
emptied after a crash was recreated empty and the resumed thread sent its
mail a second time; an emptied checkpoint file started every thread over.
Each case kills a real ``effectgate`` process after the mail sink committed
the mail, damages the file, goes on in a new process, and counts the mails
in the sink's own storage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate.demo import read_mails
from tests.cli.conftest import eg

THREAD = "lost-1"
KILLED = 137
ERROR = 1


def _killed_after_the_mail(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    ran = eg(
        "demo",
        "--state-dir",
        str(state),
        "--thread",
        THREAD,
        "--approve",
        "all",
        "--crash-at",
        "AFTER_EXTERNAL_COMMIT@send_email",
    )
    assert ran.code == KILLED, ran.stderr[-2000:]
    assert len(read_mails(state / "services")) == 1
    return state


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _remove(path: Path) -> None:
    path.unlink()
    for side in path.parent.glob(path.name + "-*"):  # -wal, -shm, -journal
        side.unlink()


def _lose_wal(path: Path) -> None:
    """Only the ``-wal`` goes: after a kill it holds every write, the main file no table."""
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 0
    wal.unlink()


@pytest.mark.parametrize(
    "damage", [_empty, _remove, _lose_wal], ids=["emptied", "removed", "wal-lost"]
)
@pytest.mark.parametrize(
    ("name", "error"),
    [("ledger.sqlite3", "LedgerCorruptError"), ("checkpoints.sqlite3", "CheckpointCorruptError")],
)
def test_a_lost_state_file_is_refused_and_nothing_is_sent_again(
    tmp_path: Path, name: str, error: str, damage: Callable[[Path], None]
) -> None:
    state = _killed_after_the_mail(tmp_path)
    damage(state / name)

    for argv in (
        ("resume", "--thread", THREAD, "--approve", "all"),
        ("demo", "--thread", THREAD, "--approve", "all"),
        ("prune", "--keep-last", "1", "--dry-run"),  # was "has no threads yet" (exit 2)
    ):
        ran = eg(*argv, "--state-dir", str(state), "--json")
        assert ran.code == ERROR, ran.stderr[-2000:]
        assert "Traceback" not in ran.stdout + ran.stderr
        body = json.loads(ran.stdout)
        assert body["error_type"] == error, body
        assert name in body["error"] and "backup" in body["error"], body

    assert len(read_mails(state / "services")) == 1
    # nothing was recreated in the file's place
    if damage is not _lose_wal:
        assert not (state / name).is_file() or (state / name).stat().st_size == 0


def test_a_lost_ledger_is_refused_by_the_ledger_commands_too(tmp_path: Path) -> None:
    state = _killed_after_the_mail(tmp_path)
    _empty(state / "ledger.sqlite3")
    ran = eg("ledger", "list", "--state-dir", str(state))
    assert ran.code == ERROR, ran.stderr[-2000:]
    assert "Traceback" not in ran.stdout + ran.stderr
    assert "ledger.sqlite3 is empty (0 bytes)" in ran.stderr


def test_a_new_state_directory_and_a_fresh_start_are_not_refused(tmp_path: Path) -> None:
    """The guard applies only to files the directory has used: a crash before is not a loss."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "effectgate.json").write_text('{"format": 1}\n')  # marked, no files yet
    (state / "ledger.sqlite3").write_bytes(b"")  # created, then killed before its schema
    ran = eg("demo", "--state-dir", str(state), "--thread", "t", "--approve", "all")
    assert ran.code == 0, ran.stderr[-2000:]
    marker = json.loads((state / "effectgate.json").read_text())
    assert marker["files"] == ["checkpoints.sqlite3", "ledger.sqlite3"]
    assert len(read_mails(state / "services")) == 1
