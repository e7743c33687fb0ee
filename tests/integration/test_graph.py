"""The agent graph in one process: review decisions, resumes, replays, forks, malformed output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError, DecisionError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel
from effectgate.testing import FakeClock
from effectgate.testing.oracle import checkpoint_problems, world

TASK = "Check the order service and handle any incident."
APPROVE_ALL = "approve"


@contextmanager
def make_agent(
    sd: StateDir,
    svc: DemoServices,
    *,
    script: dict[str, Any] | str = "incident",
    policy: Policy | None = None,
    clock: FakeClock | None = None,
    fresh_ids: bool = False,
    on_event: Any = None,
) -> Iterator[Agent]:
    from effectgate.models import load_script

    model = ScriptedChatModel.from_script(
        load_script(script) if isinstance(script, str) else script, fresh_ids=fresh_ids
    )
    with open_agent(
        sd, model=model, endpoints=svc.endpoints, policy=policy, clock=clock, on_event=on_event
    ) as agent:
        yield agent


def decide(result: Any, *kinds: str | dict[str, Any]) -> dict[str, Any]:
    (pending,) = result.interrupts
    n = len(pending.value["action_requests"])
    if len(kinds) == 1 and n > 1:
        kinds = kinds * n
    return {
        "decisions": [{"type": k} if isinstance(k, str) else k for k in kinds],
        "reviewer": "test",
    }


def run_approving(agent: Agent, thread: str = "t1") -> Any:
    result = agent.start(TASK, thread_id=thread)
    while result.status is RunStatus.WAITING_REVIEW:
        result = agent.resume(thread, decisions=bound(agent, thread, decide(result, APPROVE_ALL)))
    return result


def tool_messages(agent: Agent, thread: str = "t1") -> list[ToolMessage]:
    return [m for m in agent.messages(thread) if isinstance(m, ToolMessage)]


def test_happy_path_and_resume_after_done_does_nothing(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Approving every call yields one ticket, one mail, one note; resuming again writes nothing."""
    with make_agent(state_dir, services) as agent:
        result = run_approving(agent)
        assert result.status is RunStatus.DONE
        assert "TICKET-1" in (result.final_message or "")
        before = services.stats("tickets")["create_requests"]
        again = agent.resume("t1")
        assert again.status is RunStatus.DONE
    w = world(state_dir)
    assert (w.tickets, w.mails, list(w.files)) == (1, 1, ["incidents/orders-error-rate.md"])
    assert services.stats("tickets")["create_requests"] == before == 1
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_review_request_shape(services: DemoServices, state_dir: StateDir) -> None:
    """The interrupt carries args, preview, kind, operation id, intent hash, allowed decisions."""
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        assert result.status is RunStatus.WAITING_REVIEW
        request = result.interrupts[0].value
        (action,) = request["action_requests"]
        assert action["name"] == "create_ticket"
        assert action["operation_id"] == "ticket:orders-error-rate"
        assert len(action["intent_hash"]) == 64
        assert action["effect_kind"] == "keyed"
        assert "orders: error rate above 5%" in action["preview"]
        assert action["possible_duplicate_of"] is None
        assert request["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"]
    assert world(state_dir).tickets == 0


def test_approve_one_reject_other(services: DemoServices, state_dir: StateDir) -> None:
    """Of two parallel calls, the approved one runs and the rejected one is answered, not run."""
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, APPROVE_ALL)))
        names = [a["name"] for a in result.interrupts[0].value["action_requests"]]
        assert names == ["send_email", "write_file"]
        result = agent.resume(
            "t1",
            decisions=bound(
                agent,
                "t1",
                decide(result, "approve", {"type": "reject", "message": "no note today"}),
            ),
        )
        assert result.status is RunStatus.DONE
        rejected = [m for m in tool_messages(agent) if m.name == "write_file"]
        assert len(rejected) == 1 and rejected[0].status == "error"
        assert "no note today" in str(rejected[0].content)
        assert "not executed" in str(rejected[0].content)
        ops = {op.tool: op.state for op in agent.ledger.list(thread_id="t1")}
    assert ops["write_file"] is OpState.REJECTED and ops["send_email"] is OpState.SUCCEEDED
    w = world(state_dir)
    assert (w.mails, w.files) == (1, {})
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_edit_runs_edited_args_and_tells_the_model(
    services: DemoServices, state_dir: StateDir
) -> None:
    """An edit binds the approval to the new args: they run, and the model is told truthfully."""
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, APPROVE_ALL)))
        original = result.interrupts[0].value["action_requests"][1]
        edit = {
            "type": "edit",
            "edited_action": {
                "name": "write_file",
                "args": {"path": "notes/x.md", "content": "hi"},
            },
        }
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, "approve", edit)))
        assert result.status is RunStatus.DONE
        (msg,) = [m for m in tool_messages(agent) if m.name == "write_file"]
        body = json.loads(str(msg.content))
        assert "replaced this tool call" in body["note"] and "notes/x.md" in body["note"]
        (op,) = agent.ledger.list(thread_id="t1", tool="write_file")
        assert op.args == {"path": "notes/x.md", "content": "hi"}
        assert op.intent_hash != original["intent_hash"]
        approval = agent.ledger.latest_approval(op.operation_id)
        assert approval is not None and approval.decision == "edit"
        assert approval.intent_hash == op.intent_hash and approval.reviewer == "test"
    assert world(state_dir).files == {"notes/x.md": b"hi"}


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ({"decisions": []}, "0 decision"),
        ([{"type": "approve"}], "must look like"),
        ({"decisions": [{"type": "maybe"}]}, "not allowed"),
        ({"decisions": [{"type": "edit"}]}, "edited_action"),
    ],
)
def test_malformed_resume_is_refused_and_dispatches_nothing(
    services: DemoServices, state_dir: StateDir, answer: Any, match: str
) -> None:
    """A resume of the wrong shape raises DecisionError; the thread still waits; nothing ran."""
    with make_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="t1")
        with pytest.raises(DecisionError, match=match):
            agent.resume("t1", decisions=bound(agent, "t1", answer))
        status = agent.status("t1")
        assert status.status is RunStatus.WAITING_REVIEW
        assert agent.ledger.list(thread_id="t1") == []
        done = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
        )
        assert done.status is RunStatus.WAITING_REVIEW  # now at the mail/note review
    assert world(state_dir).tickets == 1


