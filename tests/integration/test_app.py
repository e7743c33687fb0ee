"""The app layer refuses state it cannot trust, before writing anything."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError
from effectgate.graph import RunStatus
from effectgate.testing.oracle import world
from effectgate.tools import file_tools


def test_foreign_directory_is_refused_untouched(tmp_path: Path) -> None:
    """A non-empty directory without our marker is not written to."""
    (tmp_path / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not an effectgate state directory"):
        StateDir.open(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["precious.txt"]


def test_corrupt_marker_is_a_config_error(tmp_path: Path) -> None:
    """A garbled marker file gives a clear error, not a JSON traceback."""
    StateDir.open(tmp_path / "s")
    (tmp_path / "s" / "effectgate.json").write_text("nope")
    with pytest.raises(ConfigError, match="not an effectgate marker"):
        StateDir.open(tmp_path / "s")


def test_corrupt_checkpoint_file_is_a_damaged_file(tmp_path: Path) -> None:
    """A checkpoint file that is not SQLite is refused as damaged and left as it was."""
    sd = StateDir.open(tmp_path / "s")
    sd.checkpoints.write_bytes(b"this is not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"), open_agent(sd):
        pass
    assert sd.checkpoints.read_bytes() == b"this is not a database" * 100


def test_resume_with_an_agent_missing_the_pending_tool_is_refused(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A thread waiting on create_ticket cannot be resumed by an agent without that tool."""
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
        result = agent.start("go", thread_id="t1")
        n = len(result.interrupts[0].value["action_requests"])
        result = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}] * n})
        )
        assert result.status is RunStatus.WAITING_RECONCILIATION
    with open_agent(state_dir, tools=file_tools(state_dir.workspace)) as bare:
        with pytest.raises(ConfigError, match=r"effect\.create_ticket"):
            bare.resume("t1")
        status = bare.status("t1")
        assert status.status is RunStatus.INCOMPLETE
        assert status.error is not None and "effect.create_ticket" in status.error
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        assert agent.status("t1").status is RunStatus.WAITING_RECONCILIATION


def test_review_waiting_on_a_tool_the_agent_lacks_is_refused_and_loses_nothing(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Waiting at the review of send_email + write_file: an agent without mail must not run.

    It used to drop the send_email call silently, write the note and call the
    thread done without any mail (found by a fresh user resuming a thread that
    the library started, from the CLI, which rebuilt the agent without the
    demo services).
    """
    approve = {"decisions": [{"type": "approve"}]}
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        agent.start("go", thread_id="t1")
        second = agent.resume("t1", decisions=bound(agent, "t1", approve))  # the ticket
        names = [a["name"] for a in second.interrupts[0].value["action_requests"]]
        assert names == ["send_email", "write_file"]
    with open_agent(state_dir, tools=file_tools(state_dir.workspace)) as bare:
        status = bare.status("t1")
        assert status.status is RunStatus.INCOMPLETE
        assert "effect.send_email" in (status.error or "")
        # the tools the thread started with are recorded: a missing read tool
        # counts too (a pending read would be answered "unknown tool")
        assert "tool get_error_rate" in (status.error or "")
        assert "--with-services" in (status.error or "")
        for answer in (None, {"decisions": [{"type": "approve"}] * 2}, approve):
            with pytest.raises(ConfigError, match=r"effect\.send_email"):
                bare.resume("t1", decisions=bound(bare, "t1", answer))
        # the raw graph (no runner) refuses too, instead of dropping the call
        from langgraph.types import Command

        config = {"configurable": {"thread_id": "t1"}}
        interrupt_id = second.interrupts[0].id
        with pytest.raises(ConfigError, match="send_email"):
            bare.graph.invoke(
                Command(resume={interrupt_id: {"decisions": [{"type": "approve"}] * 2}}), config
            )
    assert not (state_dir.workspace / "incidents").exists()
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        done = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}] * 2})
        )
        assert done.status is RunStatus.DONE, done.error
    w = world(state_dir)
    assert (w.tickets, w.mails, len(w.files)) == (1, 1, 1)
