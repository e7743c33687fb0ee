"""A reconciliation whose verdict is recorded is not pending, whatever the checkpoint says.

A runner can die between recording a verdict in the ledger and writing the
checkpoint that moves past the reconciliation interrupt. The thread then holds
no question for a person: its effect node reads the recorded verdict back
(here: a retry, so attempt 2 runs). It used to be reported as waiting for
reconciliation (``status``, ``pending``, a worker's readiness), showing the
settled attempt, while a plain ``resume`` finished it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from effectgate import open_agent
from effectgate.answers import apply_verdict
from effectgate.errors import OutcomeUnknown
from effectgate.graph import RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


class _N(BaseModel):
    n: int


def _ring(args: _N, ctx: ToolContext) -> ToolResult:
    if ctx.attempt == 1:
        raise OutcomeUnknown("the bell's answer was lost")
    return ToolResult(value={"rang": args.n}, reference=f"ring-{args.n}")


RING = ToolSpec(
    name="ring", description="Ring.", args_schema=_N, func=_ring, kind=EffectKind.UNSAFE
)
SCRIPT = {
    "name": "ring",
    "turns": [{"say": "ringing", "tool_calls": [{"name": "ring", "args": {"n": 1}}]}],
    "final": "Done.",
}
APPROVE = {"decisions": [{"type": "approve"}], "reviewer": "test"}


def _open(root: Path) -> Any:
    return open_agent(root, model=ScriptedChatModel.from_script(SCRIPT), tools=[RING])


def test_a_recorded_retry_verdict_leaves_unfinished_work_not_a_question(tmp_path: Path) -> None:
    root = tmp_path / "state"
    with _open(root) as agent:
        (review,) = agent.start("ring", thread_id="t").interrupts
        (asked,) = agent.resume("t", answers={review.id: APPROVE}).interrupts
        assert asked.kind == "reconciliation" and asked.value["attempt"] == 1
        op_id = asked.value["operation_id"]
        # the verdict reaches the ledger; the process dies before the checkpoint moves on
        verdict = {
            "verdict": "retry",
            "acknowledge_duplicate_risk": True,
            "evidence": "the bell has no log",
            "attempt": 1,
            "reviewer": "ops",
        }
        apply_verdict(agent.ledger, op_id, verdict, now=datetime.now(UTC))
    with _open(root) as agent:
        status = agent.status("t")
        assert status.interrupts == [], status.interrupts  # nobody is asked about attempt 1
        assert status.status is RunStatus.INCOMPLETE, status
        done = agent.resume("t")  # no answer needed: the recorded verdict stands
        assert done.status is RunStatus.DONE, done
        (op,) = done.operations
        assert (op.state, op.attempt) == (OpState.SUCCEEDED, 2)


def test_a_reconciliation_without_a_recorded_verdict_still_waits(tmp_path: Path) -> None:
    root = tmp_path / "state"
    with _open(root) as agent:
        (review,) = agent.start("ring", thread_id="t").interrupts
        agent.resume("t", answers={review.id: APPROVE})
    with _open(root) as agent:
        status = agent.status("t")
        assert status.status is RunStatus.WAITING_RECONCILIATION
        assert [p.value["attempt"] for p in status.interrupts] == [1]
