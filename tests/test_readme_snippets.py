"""The README's examples run as written: every ``python`` block and every ``sh`` block.

Each Python block runs in a fresh interpreter in a temporary directory (its
relative paths land there); each ``effectgate`` line of a shell block runs
with the venv's script, ``/tmp/eg`` standing for a temporary directory, and
must end with the exit code its comment states (``(exit 137)``), else 0.
The two fresh-machine commands (``make demo``, ``make test``) are the only
lines not run here: the suite is what ``make test`` runs, and ``make demo``
is ``effectgate demo --approve all`` on a new directory, which the CLI tests
run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EFFECTGATE = Path(sys.executable).with_name("effectgate")
FRESH_MACHINE = {"make demo", "make test"}

_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
_EXIT = re.compile(r"\(exit (\d+)\)")


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(README.read_text()) if kind == lang]


def _commands(block: str) -> list[tuple[str, int]]:
    """``(command, expected exit code)`` per command line of a shell block."""
    out: list[tuple[str, int]] = []
    for line in block.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            found = _EXIT.search(line)
            if found and out:
                out[-1] = (out[-1][0], int(found.group(1)))
            continue
        out.append((line, 0))
    return out


def test_the_readme_has_examples_to_run() -> None:
    assert _blocks("python"), "README.md lost its library example"
    assert any(
        cmd.startswith("effectgate ") for block in _blocks("sh") for cmd, _ in _commands(block)
    )


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(_blocks("python")[index])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "the example printed nothing"


@pytest.mark.parametrize("index", range(len(_blocks("sh"))))
def test_shell_block_runs(index: int, tmp_path: Path) -> None:
    commands = _commands(_blocks("sh")[index])
    runnable = [(c, code) for c, code in commands if c not in FRESH_MACHINE]
    if not runnable:
        assert {c for c, _ in commands} <= FRESH_MACHINE
        return
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    for command, expected in runnable:
        argv = shlex.split(command.replace("/tmp/eg", str(tmp_path / "eg")))
        assert argv[0] == "effectgate", f"README shell line not covered here: {command}"
        done = subprocess.run(
            [str(EFFECTGATE), *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == expected, (command, done.stdout[-2000:], done.stderr[-2000:])
