"""SIGINT / SIGTERM at every stage end with exit 5, a message, and an honest next step."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pexpect

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import catches, cli_env, finish, in_flight, start, wait_for, write_script

_HOLD = (
    # Holds the effect until the test creates ``go`` (at most ~30 s).
    "for i in $(seq 600); do [ -f go ] && break; sleep 0.05; done; echo once >> done.txt"
)


def _threads(state: Path) -> list[str]:
    if not (state / "ledger.sqlite3").exists():
        return []
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        return [record.thread_id for record in ledger.list_threads()]
    finally:
        ledger.close()


def test_signal_before_the_thread_exists_says_rerun_not_resume(tmp_path: Path) -> None:
    """SIGINT or SIGTERM as soon as the CLI runs: exit 5, a message, no ``resume`` hint.

    Nothing was registered, so ``resume`` would fail: the message says to re-run.
    """
    script = write_script(tmp_path / "one.json", [{"name": "read_file", "args": {"path": "x"}}])
    for signum, command in (
        (signal.SIGINT, ["run", "hi", "--model", f"scripted:{script}"]),
        (signal.SIGTERM, ["demo", "--approve", "all"]),
    ):
        state = tmp_path / f"state-{signum}"
        proc = start(*command, "--state-dir", str(state), "--thread", "c", "--json")
        wait_for(lambda p=proc: catches(p.pid, signal.SIGTERM), proc, "handlers are installed")
        proc.send_signal(signum)
        ran = finish(proc)
        assert ran.code == 5, (signum, ran.stderr)
        flat = " ".join(ran.stderr.split())
        assert f"stopped by {signal.Signals(signum).name}" in flat
        assert "nothing was started; re-run the same command" in flat
        assert "resume" not in flat
        assert ran.json["exit_code"] == 5
        assert _threads(state) == []


def test_second_sigterm_aborts_with_5_and_a_resume_hint(tmp_path: Path) -> None:
    """SIGTERM mid-effect asks to stop; a second one aborts at once: exit 5, not death by signal.

    The note names what stops now (no promise about Ctrl-C for SIGTERM) and the
    hint carries the non-default ``--state-dir``.
    """
    state = tmp_path / "state"
    hold = [{"name": "run_shell", "args": {"command": _HOLD}}]
    script = write_script(tmp_path / "hold.json", hold)
    proc = start(
        "run", "hold", "--model", f"scripted:{script}", "--state-dir", str(state),
        "--thread", "g", "--approve", "all",
    )  # fmt: skip
    try:
        wait_for(lambda: in_flight(state), proc, "the shell call is in flight")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # two signals sent at once would merge into one
        proc.send_signal(signal.SIGTERM)
        ran = finish(proc, timeout=20)
    finally:
        (state / "workspace" / "go").touch()
    assert ran.code == 5, ran.stderr
    flat = " ".join(ran.stderr.split())
    assert "SIGTERM: stopping at the next step boundary" in flat
    assert "Ctrl-C again" not in flat
    assert "aborted by a second SIGTERM" in flat
    assert f"effectgate resume --thread g --state-dir {state}" in flat


def _spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "effectgate.cli", *args],
        env=cli_env(),
        encoding="utf-8",
        timeout=30,
        dimensions=(50, 200),
    )
    child.logfile_read = sys.stdout
    return child


def test_signal_at_the_review_prompt_exits_5_and_runs_nothing(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM at the prompt: nothing runs, exit 5, and the resume hint is printed."""
    script = write_script(
        tmp_path / "one.json",
        [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}],
    )
    for name in ("SIGINT", "SIGTERM"):
        state = tmp_path / name
        child = _spawn(
            "run", "write", "--model", f"scripted:{script}", "--state-dir", str(state),
            "--thread", "p",
        )  # fmt: skip
        child.expect_exact("[approve/edit/reject/respond/quit]")
        # Let the prompt reach its blocking read: on a cold venv a signal that
        # lands during the prompt's first imports was seen lost in CI even with
        # the re-sending (left open; see the Stopper's prompt docstring).
        time.sleep(1.0)
        if name == "SIGINT":
            child.sendintr()
        else:
            child.kill(signal.SIGTERM)
        child.expect_exact(f"stopped by {name}")
        child.expect_exact("effectgate resume --thread p")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 5, name
        assert not (state / "workspace" / "a.txt").exists()
