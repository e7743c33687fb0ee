"""An approval whose arguments the current tool version refuses never stays live.

After the review, the tool's schema is tightened (a limit lowered, the version
bumped). The approved call is not executed, and the operation does not stay
APPROVED at attempt 0 for ever: it ends REJECTED with the reason. An operation
that had already started keeps what the ledger knows about it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, StringConstraints

from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall
from effectgate.ledger import Approval, OpenRequest, OpState, Receipt, SqliteLedger
from effectgate.testing import FakeClock
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec
from tests.answers._bind import bound


class Loose(BaseModel):
    title: Annotated[str, StringConstraints(max_length=100)]


class Tight(BaseModel):
    title: Annotated[str, StringConstraints(max_length=5)]


CALLS: list[str] = []


def _create(args: BaseModel, ctx: ToolContext) -> ToolResult:
    CALLS.append(ctx.operation_id)
    return ToolResult(value={"ok": True}, reference=ctx.operation_id)


def _lookup(args: BaseModel, ctx: ToolContext) -> Lookup:
    CALLS.append(f"lookup {ctx.operation_id}")
    return Lookup.not_found("nothing")


def _spec(schema: type[BaseModel], version: str) -> ToolSpec:
    return ToolSpec(
        name="create_ticket",
        description="Open a ticket.",
        args_schema=schema,
        func=_create,
        kind=EffectKind.KEYED,
        reconciler=_lookup,
        version=version,
    )


def _approved(ledger: SqliteLedger, clock: FakeClock, op_id: str) -> EffectCall:
    v1 = _spec(Loose, "1")
    args = v1.args_dict(v1.normalize({"title": "a long ticket title"}, tool_call_id="c1"))
    ihash = v1.intent_hash(v1.normalize(args, tool_call_id="c1"))
    req = OpenRequest(
        operation_id=op_id,
        thread_id="t1",
        tool_call_id="c1",
        tool="create_ticket",
        tool_version="1",
        args=args,
        intent_hash=ihash,
    )
    approval = Approval(
        operation_id=op_id,
        thread_id="t1",
        tool_call_id="c1",
        decision="approve",
        intent_hash=ihash,
        reviewer="alice",
        decided_at=clock.now(),
        expires_at=clock.now() + timedelta(hours=1),
    )
    ledger.record_review([req], [approval])
    return EffectCall(
        thread_id="t1",
        tool_call_id="c1",
        tool="create_ticket",
        args=args,
        operation_id=op_id,
        intent_hash=ihash,
    )


def test_an_approval_refused_by_the_new_schema_ends_rejected_with_the_reason(
    tmp_path: Path,
) -> None:
    CALLS.clear()
    clock = FakeClock()
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as ledger:
        call = _approved(ledger, clock, "t1:c1")
        tight = Dispatcher(ledger, {"create_ticket": _spec(Tight, "2")}, worker="w", clock=clock)
        outcome = tight.dispatch(call)
        assert outcome.status is DispatchStatus.FAILED
        assert "no longer validate under create_ticket version 2" in outcome.message
        assert "propose the call again" in outcome.message
        op = ledger.get("t1:c1")
        assert op is not None and (op.state, op.attempt) == (OpState.REJECTED, 0)
        assert op.error is not None and "no longer validate" in op.error
        assert outcome.operation == op
        assert tight.dispatch(call).status is DispatchStatus.REJECTED  # settled, no loop
    assert CALLS == []


def test_a_started_operation_keeps_its_receipt_or_goes_to_a_human(tmp_path: Path) -> None:
    CALLS.clear()
    clock = FakeClock()
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as ledger:
        done, open_ = _approved(ledger, clock, "t1:a"), _approved(ledger, clock, "t1:b")
        for call in (done, open_):
            ledger.claim(call.operation_id, attempt=1, worker="w")
        receipt = Receipt(
            operation_id="t1:a",
            intent_hash=done.intent_hash,
            attempt=1,
            result={"ok": True},
            reference="T-1",
            recorded_at=clock.now(),
        )
        ledger.record_result("t1:a", attempt=1, state=OpState.SUCCEEDED, receipt=receipt)
        ledger.record_result("t1:b", attempt=1, state=OpState.UNKNOWN, error="timeout")
        tight = Dispatcher(ledger, {"create_ticket": _spec(Tight, "2")}, worker="w", clock=clock)

        reused = tight.dispatch(done)
        assert (reused.status, reused.receipt) == (DispatchStatus.SUCCEEDED, receipt)
        parked = tight.dispatch(open_)
        assert parked.status is DispatchStatus.NEEDS_RECONCILIATION
        assert "no longer validate" in parked.evidence["why"]
        op = ledger.get("t1:b")
        assert op is not None and op.state is OpState.NEEDS_RECONCILIATION
    assert CALLS == []  # neither called nor looked up with refused arguments


SCRIPT = {
    "name": "one-ticket",
    "turns": [
        {
            "say": "opening",
            "tool_calls": [
                {"name": "create_ticket", "args": {"title": "a long title"}, "id": "c1"}
            ],
        }
    ],
    "final": "gave up",
}


class _Stop(Exception):
    """Raised from the progress hook right after the review: the process stops there."""


def _stop_after_review(update: object) -> None:
    if isinstance(update, dict) and "review" in update:
        raise _Stop


def test_the_agent_answers_the_call_and_the_thread_goes_on(tmp_path: Path) -> None:
    """End to end: approved under version 1 (the run stops right after the review's
    checkpoint), resumed by an agent whose tool is version 2."""
    from effectgate import open_agent
    from effectgate.graph import RunStatus
    from effectgate.models import ScriptedChatModel

    CALLS.clear()
    state = tmp_path / "state"
    model = ScriptedChatModel.from_script(SCRIPT)
    tools = [_spec(Loose, "1")]
    with open_agent(state, model=model, tools=tools, on_event=_stop_after_review) as agent:
        assert agent.start("open it", thread_id="t").status is RunStatus.WAITING_REVIEW
        stopped = agent.resume(
            "t", decisions=bound(agent, "t", {"decisions": [{"type": "approve"}]})
        )
        assert stopped.status is RunStatus.INCOMPLETE, stopped
        (op,) = stopped.operations
        assert (op.state, op.attempt, op.tool_version) == (OpState.APPROVED, 0, "1")

    model = ScriptedChatModel.from_script(SCRIPT)
    with open_agent(state, model=model, tools=[_spec(Tight, "2")]) as agent:
        done = agent.resume("t")
        assert (done.status, done.final_message) == (RunStatus.DONE, "gave up"), done
        (op,) = done.operations
        assert op.state is OpState.REJECTED and "no longer validate" in (op.error or "")
        assert any("no longer validate" in str(m.content) for m in agent.messages("t"))
    assert CALLS == []
