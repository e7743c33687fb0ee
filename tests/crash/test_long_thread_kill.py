"""A long thread killed while it crosses delta snapshots makes each ticket once.

The messages channel stores only new messages per checkpoint and a full
snapshot now and then (``DeltaChannel``), and task writes commit without
an fsync until the superstep's checkpoint (``StepDurableSaver``). This test
runs a 60-call thread (about 120 message updates, so at least one snapshot) in
a worker process, SIGKILLs it three times at moments chosen by the ticket
count, resumes it in new processes, and asks the ticket service itself.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.checkpoint.sqlite import SqliteSaver

from effectgate import StateDir
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conftest import worker_cmd

pytestmark = pytest.mark.crash

CALLS = 60


def _script(path: Path) -> str:
    turns = [
        {
            "say": f"Opening ticket {k}.",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {
                        "title": f"ticket {k}",
                        "body": f"body {k}",
                        "severity": "low",
                        "alert_id": f"alert-{k}",
                    },
                }
            ],
        }
        for k in range(CALLS)
    ]
    path.write_text(yaml.safe_dump({"name": "many", "turns": turns, "final": "All opened."}))
    return f"scripted:{path}"


def _tickets(sd: StateDir) -> int:
    try:
        return len(read_tickets(sd.services))
    except Exception:  # noqa: BLE001 - the service may be mid-write; ask again
        return -1


def test_kills_across_delta_snapshots_make_each_ticket_once(
    services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    model = _script(tmp_path / "many.yaml")
    cmd = [*worker_cmd(state_dir, "long"), "--model", model, "--max-reviews", "1000"]
    kills = 0
    for threshold in (15, 35, 50):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while _tickets(state_dir) < threshold and proc.poll() is None:
            assert time.monotonic() < deadline, "the worker made no progress"
            time.sleep(0.002)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert kills == 3

    tickets = read_tickets(state_dir.services)
    assert sorted(t["title"] for t in tickets) == sorted(f"ticket {k}" for k in range(CALLS))
    assert world(state_dir).duplicate_tickets == 0
    with SqliteLedger(state_dir.ledger) as ledger:
        ops = ledger.list(thread_id="long")
    assert len(ops) == CALLS and {op.state for op in ops} == {OpState.SUCCEEDED}
    assert checkpoint_problems(state_dir.checkpoints, "long") == []
    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    try:
        blobs = [
            t.checkpoint["channel_values"].get("messages")
            for t in SqliteSaver(conn).list({"configurable": {"thread_id": "long"}})
        ]
    finally:
        conn.close()
    assert any(isinstance(b, _DeltaSnapshot) for b in blobs)  # the thread crossed a snapshot
