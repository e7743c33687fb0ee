"""Interactive review in a pseudo-terminal: approve one call, edit one, reject one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pexpect

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import cli_env, world, write_script

CHOICES = "[approve/edit/reject/respond/quit]"


def _spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "effectgate.cli", *args],
        env=cli_env(),
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
    )
    child.logfile_read = sys.stdout  # visible with pytest -s when something hangs
    return child


def test_approve_edit_reject_at_the_terminal(tmp_path: Path) -> None:
    """Three parallel writes: a.txt approved, b.txt edited at the prompt, c.txt rejected."""
    state = tmp_path / "state"
    script = write_script(
        tmp_path / "three.json",
        [
            {"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}},
            {"name": "write_file", "args": {"path": "b.txt", "content": "beta\n"}},
            {"name": "write_file", "args": {"path": "c.txt", "content": "gamma\n"}},
        ],
    )
    child = _spawn(
        "run",
        "write three files",
        "--model",
        f"scripted:{script}",
        "--state-dir",
        str(state),
        "--thread",
        "tty",
        "--reviewer",
        "alice",
    )
    child.expect_exact("review: 3 side-effecting call(s)")
    child.expect_exact("[1/3] write_file")
    child.expect_exact("a.txt")
    child.expect_exact(CHOICES)
    child.sendline("a")
    child.expect_exact("[2/3] write_file")
    child.expect_exact(CHOICES)
    child.sendline("edit")
    child.expect_exact("args> ")
    child.expect_exact('"content": "beta\\n"')  # the current arguments, ready to edit
    # Ctrl-U clears the prefilled line (readline), then the new arguments follow.
    child.sendline("\x15" + json.dumps({"path": "b.txt", "content": "BETA, edited\n"}))
    child.expect_exact("...> ")
    child.sendline(".")  # ends the arguments; the diff against the shown ones follows
    child.expect_exact('+  "content": "BETA, edited\\n"')
    child.expect_exact("[yes/edit/cancel]")
    child.sendline("y")
    child.expect_exact("[3/3] write_file")
    child.expect_exact(CHOICES)
    child.sendline("r")
    child.expect_exact("reason")
    child.sendline("not this one")
    child.expect_exact("done (exit code 0)")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    assert world(state)["files"] == {"a.txt": b"alpha\n", "b.txt": b"BETA, edited\n"}
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        ops = {op.args["path"]: op for op in ledger.list(thread_id="tty")}
        assert {path: op.state.value for path, op in ops.items()} == {
            "a.txt": "SUCCEEDED",
            "b.txt": "SUCCEEDED",
            "c.txt": "REJECTED",
        }
        assert ops["b.txt"].args["content"] == "BETA, edited\n"
        [reject] = ledger.approvals(ops["c.txt"].operation_id)
        assert (reject.decision, reject.reviewer, reject.message) == (
            "reject",
            "alice",
            "not this one",
        )
        [edit] = ledger.approvals(ops["b.txt"].operation_id)
        assert edit.decision == "edit"
    finally:
        ledger.close()


def test_quit_leaves_the_review_pending(tmp_path: Path) -> None:
    """Answering ``quit`` runs nothing and exits 4 (waiting for review)."""
    state = tmp_path / "state"
    script = write_script(
        tmp_path / "one.json",
        [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}],
    )
    child = _spawn(
        "run",
        "write a file",
        "--model",
        f"scripted:{script}",
        "--state-dir",
        str(state),
        "--thread",
        "q",
    )
    child.expect_exact(CHOICES)
    child.sendline("q")
    child.expect_exact("waiting for review")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4
    assert world(state)["files"] == {}
