"""``--json`` keeps stdout for its one object, whatever your own code prints.

An ``--agent`` factory (or a tool it builds) that prints used to write into
the same stdout as the JSON object, so ``json.loads(stdout)`` failed. Now,
while a ``--json`` command runs, ``sys.stdout`` is stderr: the prints are
kept there, and stdout holds exactly one object. Each case is a real process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import eg

FACTORY = """
import os, subprocess, sys
from effectgate.tools import file_tools

def build(state_dir):
    print("printed by the factory")
    sys.stdout.write("written by the factory\\n")
    os.write(1, b"written to fd 1 by the factory\\n")
    subprocess.run(["echo", "echoed by a child of the factory"], check=True)
    return {"tools": file_tools(state_dir.workspace)}
"""
OWN = (
    "printed by the factory",
    "written by the factory",
    "written to fd 1 by the factory",
    "echoed by a child of the factory",
)


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    (tmp_path / "noisy_agent.py").write_text(FACTORY)
    call = {"name": "write_file", "args": {"path": "a.md", "content": "x"}}
    script = {"name": "n", "final": "done", "turns": [{"tool_calls": [call]}]}
    (tmp_path / "model.json").write_text(json.dumps(script))
    return tmp_path


def test_prints_of_an_agent_factory_go_to_stderr_under_json(noisy: Path) -> None:
    state = str(noisy / "state")
    common = ("--agent", "noisy_agent:build", "--state-dir", state, "--json")
    ran = eg("run", "task", "--model", "scripted:model.json", "--thread", "t1", *common, cwd=noisy)
    assert ran.code == 4, ran.stderr[-2000:]  # waiting for review
    assert json.loads(ran.stdout)["status"] == "waiting_review"  # one object, nothing else
    assert all(line in ran.stderr for line in OWN), ran.stderr

    # the thread remembers its recipe: these rebuild the agent (and call the factory) unasked
    for argv in (("pending", "--thread", "t1"), ("resume", "--thread", "t1", "--approve", "all")):
        ran = eg(*argv, "--state-dir", state, "--json", cwd=noisy)
        assert ran.code == 0, ran.stderr[-2000:]
        json.loads(ran.stdout)
        assert not [line for line in OWN if line in ran.stdout]
    assert (noisy / "state" / "workspace" / "a.md").read_bytes() == b"x"


def test_without_json_the_prints_stay_on_stdout(noisy: Path) -> None:
    """Outside ``--json`` nothing is redirected: your prints are where you put them."""
    ran = eg(
        "run",
        "task",
        "--model",
        "scripted:model.json",
        "--agent",
        "noisy_agent:build",
        "--state-dir",
        str(noisy / "state"),
        "--approve",
        "all",
        cwd=noisy,
    )
    assert ran.code == 0, ran.stderr[-2000:]
    assert all(line in ran.stdout for line in OWN), ran.stdout