def test_edit_with_schema_invalid_args_is_asked_again(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Edited args the tool schema refuses: the node asks again with the error, runs nothing."""
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        bad = {
            "type": "edit",
            "edited_action": {"name": "create_ticket", "args": {"title": "x", "severity": "??"}},
        }
        result = agent.resume("t1", decisions=bound(agent, "t1", {"decisions": [bad]}))
        assert result.status is RunStatus.WAITING_REVIEW
        assert "edited arguments refused" in result.interrupts[0].value["error"]
        assert agent.ledger.list(thread_id="t1") == []
    assert world(state_dir).tickets == 0


def test_expired_approval_goes_back_to_review(services: DemoServices, state_dir: StateDir) -> None:
    """An approval that expires before the effect starts is withdrawn and asked again."""
    from langgraph.types import Command

    clock = FakeClock()
    policy = Policy(approval_ttl=timedelta(minutes=5))
    with make_agent(state_dir, services, policy=policy, clock=clock) as agent:
        result = agent.start(TASK, thread_id="t1")
        config = {"configurable": {"thread_id": "t1"}}
        # pause right after the review superstep, as a process stopped there would
        agent.graph.invoke(
            Command(resume={result.interrupts[0].id: decide(result, APPROVE_ALL)}),
            config,
            interrupt_after=["review"],
            durability="sync",
        )
        assert world(state_dir).tickets == 0
        clock.advance(timedelta(minutes=10))
        result = agent.resume("t1")
        assert result.status is RunStatus.WAITING_REVIEW
        action = result.interrupts[0].value["action_requests"][0]
        assert action["name"] == "create_ticket" and "expired" in action["description"]
        assert world(state_dir).tickets == 0
        (op,) = agent.ledger.list(thread_id="t1")
        assert op.state is OpState.PROPOSED
        result = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
        )
        assert result.status is RunStatus.WAITING_REVIEW  # mail + note now
    assert world(state_dir).tickets == 1


def test_replay_from_every_checkpoint_changes_nothing(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Time travel to any checkpoint of a finished thread repeats no effect."""
    with make_agent(state_dir, services) as agent:
        assert run_approving(agent).status is RunStatus.DONE
        before = world(state_dir)
        config = {"configurable": {"thread_id": "t1"}}
        checkpoints = [
            s.config["configurable"]["checkpoint_id"] for s in agent.graph.get_state_history(config)
        ]
        assert len(checkpoints) > 8
        for cid in checkpoints:
            result = agent.replay("t1", cid)
            while result.status is RunStatus.WAITING_REVIEW:
                result = agent.resume(
                    "t1", decisions=bound(agent, "t1", decide(result, APPROVE_ALL))
                )
            assert result.status is RunStatus.DONE, (cid, result)
        assert services.stats("tickets")["create_requests"] == 1
    after = world(state_dir)
    assert after == before


def test_replay_with_new_call_ids_flags_possible_duplicates(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A model that re-proposes the same writes with new ids gets them flagged, never auto-run."""
    with make_agent(state_dir, services, fresh_ids=True) as agent:
        assert run_approving(agent).status is RunStatus.DONE
        config = {"configurable": {"thread_id": "t1"}}
        history = list(agent.graph.get_state_history(config))
        before_mail = next(
            s
            for s in history
            if s.next == ("agent",)
            and any(
                isinstance(m, ToolMessage) and m.name == "create_ticket"
                for m in s.values["messages"]
            )
            and not any(
                isinstance(m, ToolMessage) and m.name == "send_email" for m in s.values["messages"]
            )
        )
        result = agent.replay("t1", before_mail.config["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW
        actions = result.interrupts[0].value["action_requests"]
        assert all(a["possible_duplicate_of"] for a in actions), actions
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, "reject")))
        assert result.status is RunStatus.DONE
    w = world(state_dir)
    assert (w.tickets, w.mails) == (1, 1)


def test_fork_with_edited_args_surfaces_conflict(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A fork that edits the args of an executed call is a conflict: not run, not reused."""
    with make_agent(state_dir, services) as agent:
        assert run_approving(agent).status is RunStatus.DONE
        config = {"configurable": {"thread_id": "t1"}}
        snap = next(
            s
            for s in agent.graph.get_state_history(config)
            if s.next == ("review",)
            and any(tc["name"] == "create_ticket" for tc in s.values["messages"][-1].tool_calls)
        )
        ai: AIMessage = snap.values["messages"][-1]
        call = dict(ai.tool_calls[0])
        call["args"] = {**call["args"], "title": "a different title"}
        forked = agent.graph.update_state(
            snap.config,
            {"messages": [ai.model_copy(update={"tool_calls": [call]})]},
            as_node="agent",
        )
        result = agent.replay("t1", forked["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["conflict"] is not None
        assert result.interrupts[0].value["review_configs"][0]["allowed_decisions"] == [
            "edit",
            "reject",
        ]
        with pytest.raises(DecisionError):
            agent.resume("t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]}))
        result = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "reject"}]})
        )
    w = world(state_dir)
    assert w.tickets == 1 and services.stats("tickets")["create_requests"] == 1


