"""What a raw LangGraph client shows: the standard HITL request carries the warnings.

Agent Chat UI, Agent Inbox and Studio render a review from ``name``, ``args``,
``description`` and ``allowed_decisions`` alone. Before, a possible duplicate
(``possible_duplicate_of``), the preview, the effect kind and the operation id
stayed in effectgate's own fields, so a reviewer there approved a repeat with
no warning; and an approval from such a client, which names no
``flags_shown``, was never judged against what it was shown.
"""

from __future__ import annotations

from typing import Any

from langgraph.types import Command

from effectgate import StateDir, open_agent
from effectgate.answers import REVIEW_FLAGS, description_flags, flag_text
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus
from effectgate.testing.oracle import world

TASK = "Check the order service's error rate and handle any incident."


def _raw(n: int) -> dict[str, Any]:
    """What Agent Chat UI sends: the decision types only, nothing bound."""
    return {"decisions": [{"type": "approve"}] * n}


def _wait_at_mail(agent: Any, thread: str) -> Any:
    result = agent.start(TASK, thread_id=thread)
    (pending,) = result.interrupts
    while "send_email" not in [a["name"] for a in pending.value["action_requests"]]:
        n = len(pending.value["action_requests"])
        result = agent.resume(thread, answers={pending.id: _raw(n)})
        (pending,) = result.interrupts
    return pending


def test_the_description_carries_the_duplicate_warning_first_then_preview_kind_and_id(
    services: DemoServices, state_dir: StateDir
) -> None:
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        first = _wait_at_mail(agent, "d1")
        agent.resume("d1", answers={first.id: _raw(len(first.value["action_requests"]))})
        second = _wait_at_mail(agent, "d2")  # shown after the first mail went out
    mail = next(a for a in second.value["action_requests"] if a["name"] == "send_email")
    assert mail["possible_duplicate_of"]
    text = mail["description"]
    lines = text.splitlines()
    assert lines[0] == f"WARNING: this call is {flag_text(mail, 'possible_duplicate_of')}."
    assert mail["possible_duplicate_of"] in lines[0]
    assert mail["preview"].strip().splitlines()[0] in text
    assert f"effect kind: {mail['effect_kind']}" in text
    assert f"Operation: {mail['operation_id']}" in text
    assert description_flags(mail) == ["possible_duplicate_of"]
    unflagged = next(a for a in first.value["action_requests"] if a["name"] == "send_email")
    assert not any(unflagged.get(f) for f in REVIEW_FLAGS)
    assert not unflagged["description"].startswith("WARNING")
    assert f"Operation: {unflagged['operation_id']}" in unflagged["description"]


def test_a_raw_approval_of_a_call_flagged_after_it_was_shown_is_asked_again(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Both runs wait at their mail, unflagged; the first sends; a raw approve of the second.

    The second review's description showed no warning. Before, a raw client's
    approval (no ``flags_shown``) was not judged and a second mail went out;
    now it counts as given with the flags its description carried (none), so
    the review node asks again with the warning, and nothing is sent.
    """
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        waiting = {thread: _wait_at_mail(agent, thread) for thread in ("d1", "d2")}
        for pending in waiting.values():
            assert not any(description_flags(a) for a in pending.value["action_requests"])
        n = len(waiting["d1"].value["action_requests"])
        assert agent.resume("d1", answers={waiting["d1"].id: _raw(n)}).status is RunStatus.DONE
        # The raw compiled graph, as the LangGraph server resumes it: no Agent binding.
        config = {"configurable": {"thread_id": "d2"}}
        agent.graph.invoke(Command(resume={waiting["d2"].id: _raw(n)}), config)
        again = agent.status("d2")
        assert again.status is RunStatus.WAITING_REVIEW, again.error
        (review,) = again.interrupts
        assert "changed since this review was shown" in str(review.value.get("error"))
        mail = next(a for a in review.value["action_requests"] if a["name"] == "send_email")
        assert description_flags(mail) == ["possible_duplicate_of"]  # now shown
        assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
        # Approved with the warning in its description: that approval stands.
        done = agent.resume("d2", answers={review.id: _raw(len(review.value["action_requests"]))})
        assert done.status is RunStatus.DONE, done.error
    assert world(state_dir).mails == 2  # the reviewer saw the warning and chose to send


def test_a_raw_approval_through_agent_resume_is_bound_to_the_description_it_was_shown(
    services: DemoServices, state_dir: StateDir
) -> None:
    with open_agent(state_dir, endpoints=services.endpoints) as agent:
        waiting = {thread: _wait_at_mail(agent, thread) for thread in ("d1", "d2")}
        n = len(waiting["d1"].value["action_requests"])
        agent.resume("d1", answers={waiting["d1"].id: _raw(n)})
        again = agent.resume("d2", answers={waiting["d2"].id: _raw(n)})
        assert again.status is RunStatus.WAITING_REVIEW, again.error
        (review,) = again.interrupts
        assert "changed since this review was shown" in str(review.value.get("error"))
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
