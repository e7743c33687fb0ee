"""A verdict re-sent for an operation it already settled returns the recorded outcome.

A different verdict is refused, naming the recorded one, and the refusal is
a ledger event: through ``Dispatcher.apply_verdict``, ``Agent.resume`` and
``effectgate resume --decisions``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import Agent, RunStatus
from effectgate.ledger import EventKind, OpState
from tests.answers import _parking_agent
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.answers._parking_agent:build"
SUCCEEDED = {"verdict": "succeeded", "reference": "BELL-1"}


def _refusals(agent: Agent, op_id: str) -> list[dict[str, object]]:
    return [
        e.detail
        for e in agent.ledger.events(operation_id=op_id)
        if e.kind is EventKind.NOTE and "refused_verdict" in e.detail
    ]


def _park(agent: Agent, thread: str) -> str:
    (review,) = agent.start("ring", thread_id=thread).interrupts
    parked = agent.resume(thread, answers={review.id: {"decisions": [{"type": "approve"}]}})
    assert parked.status is RunStatus.WAITING_RECONCILIATION, parked
    (item,) = parked.interrupts
    return str(item.value["operation_id"])


def test_the_same_verdict_again_is_already_decided_and_another_is_refused(
    state_dir: StateDir,
) -> None:
    recipe = _parking_agent.build(state_dir)
    with open_agent(state_dir, model=recipe.model or "", tools=recipe.tools) as agent:
        op_id = _park(agent, "t")
        assert agent.resume("t", verdicts={op_id: SUCCEEDED}).status is RunStatus.DONE  # type: ignore[dict-item]
        again = agent.resume("t", verdicts={op_id: SUCCEEDED})  # type: ignore[dict-item]
        assert again.status is RunStatus.DONE
        assert again.already_decided == [f"already decided: {op_id} (succeeded)"]
        with pytest.raises(DecisionError, match=r"already decided: verdict succeeded by"):
            agent.resume("t", verdicts={op_id: {"verdict": "failed"}})
        assert len(_refusals(agent, op_id)) == 1

        # The public Dispatcher.apply_verdict follows the same rule.
        same = agent.dispatcher.apply_verdict(op_id, SUCCEEDED)  # type: ignore[arg-type]
        assert same.state is OpState.SUCCEEDED and same.receipt is not None
        assert same.receipt.reference == "BELL-1"
        with pytest.raises(DecisionError, match=r"verdict 'retry' refused: .*succeeded"):
            agent.dispatcher.apply_verdict(
                op_id, {"verdict": "retry", "acknowledge_duplicate_risk": True}
            )
        (_, refused) = _refusals(agent, op_id)
        assert refused["refused_verdict"] == {"verdict": "retry", "attempt": None, "reviewer": None}
        assert agent.ledger.get(op_id).state is OpState.SUCCEEDED  # type: ignore[union-attr]
    assert (state_dir.workspace / "rings.txt").read_text().count("\n") == 1


def test_the_cli_reports_a_repeated_verdict_and_refuses_a_contradicting_one(
    state_dir: StateDir, tmp_path: Path
) -> None:
    sd = ["--state-dir", str(state_dir.root)]
    parked = eg("run", "ring", "--thread", "t", "--agent", AGENT, "--approve", "all", *sd,
                cwd=ROOT)  # fmt: skip
    assert parked.code == 3, (parked.stdout, parked.stderr)
    ((op_id, _),) = [
        line.rsplit(":", 1) for line in (state_dir.workspace / "rings.txt").read_text().splitlines()
    ]
    given = tmp_path / "v.json"
    given.write_text(json.dumps({"verdicts": {op_id: SUCCEEDED}}), encoding="utf-8")
    done = eg("resume", "--thread", "t", "--decisions", str(given), *sd, cwd=ROOT)
    assert done.code == 0, (done.stdout, done.stderr)
    again = eg("resume", "--thread", "t", "--decisions", str(given), *sd, cwd=ROOT)
    assert again.code == 0, (again.stdout, again.stderr)
    assert f"already decided: {op_id} (succeeded)" in again.stderr + again.stdout
    other = tmp_path / "w.json"
    other.write_text(json.dumps({"verdicts": {op_id: {"verdict": "failed"}}}), encoding="utf-8")
    refused = eg("resume", "--thread", "t", "--decisions", str(other), *sd, cwd=ROOT)
    assert refused.code == 2, (refused.stdout, refused.stderr)
    assert "already decided: verdict succeeded" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert (state_dir.workspace / "rings.txt").read_text().count("\n") == 1
