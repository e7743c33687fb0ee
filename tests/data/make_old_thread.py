"""Write the state directory that ``tests/integration/test_state_format.py`` reads back.

Run it with the effectgate whose on-disk format is to be kept readable, e.g.
the last commit before the messages channel became a ``DeltaChannel``::

    git worktree add /tmp/eg-old 6234fa0
    PYTHONPATH=/tmp/eg-old/src python tests/data/make_old_thread.py \
        tests/data/thread-0.1.0-add-messages

The thread writes ``a.txt`` (approved, done) and stops at the review of
``b.txt``; the test approves that one with today's effectgate.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.answers._bind import bound

import effectgate
from effectgate import open_agent
from effectgate.graph import Policy, RunStatus
from effectgate.models import ScriptedChatModel

SCRIPT = {
    "name": "two-files",
    "turns": [
        {
            "say": "Writing a.",
            "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "first\n"}}],
        },
        {
            "say": "Writing b.",
            "tool_calls": [
                {"name": "write_file", "args": {"path": "b.txt", "content": "second\n"}}
            ],
        },
    ],
    "final": "Both files written.",
}
APPROVE = {"decisions": [{"type": "approve"}], "reviewer": "fixture"}


def main(target: Path) -> None:
    """Create ``target`` (replacing it) holding thread ``old`` paused at its second review."""
    shutil.rmtree(target, ignore_errors=True)
    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(target, model=model, policy=Policy(approval_ttl=None)) as agent:
        first = agent.start("write a and b", thread_id="old")
        assert first.status is RunStatus.WAITING_REVIEW, first
        second = agent.resume("old", decisions=bound(agent, "old", APPROVE))
        assert second.status is RunStatus.WAITING_REVIEW, second
        assert second.interrupts[0].value["action_requests"][0]["args"]["path"] == "b.txt"
    for leftover in target.glob("*-wal"):
        raise SystemExit(f"{leftover} still exists: the files were not closed cleanly")
    # then record the commit by hand in WRITTEN_BY
    print(f"written by effectgate {effectgate.__version__} from {effectgate.__file__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
