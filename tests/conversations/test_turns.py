"""Follow-up messages on a thread: the ledger's guarantees across turns, valid histories."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from effectgate import StateDir
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError
from effectgate.graph import Agent, RunStatus, history_problems
from effectgate.ledger import Approval, OpenRequest, OpState, SqliteLedger
from effectgate.testing.oracle import checkpoint_problems, world
from tests.conversations._scripts import (
    ALSO_LEAD,
    TASK,
    TICKET_AGAIN,
    approve_all,
    conversation_agent,
)


def test_three_turns_one_ticket_two_mails_valid_history_at_every_checkpoint(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Turn 2 adds a recipient; turn 3 asks again for turn 1's ticket and gets its receipt."""
    with conversation_agent(state_dir, services) as agent:
        first = approve_all(agent, agent.start(TASK, thread_id="c"))
        assert first.status is RunStatus.DONE, first.error
        assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)

        second = approve_all(agent, agent.send("c", ALSO_LEAD))
        assert second.status is RunStatus.DONE, second.error
        assert (world(state_dir).tickets, world(state_dir).mails) == (1, 2)

        third = approve_all(agent, agent.send("c", TICKET_AGAIN))
        assert third.status is RunStatus.DONE, third.error
        assert third.final_message == (
            "TICKET-1: create_ticket was not repeated: its earlier receipt (TICKET-1) was reused."
        )
        messages = agent.messages("c")
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 2, 0, 0)
    humans = [m.content for m in messages if isinstance(m, HumanMessage)]
    assert humans == [TASK, ALSO_LEAD, TICKET_AGAIN]  # each turn's message exactly once
    last_ticket = [m for m in messages if isinstance(m, ToolMessage) and m.name == "create_ticket"]
    assert json.loads(str(last_ticket[-1].content))["reused"] is True
    assert history_problems(messages, allow_pending=False) == []
    assert checkpoint_problems(state_dir.checkpoints, "c") == []
    with SqliteLedger(state_dir.ledger) as ledger:
        ops = ledger.list(thread_id="c")
    assert sorted(op.tool for op in ops) == ["create_ticket", "send_email", "send_email"]
    assert all(op.state is OpState.SUCCEEDED and op.attempt == 1 for op in ops)


def test_a_follow_up_while_a_review_waits_is_refused_and_changes_nothing(
    services: DemoServices, state_dir: StateDir
) -> None:
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        assert waiting.status is RunStatus.WAITING_REVIEW
        (review,) = waiting.interrupts
        before = agent.messages("c")
        with pytest.raises(ConfigError) as refused:
            agent.send("c", ALSO_LEAD)
        assert f"review {review.id} of create_ticket" in str(refused.value)
        assert "effectgate resume --thread c" in str(refused.value)
        assert "supersede" in str(refused.value)
        assert agent.messages("c") == before
        assert agent.status("c").interrupts == waiting.interrupts
        # the review is still answerable, and the thread finishes as if nothing was sent
        done = approve_all(agent, agent.status("c"))
    assert done.status is RunStatus.DONE
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)


