"""Run bring-your-own agents in worker processes and read what the world and checkpoints say."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from effectgate import StateDir
from effectgate.demo.services import DemoServices
from effectgate.graph import history_problems
from effectgate.ledger import SqliteLedger

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ByoRun:
    returncode: int
    summary: dict[str, Any]
    stderr: str


def run_byo(
    state_dir: StateDir,
    variant: str,
    thread: str,
    *,
    failpoint: str | None = None,
    kill_after: str | None = None,
    timeout: float = 60.0,
) -> ByoRun:
    """Run ``tests.byo._worker`` in a new process (from the repository root) and wait."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("EFFECTGATE_FAILPOINT", "BYO_KILL_AFTER")
    }
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    if kill_after:
        env["BYO_KILL_AFTER"] = kill_after
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.byo._worker",
            "--variant",
            variant,
            "--state-dir",
            str(state_dir.root),
            "--thread",
            thread,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return ByoRun(proc.returncode, json.loads(lines[-1]) if lines else {}, proc.stderr)


def all_checkpoint_problems(checkpoints: Path, thread_id: str) -> list[str]:
    """Check the messages of every checkpoint of a thread, subgraph namespaces included.

    The user graphs and ``create_agent`` keep ``messages`` in a plain
    ``add_messages`` channel, so each checkpoint holds the whole history.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(checkpoints), check_same_thread=False)
    try:
        out: list[str] = []
        seen = 0
        for tup in SqliteSaver(conn).list({"configurable": {"thread_id": thread_id}}):
            seen += 1
            ns = tup.config["configurable"].get("checkpoint_ns", "")
            cid = tup.config["configurable"]["checkpoint_id"]
            messages = tup.checkpoint["channel_values"].get("messages", [])
            out += [f"{ns or '(root)'}/{cid}: {p}" for p in history_problems(messages)]
        assert seen, f"no checkpoints for thread {thread_id!r}"
        return out
    finally:
        conn.close()


@pytest.fixture
def agent(services: DemoServices, state_dir: StateDir) -> Iterator[tuple[Any, SqliteLedger]]:
    """``create_agent`` with effectgate's middleware on the demo tools: ``(graph, ledger)``.

    The scripted incident model, a ``SqliteSaver`` on the state directory's
    checkpoints and a ``SqliteLedger`` on its ledger; both closed after.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    from effectgate import default_tools
    from effectgate.models import make_model
    from tests.byo._agents import middleware_agent

    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with SqliteLedger(state_dir.ledger) as ledger:
        graph = middleware_agent(
            make_model("scripted:incident"),
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            checkpointer=SqliteSaver(conn),
        )
        yield graph, ledger
    conn.close()
