"""What the model and the reviewer are told is true; verdicts are validated on every path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel

from effectgate import StateDir, open_agent
from effectgate.answers import validate_verdict
from effectgate.cli._decisions import FileDecisions, load_decisions_file
from effectgate.demo.services import DemoServices
from effectgate.errors import DecisionError
from effectgate.graph import RunStatus
from effectgate.graph._messages import rejection_message
from effectgate.graph._review import choose_operation_id
from effectgate.ledger import Approval, Budget, OpenRequest, OpState, SqliteLedger
from effectgate.models import ScriptedChatModel, load_script
from effectgate.testing.campaign._systems import fork_checkpoint
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec
from tests.conftest import run_worker

# -- "not executed" only with proof --------------------------------------------------------


@pytest.mark.slow
def test_a_reject_after_a_replay_never_claims_a_parked_ticket_was_not_created(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The ticket may exist (parked): a replay asks for a verdict, never "not executed"."""
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
    model = ScriptedChatModel.from_script(load_script("incident"))
    with open_agent(state_dir, model=model, endpoints=services.endpoints) as agent:
        (review,) = agent.start("handle the incident", thread_id="t").interrupts
        n = len(review.value["action_requests"])
        parked = agent.resume("t", answers={review.id: {"decisions": [{"type": "approve"}] * n}})
        assert parked.status is RunStatus.WAITING_RECONCILIATION
        history = list(agent.graph.get_state_history({"configurable": {"thread_id": "t"}}))
        replayed = agent.replay("t", fork_checkpoint(history, "agent"))
        # the reviewer is shown the operation's state and asked for a verdict
        assert replayed.status is RunStatus.WAITING_RECONCILIATION, replayed
        (item,) = replayed.interrupts
        assert item.kind == "reconciliation"
        assert item.value["evidence"]["state"] == "NEEDS_RECONCILIATION"
        claims = [
            m
            for m in agent.messages("t")
            if isinstance(m, ToolMessage)
            and m.name == "create_ticket"
            and "not executed" in str(m.content)
        ]
    assert claims == []


def test_rejection_message_ends_the_reviewers_sentence() -> None:
    msg = rejection_message(tool_call_id="c1", tool="send_email", message="one mail is enough")
    text = json.loads(str(msg.content))["message"]
    assert "with reason: one mail is enough. The tool was not executed." in text
    kept = rejection_message(tool_call_id="c1", tool="send_email", message="Stop!")
    assert (
        "with reason: Stop! The tool was not executed." in json.loads(str(kept.content))["message"]
    )


# -- a decided review is never shown as open again -----------------------------------------


