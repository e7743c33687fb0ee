"""Operation ids chosen by the review: a key known not to have taken effect swallows no call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel
from tests.answers._bind import bound
from tests.integration._approvals import record_approval

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.graph import Agent, RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel, load_script
from effectgate.testing.oracle import checkpoint_problems
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

TASK = "Check the order service and handle any incident."
KEY = "ticket:orders-error-rate"
APPROVE = {"decisions": [{"type": "approve"}], "reviewer": "test"}
REJECT = {"decisions": [{"type": "reject", "message": "not now"}], "reviewer": "test"}


@contextmanager
def incident_agent(
    sd: StateDir, svc: DemoServices, *, alert_id: str = "orders-error-rate"
) -> Iterator[Agent]:
    script = load_script("incident")
    script["turns"][1]["tool_calls"][0]["args"]["alert_id"] = alert_id
    model = ScriptedChatModel.from_script(script)
    with open_agent(sd, model=model, endpoints=svc.endpoints) as agent:
        yield agent


def actions(result: Any) -> list[dict[str, Any]]:
    (pending,) = result.interrupts
    found: list[dict[str, Any]] = pending.value["action_requests"]
    return found


def ticket_keys(sd: StateDir) -> list[str]:
    return [str(t["idempotency_key"]) for t in read_tickets(sd.services)]


def test_rejected_key_is_reviewed_again_in_another_thread(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A ticket rejected on Monday is asked for again on Tuesday under ``<key>#2``; it runs once."""
    with incident_agent(state_dir, services) as agent:
        monday = agent.start(TASK, thread_id="monday")
        assert [a["operation_id"] for a in actions(monday)] == [KEY]
        assert (
            agent.resume("monday", decisions=bound(agent, "monday", REJECT)).status
            is RunStatus.DONE
        )
        rejected = agent.ledger.get(KEY)
        assert rejected is not None and rejected.state is OpState.REJECTED

        tuesday = agent.start(TASK, thread_id="tuesday")
        assert tuesday.status is RunStatus.WAITING_REVIEW
        (action,) = actions(tuesday)
        assert (action["name"], action["operation_id"]) == ("create_ticket", f"{KEY}#2")
        tuesday = agent.resume("tuesday", decisions=bound(agent, "tuesday", APPROVE))
        assert tuesday.status is RunStatus.WAITING_REVIEW  # now the mail and the note
        assert ticket_keys(state_dir) == [f"{KEY}#2"]

        retried = agent.ledger.get(f"{KEY}#2")
        assert retried is not None and retried.state is OpState.SUCCEEDED
        assert retried.thread_id == "tuesday"
        rejected = agent.ledger.get(KEY)
        assert rejected is not None and rejected.state is OpState.REJECTED
        assert rejected.thread_id == "monday"

        # Monday's own call still reads back as rejected: resumed or replayed
        # from any checkpoint, it asks nobody and runs nothing.
        assert agent.resume("monday").status is RunStatus.DONE
        config = {"configurable": {"thread_id": "monday"}}
        for snap in list(agent.graph.get_state_history(config)):
            replay = agent.replay("monday", snap.config["configurable"]["checkpoint_id"])
            assert replay.status is RunStatus.DONE, replay
        assert [op.operation_id for op in agent.ledger.list(thread_id="monday")] == [KEY]
        assert checkpoint_problems(state_dir.checkpoints, "monday") == []
    assert services.stats("tickets")["create_requests"] == 1
    assert ticket_keys(state_dir) == [f"{KEY}#2"]


