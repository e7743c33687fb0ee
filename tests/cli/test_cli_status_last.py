"""The status line (``thread T: STATUS (exit code N)``) is the last line a run prints (#36)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.conftest import CLI, cli_env


def _merged(*args: str) -> tuple[int, list[str]]:
    """Run ``effectgate ARGS`` with stdout and stderr on one pipe, as a terminal shows them."""
    proc = subprocess.run([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True, env=cli_env(), timeout=120,
                          check=False)  # fmt: skip
    return proc.returncode, [line for line in proc.stdout.splitlines() if line.strip()]


def test_the_status_line_is_last_in_demo_run_and_resume(tmp_path: Path) -> None:
    """Next steps and recovery lines come before the status line, never after it."""
    state = str(tmp_path / "state")
    code, lines = _merged("demo", "--state-dir", state, "--thread", "w1")
    assert code == 4
    assert lines[-1] == "thread w1: waiting for review (exit code 4)", lines[-3:]
    assert any(line.startswith("continue with: effectgate resume") for line in lines)

    code, lines = _merged("resume", "--state-dir", state, "--thread", "w1", "--approve", "all",
                          "--crash-at", "AFTER_EXTERNAL_COMMIT@create_ticket")  # fmt: skip
    assert code == 137, lines[-5:]
    code, lines = _merged("resume", "--state-dir", state, "--thread", "w1", "--approve", "all")
    assert code == 0, lines[-5:]
    assert any(line.startswith("recovered create_ticket") for line in lines), lines
    assert lines[-1] == "thread w1: done (exit code 0)", lines[-3:]

    code, lines = _merged("resume", "--state-dir", state, "--thread", "w1")
    assert code == 0 and lines[-1] == "thread w1: done (exit code 0)", lines[-3:]

    code, lines = _merged("run", "write a note", "--model", "scripted:incident", "--with-services",
                          "--state-dir", state, "--thread", "r1")  # fmt: skip
    assert lines[-1].startswith("thread r1: ") and lines[-1].endswith(f"(exit code {code})")
