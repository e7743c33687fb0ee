"""Helpers for the CLI tests: run ``effectgate`` in a real subprocess, read its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from effectgate.demo import read_mails, read_tickets
from effectgate.ledger import OpState, SqliteLedger
from tests._fork import python_m

CLI = [sys.executable, "-m", "effectgate.cli"]
NOTE = Path("incidents/orders-error-rate.md")


@dataclass(frozen=True)
class Ran:
    """One finished ``effectgate`` process."""

    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """The single JSON object printed on stdout (fails if there is anything else)."""
        return json.loads(self.stdout)


def cli_env() -> dict[str, str]:
    """The environment for a CLI subprocess: no inherited failpoint or editor, wide plain output."""
    dropped = ("EFFECTGATE_FAILPOINT", "EDITOR", "VISUAL")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    return env


def eg(*args: str, timeout: float = 60, cwd: Path | None = None) -> Ran:
    """Run ``effectgate ARGS`` with stdin closed (so never interactive) and wait for it.

    The process is forked from a warm image (``tests/_fork.py``): a separate
    process, without the second of start-up imports.
    """
    proc = python_m("effectgate.cli", args, env=cli_env(), timeout=timeout, cwd=cwd)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def start(*args: str) -> subprocess.Popen[str]:
    """Start ``effectgate ARGS`` in the background (stdin closed, output captured)."""
    return subprocess.Popen(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> Ran:
    """Wait for a process from ``start`` (killing it if it overstays) and collect it."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return Ran(proc.returncode, out, err)


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def in_flight(state_dir: Path) -> bool:
    """Whether the state directory's ledger holds an IN_FLIGHT operation."""
    path = state_dir / "ledger.sqlite3"
    if not path.exists():
        return False
    ledger = SqliteLedger(path)
    try:
        return bool(ledger.list(states=[OpState.IN_FLIGHT]))
    finally:
        ledger.close()


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    """Poll ``condition`` every 20 ms for up to 30 s while ``proc`` still runs."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        assert proc.poll() is None, (what, proc.communicate())
        time.sleep(0.02)


def world(state_dir: Path) -> dict[str, Any]:
    """What the external systems hold, read from their own storage and the workspace."""
    services = state_dir / "services"
    workspace = state_dir / "workspace"
    files = {
        p.relative_to(workspace).as_posix(): p.read_bytes()
        for p in sorted(workspace.rglob("*"))
        if p.is_file()
    }
    return {"tickets": read_tickets(services), "mails": read_mails(services), "files": files}


def write_script(path: Path, calls: Sequence[dict[str, Any]], final: str = "Done.") -> Path:
    """Write a one-turn scripted-model script whose single AI message makes ``calls``."""
    script = {
        "name": path.stem,
        "final": final,
        "turns": [{"say": "Working on it.", "tool_calls": list(calls)}],
    }
    path.write_text(json.dumps(script), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Ran]:
    """A state directory where ``effectgate demo --approve all --json`` ran to the end once.

    Tests using it only read, or check that a command changes nothing.
    """
    state = tmp_path_factory.mktemp("demo") / "state"
    ran = eg(
        "demo",
        "--state-dir",
        str(state),
        "--thread",
        "demo-1",
        "--approve",
        "all",
        "--json",
        "--reviewer",
        "ci",
    )
    assert ran.code == 0, ran.stderr
    return state, ran


EXPECTED_NOTE = (
    b"# Incident: orders error rate above 5%\n"
    b"\n"
    b"- Ticket: TICKET-1\n"
    b"- Service: orders\n"
    b"- Error rate (last 5 minutes): 0.12 (threshold 0.05)\n"
    b"- Severity: high\n"
    b"- On-call: oncall@example.com\n"
)
"""The demo's incident note, byte for byte, for ticket 1 and error rate 0.12."""


def pin(state_dir: Path, thread: str, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` pinned to the thread's one pending review, read from ``pending --json``.

    An answer names the review it answers; a test that answers "what waits
    now" reads it first, as a person would.
    """
    shown = eg("pending", "--state-dir", str(state_dir), "--json").json
    (thread_entry,) = [t for t in shown["threads"] if t["thread_id"] == thread]
    (review,) = [i for i in thread_entry["interrupts"] if i["value"].get("type") == "review"]
    return {**answer, "interrupt_id": review["id"]}