def test_edit_onto_a_rejected_key_opens_a_fresh_operation(
    services: DemoServices, state_dir: StateDir
) -> None:
    """An edit onto a key another call had rejected runs under ``<key>#2``, reviewed once."""
    with incident_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="monday")
        agent.resume("monday", decisions=bound(agent, "monday", REJECT))
    with incident_agent(state_dir, services, alert_id="orders-errors") as agent:
        (action,) = actions(agent.start(TASK, thread_id="tuesday"))
        assert action["operation_id"] == "ticket:orders-errors"
        edited = {**action["args"], "alert_id": "orders-error-rate"}
        edit = {"type": "edit", "edited_action": {"name": "create_ticket", "args": edited}}
        result = agent.resume("tuesday", decisions=bound(agent, "tuesday", {"decisions": [edit]}))
        assert result.status is RunStatus.WAITING_REVIEW  # the mail and the note
        op = agent.ledger.get(f"{KEY}#2")
        assert op is not None and op.state is OpState.SUCCEEDED
        assert (op.thread_id, op.args["alert_id"]) == ("tuesday", "orders-error-rate")
        assert agent.ledger.get("ticket:orders-errors") is None
        rejected = agent.ledger.get(KEY)
        assert rejected is not None and rejected.state is OpState.REJECTED
    (ticket,) = read_tickets(state_dir.services)
    assert (ticket["idempotency_key"], ticket["alert_id"]) == (f"{KEY}#2", "orders-error-rate")


def test_failed_key_stays_failed_for_a_later_thread(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A ticket the service refused for good stays FAILED for a new run of
    the same task (its stored outcome and budget hold until an explicit act): no ``#2``."""
    services.set_fault("tickets", "reject")
    with incident_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="monday")
        assert (
            agent.resume("monday", decisions=bound(agent, "monday", APPROVE)).status
            is RunStatus.DONE
        )
        failed = agent.ledger.get(KEY)
        assert failed is not None and failed.state is OpState.FAILED

        services.set_fault("tickets", "normal")
        agent.start(TASK, thread_id="tuesday")
        assert agent.ledger.get(f"{KEY}#2") is None
        after = agent.ledger.get(KEY)
        assert after is not None and after.state is OpState.FAILED
        assert after.attempt == failed.attempt
    assert ticket_keys(state_dir) == []


