"""Type-checked by mypy (strict) and never executed: the public API as users write it (stamina)."""

from __future__ import annotations

from datetime import timedelta

from effectgate import Agent, Budget, OpState, Policy, RunStatus, SqliteLedger, StateDir, open_agent
from effectgate.dispatch import Verdict
from effectgate.errors import EffectgateError, NotAccepted, ThreadBusyError
from effectgate.graph import RunResult
from effectgate.ledger import Operation
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


def _status(agent: Agent) -> RunStatus:
    result: RunResult = agent.start("task", thread_id="t")
    if result.status is RunStatus.WAITING_REVIEW:
        review = result.interrupts[0].id  # every answer names the review it answers
        result = agent.resume("t", answers={review: {"decisions": [{"type": "approve"}]}})
    verdict: Verdict = {"verdict": "succeeded", "reference": "TICKET-1"}
    agent.resume("t", verdicts={"op": verdict})
    return result.status


def _ledger(path: str) -> list[Operation]:
    with SqliteLedger(path) as ledger:
        return ledger.list(states=[OpState.NEEDS_RECONCILIATION])


def _policy() -> Policy:
    return Policy(approval_ttl=timedelta(minutes=10), budget=Budget(max_attempts=5))


def _open(path: str) -> None:
    try:
        with open_agent(StateDir.open(path), policy=_policy()) as agent:
            _status(agent)
    except ThreadBusyError as exc:
        print(exc.thread_id, exc.owner, exc.expires_in_s)
    except EffectgateError:
        raise


def _custom_tool() -> ToolSpec:
    from pydantic import BaseModel

    class Args(BaseModel):
        key: str

    def run(args: Args, ctx: ToolContext) -> ToolResult:
        if not args.key:
            raise NotAccepted("later", retry_after=timedelta(seconds=1))
        return ToolResult(value={"ok": True, "op": ctx.operation_id}, reference=args.key)

    return ToolSpec(
        name="t",
        description="d",
        args_schema=Args,
        func=run,
        kind=EffectKind.IDEMPOTENT,
        version="2",
    )
