"""Helpers for the CLI tests: run ``effectgate`` in a real subprocess, read its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from effectgate.demo import read_mails, read_tickets

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
    """The environment for a CLI subprocess: no inherited failpoint, wide plain output."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    return env


def eg(*args: str, timeout: float = 60) -> Ran:
    """Run ``effectgate ARGS`` with stdin closed (so never interactive) and wait for it."""
    proc = subprocess.run(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        check=False,
    )
    return Ran(proc.returncode, proc.stdout, proc.stderr)


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