@pytest.mark.slow
def test_a_reject_recorded_before_a_kill_is_not_asked_again(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Killed at AFTER_REVIEW_RECORDED after a reject: not open again; an approve is refused."""
    crashed = run_worker(state_dir, "t", failpoint="AFTER_REVIEW_RECORDED", approve="none")
    assert crashed.returncode == 137, crashed.stderr
    model = ScriptedChatModel.from_script(load_script("incident"))
    with open_agent(state_dir, model=model, endpoints=services.endpoints) as agent:
        shown = agent.graph.get_state({"configurable": {"thread_id": "t"}}).interrupts
        assert shown  # the checkpoint still holds the interrupt the killed run answered
        assert agent.status("t").interrupts == []  # but it is not open any more
        approve = {"decisions": [{"type": "approve"}] * len(shown[0].value["action_requests"])}
        with pytest.raises(DecisionError, match="already decided: reject"):
            agent.resume("t", answers={shown[0].id: approve})
        ops = agent.ledger.list(thread_id="t")
        assert ops and {op.state for op in ops} == {OpState.REJECTED}
        went_on = agent.resume("t")
        assert went_on.status is not RunStatus.WAITING_REVIEW or all(
            i.id != shown[0].id for i in went_on.interrupts
        )
    assert services.tickets() == []


# -- verdicts: one validation on every path ------------------------------------------------


@pytest.mark.parametrize(
    "verdict",
    [
        {"verdict": "succeeded", "reference": 123},
        {"verdict": "succeeded", "ticket_id": 1},
        {"verdict": "succeeded", "reference": "  "},
        {"verdict": "retry"},
        {"verdict": "retry", "acknowledge_duplicate_risk": "yes"},
        {"verdict": "failed", "attempt": "1"},
        {"verdict": "maybe"},
    ],
)
def test_bad_verdicts_are_refused(verdict: dict[str, Any]) -> None:
    with pytest.raises(DecisionError, match="verdict"):
        validate_verdict(verdict)


def test_dispatcher_apply_verdict_validates(state_dir: StateDir) -> None:
    """The public ``Dispatcher.apply_verdict`` refuses a retry without the acknowledgement."""
    with open_agent(state_dir) as agent:
        ledger = agent.ledger
        _parked(ledger)
        with pytest.raises(DecisionError, match="acknowledge_duplicate_risk"):
            agent.dispatcher.apply_verdict("op-1", {"verdict": "retry"})  # type: ignore[typeddict-item]
        with pytest.raises(DecisionError, match="reference"):
            agent.dispatcher.apply_verdict("op-1", {"verdict": "succeeded", "reference": 5})  # type: ignore[typeddict-item]
        assert ledger.get("op-1").state is OpState.NEEDS_RECONCILIATION  # type: ignore[union-attr]


def _parked(ledger: SqliteLedger | Any) -> None:
    from effectgate.tools import intent_hash as compute_intent_hash

    args = {"command": "true"}
    ihash = compute_intent_hash("run_shell", "1", args)
    ledger.record_review(
        [
            OpenRequest(
                operation_id="op-1", thread_id="x", tool_call_id="c", tool="run_shell",
                tool_version="1", args=args, intent_hash=ihash, budget=Budget(max_attempts=3),
            )
        ],
        [
            Approval(
                operation_id="op-1", thread_id="x", tool_call_id="c", decision="approve",
                intent_hash=ihash, reviewer="t", decided_at=ledger.clock.now(),
            )
        ],
    )  # fmt: skip
    ledger.claim("op-1", attempt=1, worker="w")
    ledger.transition("op-1", src=OpState.IN_FLIGHT, dst=OpState.UNKNOWN)
    ledger.transition("op-1", src=OpState.UNKNOWN, dst=OpState.NEEDS_RECONCILIATION)


def test_a_file_verdict_authorises_one_attempt(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    path.write_text(
        json.dumps({"verdicts": {"op": {"verdict": "retry", "acknowledge_duplicate_risk": True}}})
    )
    source = FileDecisions(load_decisions_file(path), reviewer="r")
    first = source.verdict({"operation_id": "op", "attempt": 1})
    assert first is not None and first["attempt"] == 1
    assert source.verdict({"operation_id": "op", "attempt": 2}) is None


# -- a business key ending in "#2" is not the second operation of another key ---------------


class _Alert(BaseModel):
    key: str


def _keyed() -> ToolSpec:
    def run(args: _Alert, ctx: ToolContext) -> ToolResult:
        return ToolResult(value={"ok": True})

    return ToolSpec(
        name="page",
        description="Page on-call for an alert.",
        args_schema=_Alert,
        func=run,
        kind=EffectKind.KEYED,
        operation_key=lambda a: a.key,
    )


def test_a_key_named_like_a_suffix_never_collides(tmp_path: Path) -> None:
    spec = _keyed()
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:

        def open_(key: str, call: str, decision: str) -> str:
            args = spec.normalize({"key": key}, tool_call_id=call)
            op_id, _ = choose_operation_id(
                spec, args, ledger=ledger, thread_id="t", tool_call_id=call
            )
            ihash = spec.intent_hash(args)
            opened = OpenRequest(
                operation_id=op_id,
                thread_id="t",
                tool_call_id=call,
                tool="page",
                tool_version=spec.version,
                args=spec.args_dict(args),
                intent_hash=ihash,
            )
            approval = Approval(
                operation_id=op_id,
                thread_id="t",
                tool_call_id=call,
                decision="reject" if decision == "reject" else "approve",
                intent_hash=ihash,
                reviewer="r",
                decided_at=ledger.clock.now(),
            )
            ledger.record_review([opened], [approval])
            return op_id

        assert open_("K", "c1", "reject") == "K"  # K rejected: a new call of K needs a fresh id
        assert open_("K#2", "c2", "approve") == "K#2"  # an alert literally named K#2
        args = spec.normalize({"key": "K"}, tool_call_id="c3")
        chosen, existing = choose_operation_id(
            spec, args, ledger=ledger, thread_id="t", tool_call_id="c3"
        )
        assert chosen == "K#3" and existing is None  # not K#2's operation
        args = spec.normalize({"key": "K#2"}, tool_call_id="c4")
        chosen, _ = choose_operation_id(spec, args, ledger=ledger, thread_id="t", tool_call_id="c4")
        assert chosen == "K#2"  # K#2's own operation is still shared under its key