def test_supersede_answers_calls_that_never_started_and_nothing_runs(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The ticket waiting at review is superseded: 0 tickets, 0 mails, history valid."""
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        result = agent.send("c", ALSO_LEAD, supersede=True)
        assert result.status is RunStatus.DONE, result.error
        messages = agent.messages("c")
        # answering the old review now is refused: it is no longer pending
        again = agent.resume("c")
    assert again.status is RunStatus.DONE
    answer = next(
        m
        for m in messages
        if isinstance(m, ToolMessage) and m.tool_call_id == action["tool_call_id"]
    )
    assert json.loads(str(answer.content))["status"] == "superseded"
    assert messages.index(answer) < [type(m) for m in messages].index(HumanMessage, 1)
    w = world(state_dir)
    assert (w.tickets, w.mails) == (0, 0)
    assert services.stats("tickets")["create_requests"] == 0
    assert history_problems(messages, allow_pending=False) == []
    assert checkpoint_problems(state_dir.checkpoints, "c") == []


def test_supersede_refuses_a_call_whose_operation_may_have_started(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A reviewed call another worker claimed (attempt 1) is never answered 'superseded'."""
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        # the reviewer approves; the process dies after the review is recorded
        # and another worker claims the operation (IN_FLIGHT, attempt 1)
        _record_approval_and_claim(agent, action)
        with pytest.raises(ConfigError, match="may have started"):
            agent.send("c", ALSO_LEAD, supersede=True)
        assert [m for m in agent.messages("c") if isinstance(m, HumanMessage)][1:] == []
    with SqliteLedger(state_dir.ledger) as ledger:
        op = ledger.get(action["operation_id"])
    assert op is not None and op.state is OpState.IN_FLIGHT and op.attempt == 1


def _record_approval_and_claim(agent: Agent, action: dict[str, Any]) -> None:
    spec = agent.parts.specs[str(action["name"])]
    args = dict(action["args"])
    op_id = str(action["operation_id"])
    ihash = str(action["intent_hash"])
    request = OpenRequest(
        operation_id=op_id,
        thread_id="c",
        tool_call_id=str(action["tool_call_id"]),
        tool=spec.name,
        tool_version=spec.version,
        args=args,
        intent_hash=ihash,
    )
    approval = Approval(
        operation_id=op_id,
        thread_id="c",
        tool_call_id=str(action["tool_call_id"]),
        decision="approve",
        intent_hash=ihash,
        reviewer="test",
        decided_at=agent.parts.clock.now(),
    )
    agent.ledger.record_review([request], [approval])
    agent.ledger.claim(op_id, attempt=1, worker="someone-else")


def test_start_again_resumes_with_the_same_task_and_names_both_otherwise(
    services: DemoServices, state_dir: StateDir
) -> None:
    with conversation_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="c")
        assert waiting.status is RunStatus.WAITING_REVIEW
        again = agent.start(TASK, thread_id="c")  # a retried start: the same thread, no new run
        assert again.status is RunStatus.WAITING_REVIEW
        assert again.interrupts == waiting.interrupts
        with pytest.raises(ConfigError) as other:
            agent.start("Something else.", thread_id="c")
        assert repr(TASK) in str(other.value) and "'Something else.'" in str(other.value)
        with pytest.raises(ConfigError, match="follow-up turns"):
            agent.start(TASK, thread_id="c#turn-2")
        done = approve_all(agent, again)
        humans = [m.content for m in agent.messages("c") if isinstance(m, HumanMessage)]
    assert done.status is RunStatus.DONE
    assert humans == [TASK]
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)


def test_resume_of_a_thread_never_recorded_prints_how_to_start_it(state_dir: StateDir) -> None:
    from tests.cli.conftest import eg

    ran = eg("resume", "--thread", "ghost", "--state-dir", str(state_dir.root))
    assert ran.code == 2
    text = " ".join(ran.stderr.split())
    assert "never recorded" in text
    assert f"effectgate run --thread ghost --model SPEC TASK --state-dir {state_dir.root}" in text


def test_a_request_id_reused_with_another_message_is_refused_naming_both(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A request id names one message: the same id with other text is refused, nothing lost."""
    with conversation_agent(state_dir, services) as agent:
        assert approve_all(agent, agent.start(TASK, thread_id="c")).status is RunStatus.DONE
        sent = approve_all(agent, agent.send("c", ALSO_LEAD, request_id="req-1"))
        assert sent.status is RunStatus.DONE, sent.error
        retried = agent.send("c", ALSO_LEAD, request_id="req-1")  # a retry: nothing new
        assert retried.status is RunStatus.DONE
        with pytest.raises(ConfigError) as refused:
            agent.send("c", TICKET_AGAIN, request_id="req-1")
        text = str(refused.value)
        assert "'req-1'" in text and repr(ALSO_LEAD) in text and repr(TICKET_AGAIN) in text
        humans = [m.content for m in agent.messages("c") if isinstance(m, HumanMessage)]
    assert humans == [TASK, ALSO_LEAD]
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 2)
