"""A call a reviewer rejected or edited away is flagged when proposed again, and capped."""

from __future__ import annotations

from typing import Any

from effectgate import StateDir
from effectgate.cli._decisions import BlanketDecisions
from effectgate.graph import Policy, RunStatus
from tests.answers.test_binding import _agent, _files, _write


def _reject(reason: str) -> dict[str, Any]:
    return {"decisions": [{"type": "reject", "message": reason}], "reviewer": "rita"}


def test_a_rejected_call_proposed_again_is_flagged_then_refused(state_dir: StateDir) -> None:
    same = _write("a.txt", "spam\n")
    with _agent(state_dir, [[same]] * 5) as agent:
        (first,) = agent.start("write", thread_id="t").interrupts
        assert "repeat_of_rejected" not in first.value["action_requests"][0]
        (second,) = agent.resume("t", answers={first.id: _reject("no spam")}).interrupts
        (flag,) = [a["repeat_of_rejected"] for a in second.value["action_requests"]]
        rejected_op = first.value["action_requests"][0]["operation_id"]
        assert flag == {"operation_id": rejected_op, "reason": "no spam", "times_rejected": 1}
        notes: list[str] = []
        blanket = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
        assert blanket.review(second.value) is None and "rejected" in notes[0]
        stopped = agent.resume("t", answers={second.id: _reject("still no")})
        assert stopped.status is RunStatus.DONE and stopped.interrupts == []
        assert stopped.final_message is not None
        assert "rejected again; not executed; do not propose it again" in stopped.final_message
        proposals = [m for m in agent.messages("t") if getattr(m, "tool_calls", None)]
    assert len(proposals) == 3  # the third was answered without asking, and the run stopped
    assert _files(state_dir) == {}


def test_the_cap_is_a_policy(state_dir: StateDir) -> None:
    same = _write("a.txt", "spam\n")
    policy = Policy(approval_ttl=None, max_repeats_after_reject=1)
    with _agent(state_dir, [[same]] * 3, policy=policy) as agent:
        (first,) = agent.start("write", thread_id="t").interrupts
        stopped = agent.resume("t", answers={first.id: _reject("no")})
        assert stopped.status is RunStatus.DONE and stopped.interrupts == []
    assert _files(state_dir) == {}


def test_a_call_replaced_by_an_edit_is_flagged_when_proposed_again(state_dir: StateDir) -> None:
    original = _write("a.txt", "to alice\n")
    with _agent(state_dir, [[original], [original]]) as agent:
        (first,) = agent.start("write", thread_id="t").interrupts
        edit = {
            "decisions": [
                {
                    "type": "edit",
                    "edited_action": {"args": {"path": "b.txt", "content": "to bob\n"}},
                }
            ]
        }
        (second,) = agent.resume("t", answers={first.id: edit}).interrupts
        (action,) = second.value["action_requests"]
        edited_op = agent.ledger.list(thread_id="t")[0].operation_id
        assert action["replaced_by_edit"] == edited_op
        notes: list[str] = []
        blanket = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
        assert blanket.review(second.value) is None and "edit" in notes[0]
        kept = [
            e.detail
            for e in agent.ledger.events(operation_id=edited_op)
            if "replaced_args" in e.detail
        ]
    assert kept and kept[0]["replaced_args"] == {"path": "a.txt", "content": "to alice\n"}
    assert _files(state_dir) == {"b.txt": "to bob\n"}


def test_an_answer_to_a_shown_review_is_consumed_when_the_policy_changed(
    state_dir: StateDir,
) -> None:
    """Shown for review, then resumed by an agent that would auto-approve: the reject stands."""
    calls = [[_write("a.txt", "alpha\n")]]
    with _agent(state_dir, calls) as shown_by:
        (review,) = shown_by.start("write", thread_id="t").interrupts
    auto = Policy(approval_ttl=None, auto_approve=frozenset({"write_file"}))
    with _agent(state_dir, calls, policy=auto) as answered_by:
        done = answered_by.resume("t", answers={review.id: _reject("not today")})
        assert done.status is RunStatus.DONE
        (op,) = answered_by.ledger.list(thread_id="t")
        (approval,) = answered_by.ledger.approvals(op.operation_id)
    assert (op.state.value, approval.decision, approval.reviewer) == ("REJECTED", "reject", "rita")
    assert _files(state_dir) == {}


def test_respond_answers_the_model_in_the_tools_place(state_dir: StateDir) -> None:
    """HITL's ``respond``: nothing runs, the model reads the person's text, recorded as reject."""
    import json

    from langchain_core.messages import ToolMessage

    with _agent(state_dir, [[_write("a.txt", "alpha\n")]]) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        answer = {"decisions": [{"type": "respond", "message": "a.txt is already there"}]}
        assert agent.resume("t", answers={review.id: answer}).status is RunStatus.DONE
        (reply,) = [m for m in agent.messages("t") if isinstance(m, ToolMessage)]
        (op,) = agent.ledger.list(thread_id="t")
    payload = json.loads(str(reply.content))
    assert (reply.status, payload["message"], payload["executed"]) == (
        "success",
        "a.txt is already there",
        False,
    )
    assert op.state.value == "REJECTED"
    assert _files(state_dir) == {}