MALFORMED = {
    "name": "malformed",
    "turns": [
        {
            "say": "trying things",
            "tool_calls": [
                {"name": "no_such_tool", "args": {}},
                {"name": "write_file", "args": {"path": "../escape.txt", "content": "x"}},
                {"name": "write_file", "args": {"path": "ok.txt", "content": "fine"}, "id": None},
                {"name": "write_file", "args": "{not json"},
            ],
        },
        {"say": "done"},
    ],
}


def test_malformed_model_output_becomes_error_messages(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Unknown tools, bad args, unparsable args and missing ids never crash or lose the thread."""
    with make_agent(state_dir, services, script=MALFORMED) as agent:
        result = agent.start("go", thread_id="t1")
        assert result.status is RunStatus.WAITING_REVIEW
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["args"]["path"] == "ok.txt" and action["tool_call_id"].startswith("call_eg")
        result = agent.resume(
            "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
        )
        assert result.status is RunStatus.DONE
        errors = [json.loads(str(m.content)) for m in tool_messages(agent) if m.status == "error"]
        text = " ".join(e.get("error", "") for e in errors)
        assert "unknown tool 'no_such_tool'" in text
        assert "invalid arguments" in text and "parse" in text
        assert len(tool_messages(agent)) == 4
    assert world(state_dir).files == {"ok.txt": b"fine"}
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_unknown_outcome_parks_then_human_verdict(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A timeout after the commit with lookups down -> NEEDS_RECONCILIATION, then a verdict."""
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, APPROVE_ALL)))
        assert result.status is RunStatus.WAITING_RECONCILIATION
        (pending,) = result.interrupts
        assert pending.value["operation_id"] == "ticket:orders-error-rate"
        assert "lookup unavailable" in pending.value["evidence"]["why"]
        (op,) = agent.ledger.list(thread_id="t1")
        assert (op.state, op.attempt) == (OpState.NEEDS_RECONCILIATION, 1)
        assert world(state_dir).tickets == 1  # the oracle sees what the agent cannot
        with pytest.raises(DecisionError):
            agent.resume("t1", verdicts={op.operation_id: {"verdict": "retry"}})
        with pytest.raises(DecisionError, match="no pending reconciliation"):
            agent.resume("t1", verdicts={"nope": {"verdict": "failed"}})
        with pytest.raises(DecisionError, match="no review is pending"):
            agent.resume("t1", decisions=bound(agent, "t1", {"decisions": []}))
        result = agent.resume(
            "t1",
            verdicts={
                op.operation_id: {
                    "verdict": "succeeded",
                    "reference": "TICKET-1",
                    "evidence": "seen in the ticket UI",
                }
            },
        )
        # the human's receipt carries their reference, not the service's response body,
        # so the scripted model stops honestly instead of guessing the ticket number
        assert result.status is RunStatus.DONE
        (op,) = agent.ledger.list(thread_id="t1")
        assert op.state is OpState.SUCCEEDED and op.receipt is not None
        assert op.receipt.source == "human" and op.receipt.reference == "TICKET-1"
        (msg,) = [m for m in tool_messages(agent) if m.name == "create_ticket"]
        assert json.loads(str(msg.content))["settled_by"] == "human"


