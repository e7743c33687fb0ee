"""A worker stopped (SIGSTOP) mid-send past its lease: the runner that takes over waits for a human.

The stopped worker is alive: once continued it completes its send, and only
then learns (``ClaimLostError``) that the ledger moved on. So the new runner
must not read the lookup's "not found" as final: it parks the operation. The
sink is a real file both processes append to; the test counts its lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.crash

WORKER = r"""
import json, sys, time
from pathlib import Path
from pydantic import BaseModel
from effectgate import open_agent
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec

state, sink, role = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

class Mail(BaseModel):
    to: str

def send(args, ctx):
    if role == "slow":
        (state / "started").write_text("1")
        while not (state / "go").exists():  # the send is under way (a slow SMTP server)
            time.sleep(0.02)
    with sink.open("a") as f:
        f.write(ctx.operation_id + "\n")
    return ToolResult(value={"sent": True}, reference=ctx.operation_id)

def lookup(args, ctx):
    lines = sink.read_text().split() if sink.exists() else []
    if ctx.operation_id in lines:
        return Lookup.found({"sent": True}, ctx.operation_id)
    return Lookup.not_found("no such Message-ID in the mailbox")

spec = ToolSpec(name="send_email", description="Send a mail.", args_schema=Mail, func=send,
                kind=EffectKind.RECONCILABLE, reconciler=lookup, not_found_is_final=True)
script = {"name": "one-mail", "turns": [{"say": "mailing",
          "tool_calls": [{"name": "send_email", "args": {"to": "oncall@x"}, "id": "call_1"}]}],
          "final": "sent"}
with open_agent(state, model=ScriptedChatModel.from_script(script), tools=[spec],
                lease_ttl_s=1.0, lease_wait_s=10.0) as agent:
    if role == "slow":
        (review,) = agent.start("mail on-call", thread_id="t").interrupts
        result = agent.resume("t", answers={review.id: {"decisions": [{"type": "approve"}]}})
    elif role == "verdict":  # a person checked the mailbox and saw the mail
        verdict = {"verdict": "succeeded", "reference": "t:call_1"}
        result = agent.resume("t", verdicts={"t:call_1": verdict})
    else:
        result = agent.resume("t")
    print(json.dumps({"status": result.status.value, "error": result.error,
                      "states": [op.state.value for op in result.operations]}))
"""


def _run(script: Path, state: Path, sink: Path, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), str(state), str(sink), role],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"worker ended early: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} never appeared")
        time.sleep(0.02)


def test_a_stopped_worker_past_its_lease_is_not_retried_over(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    state, sink = tmp_path / "state", tmp_path / "sink.txt"
    slow = _run(script, state, sink, "slow")
    try:
        _wait_for(state / "started", slow)  # IN_FLIGHT committed, the send is under way
        os.kill(slow.pid, signal.SIGSTOP)
        time.sleep(1.5)  # its 1 s lease expires: no renewal from a stopped process

        taker = _run(script, state, sink, "taker")
        out, err = taker.communicate(timeout=120)
        assert taker.returncode == 0, err
        took = json.loads(out.splitlines()[-1])
        assert took["status"] == "waiting_reconciliation", took
        assert took["states"] == ["NEEDS_RECONCILIATION"]
        assert not sink.exists()  # the taker sent nothing

        (state / "go").write_text("1")
        os.kill(slow.pid, signal.SIGCONT)  # the stopped worker's send completes
        out, err = slow.communicate(timeout=120)
        assert slow.returncode == 0, err
        assert "ClaimLostError" in json.loads(out.splitlines()[-1])["error"]
    finally:
        if slow.poll() is None:
            os.kill(slow.pid, signal.SIGCONT)
            slow.kill()
            slow.wait()
    assert sink.read_text().split() == ["t:call_1"]  # one mail

    # A person who sees the mail settles it; nothing is sent again.
    again = _run(script, state, sink, "verdict")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["states"] == ["SUCCEEDED"]
    assert sink.read_text().split() == ["t:call_1"]
