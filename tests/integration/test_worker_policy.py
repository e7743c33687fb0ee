"""A worker's --approve policy is the CLI's: a possible duplicate waits for a person."""

from __future__ import annotations

from typing import Any

from effectgate import StateDir, open_agent, submit
from effectgate.cli._workers import WorkerOptions, work
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


def test_an_approval_given_before_a_duplicate_ran_is_asked_again(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Both runs of one incident wait at their mail; the first sends; the second's answer is stale.

    The second review was shown without a duplicate flag (the first mail was
    only proposed then). An ``--approve all`` answer bound to that review
    sent a second mail (a fresh user). Now the review node sees the call is a
    possible duplicate that the answer was not shown, refuses the approval
    and asks again, with the flag; the blanket policy then leaves it.
    """
    from effectgate.answers import bind_decisions
    from effectgate.cli._decisions import BlanketDecisions

    def approve_all(request: Any) -> Any:
        n = len(request["action_requests"])
        return bind_decisions(request, {"decisions": [{"type": "approve"}] * n})

    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        waiting = {}
        for thread in ("d1", "d2"):
            result = agent.start(TASK, thread_id=thread)
            (pending,) = result.interrupts
            while "send_email" not in [a["name"] for a in pending.value["action_requests"]]:
                result = agent.resume(thread, answers={pending.id: approve_all(pending.value)})
                (pending,) = result.interrupts
            waiting[thread] = pending
            assert not any(a.get("possible_duplicate_of") for a in waiting[thread].value[
                "action_requests"])  # fmt: skip
        done = agent.resume("d1", answers={waiting["d1"].id: approve_all(waiting["d1"].value)})
        assert done.status is RunStatus.DONE
        stale = approve_all(waiting["d2"].value)  # bound to the review as it was shown
        again = agent.resume("d2", answers={waiting["d2"].id: stale})
        assert again.status is RunStatus.WAITING_REVIEW, again.error
        (review,) = again.interrupts
        assert "changed since this review was shown" in str(review.value.get("error"))
        flagged = [a for a in review.value["action_requests"] if a.get("possible_duplicate_of")]
        assert "send_email" in [a["name"] for a in flagged]
        notes: list[str] = []
        policy = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
        assert policy.review(review.value) is None and "possible duplicate" in notes[0]
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
