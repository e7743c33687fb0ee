"""Threads written by an earlier effectgate still resume, replay and read back.

The messages channel became a LangGraph ``DeltaChannel``. Its
on-disk form is beta, so this test keeps a real state directory written by
effectgate 0.1.0 before that change (``tests/data/thread-0.1.0-add-messages``,
made by ``tests/data/make_old_thread.py``; see its ``WRITTEN_BY``): thread
``old`` wrote ``a.txt`` and waits at the review of ``b.txt``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from langchain_core.messages import AIMessage, ToolMessage
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel
from effectgate.testing.oracle import checkpoint_problems

DATA = Path(__file__).parent.parent / "data"
sys.path.insert(0, str(DATA))
from make_old_thread import APPROVE, SCRIPT  # noqa: E402

FIXTURE = DATA / "thread-0.1.0-add-messages"


def _copy(tmp_path: Path) -> StateDir:
    target = tmp_path / "state"
    shutil.copytree(FIXTURE, target)
    return StateDir.open(target, create=False)


def test_old_thread_resumes_with_exactly_one_more_write(tmp_path: Path) -> None:
    """Approving the pending review writes b.txt once, leaves a.txt alone, and ends the thread."""
    sd = _copy(tmp_path)
    before = (sd.workspace / "a.txt").stat()
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(sd, model=model, policy=Policy(approval_ttl=None)) as agent:
        waiting = agent.status("old")
        assert waiting.status is RunStatus.WAITING_REVIEW
        (action,) = waiting.interrupts[0].value["action_requests"]
        assert action["args"] == {"path": "b.txt", "content": "second\n"}
        done = agent.resume("old", decisions=bound(agent, "old", APPROVE))
        assert done.status is RunStatus.DONE, done.error
        assert done.final_message == "Both files written."
        history = agent.messages("old")
        again = agent.resume("old")
        assert again.status is RunStatus.DONE
    assert (sd.workspace / "b.txt").read_bytes() == b"second\n"
    assert (sd.workspace / "a.txt").read_bytes() == b"first\n"
    assert (sd.workspace / "a.txt").stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in sd.workspace.iterdir()) == ["a.txt", "b.txt"]
    tool_results = [m for m in history if isinstance(m, ToolMessage)]
    assert len(tool_results) == 2 and all(m.status == "success" for m in tool_results)
    assert [type(m).__name__ for m in history].count("AIMessage") == 3
    assert checkpoint_problems(sd.checkpoints, "old") == []
    with open_agent(sd, model=model) as agent:
        ops = agent.ledger.list(thread_id="old")
    assert [(op.tool, op.state) for op in ops] == [("write_file", OpState.SUCCEEDED)] * 2


def test_old_and_new_checkpoints_read_back_as_one_growing_history(tmp_path: Path) -> None:
    """Every checkpoint, from before and after the format change, is a prefix of the latest."""
    sd = _copy(tmp_path)
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(sd, model=model, policy=Policy(approval_ttl=None)) as agent:
        agent.resume("old", decisions=bound(agent, "old", APPROVE))
        config = {"configurable": {"thread_id": "old"}}
        snapshots = list(agent.graph.get_state_history(config))
        latest = snapshots[0].values["messages"]
        assert len(snapshots) > 6
        for snap in snapshots:
            messages = snap.values.get("messages", [])
            assert [m.id for m in messages] == [m.id for m in latest[: len(messages)]]
        # time travel to a checkpoint written by the old format: the fork reaches the
        # review of b.txt again and, approved, reuses the receipt instead of writing again
        old_review = next(
            s
            for s in snapshots
            if s.next == ("review",)
            and isinstance(s.values["messages"][-1], AIMessage)
            and s.values["messages"][-1].tool_calls[0]["args"]["path"] == "b.txt"
            and s.metadata is not None
            and s.metadata.get("step", 99) <= 4  # the fixture's checkpoints are steps -1..4
        )
        mtime = (sd.workspace / "b.txt").stat().st_mtime_ns
        forked = agent.replay("old", old_review.config["configurable"]["checkpoint_id"])
        while forked.status is RunStatus.WAITING_REVIEW:
            forked = agent.resume("old", decisions=bound(agent, "old", APPROVE))
        assert forked.status is RunStatus.DONE, forked.error
    assert (sd.workspace / "b.txt").stat().st_mtime_ns == mtime
    assert (sd.workspace / "b.txt").read_bytes() == b"second\n"


def test_cli_resume_of_a_thread_without_a_recorded_model_needs_model(tmp_path: Path) -> None:
    """The CLI never guesses a model for a thread the library started (metadata ``{}``).

    Found by a fresh user: ``effectgate resume`` played the demo's incident
    script on this two-files thread; another history could have led that
    script to propose mails or tickets that ``--approve all`` approves.
    """
    import json
    import subprocess

    sd = _copy(tmp_path)
    script = tmp_path / "two-files.json"
    script.write_text(json.dumps(SCRIPT))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectgate.cli", "resume", "--thread", "old",
             "--state-dir", str(sd.root), "--approve", "all", *args],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    refused = cli()
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no recorded model" in refused.stdout + refused.stderr
    assert sorted(p.name for p in sd.workspace.iterdir()) == ["a.txt"]
    done = cli("--model", f"scripted:{script}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the thread records none" in done.stderr
    assert (sd.workspace / "b.txt").read_bytes() == b"second\n"