def test_verdict_applied_outside_the_graph_is_picked_up(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A verdict written straight to the ledger (CLI reconcile) lets resume go on without asking."""
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        result = agent.resume("t1", decisions=bound(agent, "t1", decide(result, APPROVE_ALL)))
        assert result.status is RunStatus.WAITING_RECONCILIATION
        verdict = {"verdict": "failed", "evidence": "not in the ticket UI"}
        with pytest.raises(DecisionError, match="the lookup cannot tell now"):
            agent.dispatcher.apply_verdict("ticket:orders-error-rate", verdict)  # unchecked
        agent.dispatcher.apply_verdict(
            "ticket:orders-error-rate", {**verdict, "acknowledge_duplicate_risk": True}
        )
        result = agent.resume("t1")
        assert result.status is RunStatus.DONE
        (msg,) = [m for m in tool_messages(agent) if m.name == "create_ticket"]
        assert json.loads(str(msg.content))["status"] == "failed"
        assert "cannot continue" in (result.final_message or "")


def test_resume_with_no_checkpoint_restarts_from_recorded_input(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A run that died before its first checkpoint restarts from the input the ledger kept."""
    with make_agent(state_dir, services) as agent:
        agent.ledger.record_thread("t2", {"task": TASK})  # as if killed right after this
        assert agent.status("t2").status is RunStatus.NOT_STARTED
        result = agent.resume("t2")
        assert result.status is RunStatus.WAITING_REVIEW
        first = agent.messages("t2")[0]
        assert first.content == TASK
        with pytest.raises(ConfigError, match="unknown thread"):
            agent.resume("never-started")


def test_same_task_in_a_second_thread_flags_duplicates(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A second run of the same incident: the ticket is reused, the mail and note are flagged."""
    with make_agent(state_dir, services) as agent:
        assert run_approving(agent, "t1").status is RunStatus.DONE
        first = {op.tool: op.operation_id for op in agent.ledger.list(thread_id="t1")}
        result = agent.start(TASK, thread_id="t2")
        # create_ticket maps onto the settled ticket:orders-error-rate: nobody is asked
        assert result.status is RunStatus.WAITING_REVIEW
        actions = result.interrupts[0].value["action_requests"]
        assert [a["name"] for a in actions] == ["send_email", "write_file"]
        assert [a["possible_duplicate_of"] for a in actions] == [
            first["send_email"],
            first["write_file"],
        ]
        result = agent.resume("t2", decisions=bound(agent, "t2", decide(result, "reject")))
        assert result.status is RunStatus.DONE
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
    assert services.stats("tickets")["create_requests"] == 1


def test_stop_requested_before_a_run_applies_to_that_run(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A stop asked between runs (a signal while waiting for the lease) is not lost."""
    with make_agent(state_dir, services) as agent:
        result = agent.start(TASK, thread_id="t1")
        answer = decide(result, APPROVE_ALL)
        agent.request_stop("test: stop")
        result = agent.resume("t1", decisions=bound(agent, "t1", answer))
        # stopped at the first boundary: nothing ran, the review still waits
        assert result.status is RunStatus.WAITING_REVIEW and "test: stop" in (result.error or "")
        assert agent.ledger.list(thread_id="t1") == [] and world(state_dir).tickets == 0
        result = agent.resume(
            "t1", decisions=bound(agent, "t1", answer)
        )  # the stop was for that run only
        assert result.status is RunStatus.WAITING_REVIEW and result.error is None
        assert world(state_dir).tickets == 1


AUTO = {
    "name": "auto",
    "turns": [
        {"tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "x"}}]},
        {"tool_calls": [{"name": "append_file", "args": {"path": "a.txt", "content": "y"}}]},
        {"say": "done"},
    ],
}


def test_policy_auto_approves_but_never_an_unsafe_tool(
    services: DemoServices, state_dir: StateDir
) -> None:
    """auto_approve runs write_file without asking; append_file (unsafe) is still reviewed."""
    policy = Policy(auto_approve=frozenset({"write_file", "append_file"}))
    with make_agent(state_dir, services, script=AUTO, policy=policy) as agent:
        result = agent.start("go", thread_id="t1")
        assert result.status is RunStatus.WAITING_REVIEW
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["name"] == "append_file"
        assert world(state_dir).files == {"a.txt": b"x"}
        (op,) = agent.ledger.list(thread_id="t1", tool="write_file")
        approval = agent.ledger.latest_approval(op.operation_id)
        assert approval is not None and approval.reviewer == "policy:auto"