def test_succeeded_key_is_still_shared_across_threads(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A ticket that was created is reused by a second thread: nobody is asked, nothing is sent."""
    with incident_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="monday")
        result = agent.resume("monday", decisions=bound(agent, "monday", APPROVE))
        result = agent.resume(
            "monday", decisions=bound(agent, "monday", {"decisions": [{"type": "approve"}] * 2})
        )
        assert result.status is RunStatus.DONE

        tuesday = agent.start(TASK, thread_id="tuesday")
        assert [a["name"] for a in actions(tuesday)] == ["send_email", "write_file"]
        # the result names monday's ticket operation as one tuesday met by its key
        assert [op.operation_id for op in tuesday.shared_operations] == [KEY]
        assert [op.thread_id for op in tuesday.shared_operations] == ["monday"]
        assert all(op.thread_id == "tuesday" for op in tuesday.operations)
        assert [op.operation_id for op in agent.status("tuesday").shared_operations] == [KEY]
        reject_both = {"decisions": [{"type": "reject"}] * 2}
        assert (
            agent.resume("tuesday", decisions=bound(agent, "tuesday", reject_both)).status
            is RunStatus.DONE
        )
        assert agent.ledger.get(f"{KEY}#2") is None
        assert agent.ledger.list(thread_id="tuesday", tool="create_ticket") == []
        (reply,) = [
            m
            for m in agent.messages("tuesday")
            if isinstance(m, ToolMessage) and m.name == "create_ticket"
        ]
        assert json.loads(str(reply.content))["status"] == "succeeded"
        # the audit trail says which thread the stored receipt was handed to
        reused = [
            e.detail.get("thread_id")
            for e in agent.ledger.events(operation_id=KEY)
            if e.kind.value == "result_reused"
        ]
        assert reused == ["tuesday"]
    assert services.stats("tickets")["create_requests"] == 1
    assert ticket_keys(state_dir) == [KEY]


class NoteArgs(BaseModel):
    text: str


def _note_agent(sd: StateDir, effects: Path, call_id: str) -> Any:
    """An agent whose only tool appends one line per effect to ``effects`` (the outside world)."""

    def note(args: NoteArgs, ctx: ToolContext) -> ToolResult:
        line = {"thread_id": ctx.thread_id, "operation_id": ctx.operation_id, "text": args.text}
        with effects.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return ToolResult(value={"written": True})

    spec = ToolSpec(
        name="note",
        description="Record a note.",
        args_schema=NoteArgs,
        func=note,
        kind=EffectKind.IDEMPOTENT,
    )
    script = {
        "name": "note",
        "turns": [{"tool_calls": [{"name": "note", "args": {"text": "hi"}, "id": call_id}]}],
    }
    return open_agent(sd, model=ScriptedChatModel.from_script(script), tools=[spec])


def test_colliding_thread_scoped_ids_get_distinct_operations(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """Thread ``x`` + call ``y:call_1`` and thread ``x:y`` + call ``call_1`` both take effect."""
    effects = tmp_path / "effects.jsonl"
    for thread, call_id in [("x", "y:call_1"), ("x:y", "call_1")]:
        with _note_agent(state_dir, effects, call_id) as agent:
            result = agent.start("go", thread_id=thread)
            assert result.status is RunStatus.WAITING_REVIEW, (thread, result)
            assert (
                agent.resume(thread, decisions=bound(agent, thread, APPROVE)).status
                is RunStatus.DONE
            )
    lines = [json.loads(line) for line in effects.read_text(encoding="utf-8").splitlines()]
    assert [(e["thread_id"], e["operation_id"]) for e in lines] == [
        ("x", "x:y:call_1"),
        ("x:y", "x:y:call_1#2"),
    ]
    with _note_agent(state_dir, effects, "call_1") as agent:
        for thread, call_id in [("x", "y:call_1"), ("x:y", "call_1")]:
            (op,) = agent.ledger.list(thread_id=thread)
            assert (op.tool_call_id, op.state) == (call_id, OpState.SUCCEEDED)
        # Both threads resumed again: each reads its own operation back, nothing runs.
        for thread in ("x", "x:y"):
            assert agent.resume(thread).status is RunStatus.DONE
    assert len(effects.read_text(encoding="utf-8").splitlines()) == 2


def test_a_reject_in_one_thread_leaves_another_threads_approved_key_alone(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Monday approved the ticket (recorded, not yet run); Tuesday's reviewer says no to
    Tuesday's call with the same key. That "no" answers Tuesday's call only: Monday's
    approved ticket still runs, once."""
    with incident_agent(state_dir, services) as agent:
        monday = agent.start(TASK, thread_id="monday")
        (req,) = actions(monday)
        # Monday's approval is in the ledger; its effect has not run (a crash right
        # after the review was recorded leaves exactly this).
        record_approval(
            agent.ledger, req, thread_id="monday", tool="create_ticket", reviewer="monday-reviewer"
        )
        tuesday = agent.start(TASK, thread_id="tuesday")
        assert [a["operation_id"] for a in actions(tuesday)] == [KEY]  # shared: APPROVED
        agent.resume("tuesday", decisions=bound(agent, "tuesday", REJECT))
        op = agent.ledger.get(KEY)
        assert op is not None and op.state is OpState.APPROVED
        agent.resume("monday")  # Monday's review is decided: its recorded approval runs
        op = agent.ledger.get(KEY)
        assert op is not None and op.state is OpState.SUCCEEDED
    assert ticket_keys(state_dir) == [KEY]


def test_an_approval_binds_to_the_operation_id_shown(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Tuesday and Wednesday are both shown ``#2``; Tuesday's reviewer rejects it, so
    Wednesday's call now maps to ``#3``: Wednesday's approval of ``#2`` is refused and
    the review asked again, showing ``#3``; approving that creates the one ticket."""
    with incident_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="monday")
        agent.resume("monday", decisions=bound(agent, "monday", REJECT))
        tuesday = agent.start(TASK, thread_id="tuesday")
        wednesday = agent.start(TASK, thread_id="wednesday")
        assert [a["operation_id"] for a in actions(tuesday)] == [f"{KEY}#2"]
        assert [a["operation_id"] for a in actions(wednesday)] == [f"{KEY}#2"]
        agent.resume("tuesday", decisions=bound(agent, "tuesday", REJECT))
        asked_again = agent.resume("wednesday", decisions=bound(agent, "wednesday", APPROVE))
        assert asked_again.status is RunStatus.WAITING_REVIEW
        (pending,) = asked_again.interrupts
        assert "operation ids changed since they were shown" in pending.value["error"]
        assert [a["operation_id"] for a in actions(asked_again)] == [f"{KEY}#3"]
        assert ticket_keys(state_dir) == []
        agent.resume("wednesday", decisions=bound(agent, "wednesday", APPROVE))
    assert ticket_keys(state_dir) == [f"{KEY}#3"]


@pytest.mark.parametrize("lookups", ["down", "back"])
def test_a_key_parked_in_one_thread_is_settled_once_from_another(
    services: DemoServices, state_dir: StateDir, lookups: str
) -> None:
    """Monday's ticket is NEEDS_RECONCILIATION (timed out after the commit, lookups down).

    Tuesday proposes the same keyed ticket: it is not reviewed, nor sent, nor
    given a ``#2``. With lookups still down, Tuesday waits on a reconciliation
    of Monday's operation (named in ``shared_operations``) and its verdict
    settles the one operation; with lookups back, Tuesday's dispatch finds
    the ticket by its key. Either way Monday, resumed, reads the outcome back
    without being asked: one create request, both ToolMessages name one ticket.
    """
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=6)
    with incident_agent(state_dir, services) as agent:
        agent.start(TASK, thread_id="monday")
        monday = agent.resume("monday", decisions=bound(agent, "monday", APPROVE))
        assert monday.status is RunStatus.WAITING_RECONCILIATION
        if lookups == "back":
            services.set_fault("tickets", "normal")

        tuesday = agent.start(TASK, thread_id="tuesday")
        assert [(op.operation_id, op.thread_id) for op in tuesday.shared_operations] == [
            (KEY, "monday")
        ]
        assert agent.ledger.list(thread_id="tuesday") == []
        assert agent.ledger.get(f"{KEY}#2") is None
        if lookups == "down":
            assert tuesday.status is RunStatus.WAITING_RECONCILIATION
            (pending,) = tuesday.interrupts
            assert (pending.kind, pending.value["operation_id"]) == ("reconciliation", KEY)
            verdict = {"verdict": "succeeded", "reference": "TICKET-1", "evidence": "in the UI"}
            tuesday = agent.resume("tuesday", verdicts={KEY: verdict})
        # A human's receipt carries a reference, not the service's body: the
        # scripted model then stops; the service's own receipt leads to the mail.
        after = RunStatus.DONE if lookups == "down" else RunStatus.WAITING_REVIEW
        assert tuesday.status is after
        op = agent.ledger.get(KEY)
        assert op is not None and (op.state, op.thread_id) == (OpState.SUCCEEDED, "monday")
        source = "human" if lookups == "down" else "reconcile"
        assert op.receipt is not None and op.receipt.source == source

        monday = agent.resume("monday")
        assert monday.status is after  # not asked to reconcile again
        for thread in ("monday", "tuesday"):
            (reply,) = [
                m
                for m in agent.messages(thread)
                if isinstance(m, ToolMessage) and m.name == "create_ticket"
            ]
            assert json.loads(str(reply.content))["reference"] == "TICKET-1", thread
    assert services.stats("tickets")["create_requests"] == 1
    assert ticket_keys(state_dir) == [KEY]
