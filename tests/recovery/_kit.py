"""Shared pieces of the recovery tests: a scripted ticket run on a real ticket service."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from tests.cli.conftest import cli_env

ALERT = "db-down"
KEY = f"ticket:{ALERT}"

SCRIPT: dict[str, Any] = {
    "name": "one-ticket",
    "turns": [
        {
            "say": "opening the ticket",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {"title": "DB down", "body": "primary is down", "alert_id": ALERT},
                    "id": "call_1",
                }
            ],
        }
    ],
    "final": "ticket open",
}

WORKER = r"""
import json, sys
from pathlib import Path
from effectgate import open_agent
from effectgate.models import ScriptedChatModel
from effectgate.tools import ticket_tools

state, url, thread, script = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
model = ScriptedChatModel.from_script(json.loads(script))
# a long client timeout: the slow server must not time the request out
with open_agent(state, model=model, tools=ticket_tools(url, timeout_s=60)) as agent:
    result = agent.start("open the ticket", thread_id=thread)
    if result.interrupts:  # none when the operation already started in another thread
        pending = result.interrupts[0].id  # the answer names the review it answers
        result = agent.resume(thread, answers={pending: {"decisions": [{"type": "approve"}]}})
    print(json.dumps({"status": result.status.value, "error": result.error,
                      "states": [op.state.value for op in result.operations]}))
"""


def worker(
    tmp: Path, state: Path, url: str, thread: str, *, failpoint: str | None = None
) -> subprocess.Popen[str]:
    """Start a process that starts ``thread`` on ``SCRIPT`` and approves its ticket."""
    script = tmp / "worker.py"
    script.write_text(WORKER)
    env = cli_env()
    if failpoint is not None:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    return subprocess.Popen(
        [sys.executable, str(script), str(state), url, thread, json.dumps(SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` every 20 ms until it holds, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


class Lines:
    """The lines a process writes to a pipe, read on a thread as they come."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line)

    def has(self, fragment: str) -> bool:
        """Whether a line read so far holds ``fragment``."""
        return any(fragment in line for line in self.lines)

    def text(self) -> str:
        """Everything, once the pipe closed (the process ended)."""
        self._thread.join(30)
        return "".join(self.lines)
