"""A tool that fails at runtime is reported to the model as a failure, never as a reject."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel

from effectgate import StateDir, open_agent
from effectgate.errors import Rejected
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.models import ScriptedChatModel
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


class _Args(BaseModel):
    x: int


def _raising(name: str, exc: Exception, kind: EffectKind, calls: list[int]) -> ToolSpec:
    def run(args: _Args, ctx: ToolContext) -> ToolResult:
        calls.append(ctx.attempt)
        raise exc

    return ToolSpec(name=name, description="d", args_schema=_Args, func=run, kind=kind)


def _answer(state_dir: StateDir, spec: ToolSpec) -> tuple[Any, dict[str, Any]]:
    script = {
        "name": "fails",
        "turns": [{"say": "go", "tool_calls": [{"name": spec.name, "args": {"x": 1}}]}],
        "final": "Done.",
    }
    model = ScriptedChatModel.from_script(script)
    with open_agent(state_dir, model=model, tools=[spec], policy=Policy()) as agent:
        result = agent.start("go", thread_id="t")
        if result.interrupts:
            (review,) = result.interrupts
            approve = {"decisions": [{"type": "approve"}]}
            result = agent.resume("t", answers={review.id: approve})
        (answer,) = [m for m in agent.messages("t") if isinstance(m, ToolMessage)]
        ops = agent.ledger.list(thread_id="t")
    return result, {"payload": json.loads(str(answer.content)), "ops": ops}


def test_a_service_refusal_is_a_failure_that_took_no_effect(state_dir: StateDir) -> None:
    calls: list[int] = []
    spec = _raising("send_fax", Rejected("HTTP 422: number unknown"), EffectKind.KEYED, calls)
    result, seen = _answer(state_dir, spec)
    assert result.status is RunStatus.DONE
    payload = seen["payload"]
    assert payload["status"] == "failed" and payload["executed"] is False
    text = payload["message"]
    assert "reject" not in text.lower(), text
    assert "send_fax failed at attempt 1" in text and "HTTP 422: number unknown" in text
    assert "did not take effect" in text
    (op,) = seen["ops"]
    assert op.state is OpState.FAILED and calls == [1]


@pytest.mark.parametrize(
    "exc", [Rejected("403 forbidden"), ValueError("index out of range")], ids=["refused", "bug"]
)
def test_a_failing_read_is_told_as_a_failure_and_the_run_goes_on(
    state_dir: StateDir, exc: Exception
) -> None:
    calls: list[int] = []
    result, seen = _answer(state_dir, _raising("lookup", exc, EffectKind.READ, calls))
    assert result.status is RunStatus.DONE, result
    text = seen["payload"]["error"]
    assert "reject" not in text.lower(), text
    assert text.startswith("lookup failed: ") and str(exc) in text
    assert "no side effect" in text
    assert calls == [1]
