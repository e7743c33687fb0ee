"""The app layer refuses state it cannot trust, before writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate._app import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError
from effectgate.graph import RunStatus
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


def test_corrupt_checkpoint_file_is_a_config_error(tmp_path: Path) -> None:
    """A checkpoint file that is not SQLite is refused and left as it was."""
    sd = StateDir.open(tmp_path / "s")
    sd.checkpoints.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="not a checkpoint database"), open_agent(sd):
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
        result = agent.resume("t1", decisions={"decisions": [{"type": "approve"}] * n})
        assert result.status is RunStatus.WAITING_RECONCILIATION
    with open_agent(state_dir, tools=file_tools(state_dir.workspace)) as bare:
        with pytest.raises(ConfigError, match=r"effect\.create_ticket"):
            bare.resume("t1")
        status = bare.status("t1")
        assert status.status is RunStatus.INCOMPLETE
        assert status.error is not None and "effect.create_ticket" in status.error
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        assert agent.status("t1").status is RunStatus.WAITING_RECONCILIATION
