"""An answer applies to the review it was given for, or to nothing.

Found by a fresh user: a reviewer's answer typed at one terminal was silently
dropped, or applied to the *next* review, when another process had answered
the first one meanwhile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.answers._bind import bound
from tests.integration.test_resume_shortcut import APPROVE, SCRIPT, _agent, _pending_path

from effectgate import StateDir
from effectgate.errors import DecisionError
from effectgate.graph import RunStatus

REJECT = {"decisions": [{"type": "reject", "message": "no"}]}


def _files(sd: StateDir) -> list[str]:
    return sorted(p.name for p in sd.workspace.iterdir())


def test_an_answer_pinned_to_an_answered_review_is_refused(state_dir: StateDir) -> None:
    with _agent(state_dir) as bob, _agent(state_dir) as alice:
        shown = bob.start("write", thread_id="t")  # Bob looks at the review of a.txt
        assert _pending_path(shown) == "a.txt"
        alice.resume("t", decisions=bound(alice, "t", APPROVE))  # Alice approves it first
        pinned = {**REJECT, "interrupt_id": shown.interrupts[0].id}
        with pytest.raises(DecisionError, match="is not pending"):
            bob.resume("t", decisions=bound(bob, "t", pinned))
        still = bob.resume("t")
        assert still.status is RunStatus.WAITING_REVIEW and _pending_path(still) == "b.txt"
        ops = bob.ledger.list(thread_id="t")
    assert [(op.args["path"], op.state.value) for op in ops] == [("a.txt", "SUCCEEDED")]
    assert _files(state_dir) == ["a.txt"]


def test_an_answer_when_nothing_is_pending_is_refused(state_dir: StateDir) -> None:
    with _agent(state_dir) as agent:
        agent.start("write", thread_id="t")
        for _ in range(3):
            agent.resume("t", decisions=bound(agent, "t", APPROVE))
        assert agent.status("t").status is RunStatus.DONE
        with pytest.raises(DecisionError, match="names no review"):
            agent.resume("t", decisions=bound(agent, "t", REJECT))
        with pytest.raises(DecisionError, match="no pending reconciliation"):
            agent.resume("t", verdicts={"t:x": {"verdict": "failed"}})
    assert _files(state_dir) == ["a.txt", "b.txt", "c.txt"]


def test_cli_decisions_file_pinned_to_an_answered_review_exits_2(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """``interrupt_id`` from ``pending --json`` pins a decisions file to one review."""
    script = tmp_path / "three.json"
    script.write_text(json.dumps(SCRIPT))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectgate.cli", *args, "--state-dir", str(state_dir.root)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    run = cli("run", "write", "--thread", "t", "--model", f"scripted:{script}")
    assert run.returncode == 4, run.stderr
    pending = json.loads(cli("pending", "--json").stdout)
    (interrupt,) = pending["threads"][0]["interrupts"]
    pinned = {**APPROVE, "interrupt_id": interrupt["id"]}
    approve = cli("resume", "--thread", "t", "--decisions", str(_write(tmp_path, pinned)))
    assert approve.returncode == 4, approve.stderr  # a.txt written; waits at b.txt
    stale = _write(tmp_path, {**REJECT, "interrupt_id": interrupt["id"]}, name="stale.json")
    refused = cli("resume", "--thread", "t", "--decisions", str(stale))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "is not pending" in refused.stdout + refused.stderr
    assert _files(state_dir) == ["a.txt"]
    assert (
        json.loads(cli("pending", "--json").stdout)["threads"][0]["interrupts"][0]["value"][
            "action_requests"
        ][0]["args"]["path"]
        == "b.txt"
    )


def _write(tmp_path: Path, data: dict[str, object], name: str = "answer.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
