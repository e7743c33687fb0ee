"""A lease release that fails does not replace the run's own result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from effectgate import open_agent
from effectgate.errors import LedgerBusyError
from effectgate.graph import RunStatus
from effectgate.ledger import Lease
from effectgate.models import ScriptedChatModel

SCRIPT = {"name": "chat", "turns": [], "final": "nothing to write"}


def test_a_busy_release_is_a_note_on_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(tmp_path / "state", model=model, tools=[]) as agent:
        tried: list[Lease] = []

        def busy(lease: Lease) -> Any:
            tried.append(lease)
            raise LedgerBusyError("ledger stayed locked past the busy timeout")

        monkeypatch.setattr(agent.ledger, "release_lease", busy)
        result = agent.start("say hello", thread_id="t1")
        assert (result.status, result.final_message) == (RunStatus.DONE, "nothing to write")
        assert [lease.thread_id for lease in tried] == ["t1"]
        (note,) = result.notes
        assert "lease of thread 't1' could not be released" in note
        assert "locked past the busy timeout" in note and "expires by itself" in note

        monkeypatch.undo()
        again = agent.resume("t1")  # the same owner takes its own lease again
        assert (again.status, again.notes) == (RunStatus.DONE, [])
