"""A worker's --approve policy is the CLI's: a possible duplicate waits for a person."""

from __future__ import annotations

from typing import Any

from effectgate._app import StateDir, open_agent
from effectgate._workers import WorkerOptions, submit, work
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus
from effectgate.testing.oracle import world

TASK = "Check the order service's error rate and handle any incident."


def test_a_worker_with_approve_all_leaves_a_possible_duplicate_for_a_person(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The same incident submitted twice: one mail; the second thread's mail waits, said once.

    Before, ``effectgate worker --approve all`` approved every call of every
    review, the flagged one too, and the mail went out twice (its --help
    promised the opposite).
    """
    lines: list[dict[str, Any]] = []
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        submit(agent, TASK, thread_id="first")
        submit(agent, TASK, thread_id="second")
        opts = WorkerOptions(approve="all", until_idle=True, poll_s=0.05)
        work(agent, opts, say=lines.append)  # two scans: the second finds the review again
        notes = [line for line in lines if "left_for_review" in line]
        assert len(notes) == 1 and notes[0]["thread_id"] == "second"  # said once
        assert "possible duplicate" in notes[0]["left_for_review"]
        assert agent.status("first").status is RunStatus.DONE
        waiting = agent.status("second")
        assert waiting.status is RunStatus.WAITING_REVIEW
        (review,) = waiting.interrupts
        flagged = [a for a in review.value["action_requests"] if a.get("possible_duplicate_of")]
        assert "send_email" in [a["name"] for a in flagged]
        work(agent, opts, say=lines.append)  # another worker run: still left for a person
        assert agent.status("second").status is RunStatus.WAITING_REVIEW
    w = world(state_dir)
    assert (w.tickets, w.mails) == (1, 1)
