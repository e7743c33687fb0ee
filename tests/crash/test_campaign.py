"""The bounded kill campaign: effectgate, create_agent + HITL, and effect-ledger side by side.

One module-scoped run of 35 trials (8 per system through every scenario,
plus effectgate at each of its 11 failpoints); each test asserts on what the
ticket service's and mail sink's own SQLite files and the workspace say.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from effectgate.testing.campaign import (
    EFFECTGATE_SEAMS,
    SCENARIOS,
    System,
    TrialResult,
    plan_trials,
    render_markdown,
    run_campaign,
    summarize,
)
from effectgate.testing.forkserver import ForkServer

pytestmark = pytest.mark.crash

ALL = [System.EFFECTGATE, System.BASELINE, System.EFFECT_LEDGER]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> list[TrialResult]:
    """Run the bounded campaign once for every test of this module."""
    specs = plan_trials(ALL, 8, seed=7)
    specs += plan_trials([System.EFFECTGATE], len(EFFECTGATE_SEAMS), seed=7, mix=("kill-seam",))
    return run_campaign(specs, tmp_path_factory.mktemp("campaign"), jobs=2)


def pick(results: list[TrialResult], system: System, scenario: str) -> list[TrialResult]:
    return [r for r in results if r.system == system.value and r.scenario == scenario]


def test_plan_cycles_scenarios_and_seams() -> None:
    """Eight trials play every scenario; seam trials walk the seam list; plans are reproducible."""
    specs = plan_trials([System.BASELINE], 8, seed=1)
    assert {s.scenario for s in specs} == set(SCENARIOS)
    assert [s.seam for s in specs if s.scenario == "kill-seam"] == [
        "before_effect@create_ticket",
        "after_effect@create_ticket",
    ]
    assert all(1 <= s.kills <= 3 for s in specs if s.scenario == "kill-random")
    assert plan_trials([System.BASELINE], 8, seed=1) == specs
    with pytest.raises(ValueError, match="unknown scenario"):
        plan_trials([System.BASELINE], 1, mix=("kill-everything",))


def test_fork_server_workers_are_killable_processes(tmp_path: Path) -> None:
    """A forked worker is its own process: SIGKILL ends it with -9, and its pid is reaped."""
    with ForkServer() as server:
        argv = ["--system", "effectgate", "--state-dir", str(tmp_path / "s"), "--thread", "t"]
        env = {**os.environ, "EFFECTGATE_FAILPOINT": ""}
        proc = server.spawn(["--go-file", str(tmp_path / "never"), *argv], env,
                            tmp_path / "out", tmp_path / "err",
                            module="effectgate.testing.campaign._worker")  # fmt: skip
        assert proc.pid != os.getpid()
        deadline = time.monotonic() + 30
        out = tmp_path / "out"
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)  # until it says READY (a readiness signal, not a clock)
        assert proc.wait(0) is None  # waiting for the go-file
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
    assert json.loads((tmp_path / "out").read_text().splitlines()[0]) == {"event": "ready"}
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)


def test_effectgate_never_duplicates_loses_or_leaves_unknown(campaign: list[TrialResult]) -> None:
    """Every effectgate trial ends with one ticket, one mail, the note, and a valid history."""
    mine = [r for r in campaign if r.system == "effectgate"]
    assert len(mine) == 8 + len(EFFECTGATE_SEAMS)
    assert {r.seam for r in mine if r.scenario == "kill-seam"} >= set(EFFECTGATE_SEAMS)
    for r in mine:
        assert (r.tickets, r.mails, r.lost_actions, r.left_unknown) == (1, 1, 0, 0), r
        assert r.finished and r.history_problems == 0, r
    assert sum(r.kills for r in mine) >= len(EFFECTGATE_SEAMS)


def test_baseline_repeats_a_committed_write(campaign: list[TrialResult]) -> None:
    """create_agent + HITL resumed after a kill past the ticket commit opens a second ticket."""
    (after_commit,) = [
        r
        for r in pick(campaign, System.BASELINE, "kill-seam")
        if r.seam == "after_effect@create_ticket"
    ]
    assert after_commit.exit_codes[0] == 137 and after_commit.finished
    assert (after_commit.tickets, after_commit.duplicate_tickets) == (2, 1)
    assert after_commit.left_unknown is None  # it keeps no record that could say otherwise


def test_baseline_duplicates_on_concurrent_start_and_fork(campaign: list[TrialResult]) -> None:
    """Three processes on one thread, and a fork with new ids, both repeat the writes."""
    (fork,) = pick(campaign, System.BASELINE, "replay-fork")
    assert (fork.duplicate_tickets, fork.duplicate_mails) == (1, 1)
    (concurrent,) = pick(campaign, System.BASELINE, "concurrent-start")
    assert concurrent.duplicate_tickets >= 1 and concurrent.duplicate_mails >= 1


def test_effect_ledger_holds_unknown_attempts_for_a_human(campaign: list[TrialResult]) -> None:
    """effect-ledger: a kill inside a claimed effect leaves it in_flight; nothing is retried."""
    for r in pick(campaign, System.EFFECT_LEDGER, "kill-seam"):
        assert r.held and not r.finished, r
        assert r.left_unknown == 1 and r.duplicate_tickets == 0, r
        # downstream actions never ran: the thread waits for an operator
        assert r.mails == 0 and r.lost_actions >= 2, r
    (after_commit,) = [
        r
        for r in pick(campaign, System.EFFECT_LEDGER, "kill-seam")
        if r.seam == "after_effect@create_ticket"
    ]
    assert after_commit.tickets == 1


def test_effect_ledger_fork_is_refused_by_runner_but_duplicates_via_graph(
    campaign: list[TrialResult],
) -> None:
    """LedgerRunner refuses time travel; the fork done through the graph repeats both writes."""
    (fork,) = pick(campaign, System.EFFECT_LEDGER, "replay-fork")
    assert fork.runner_refused_fork
    assert (fork.duplicate_tickets, fork.duplicate_mails) == (1, 1)


def test_report_tables(campaign: list[TrialResult]) -> None:
    """The summary counts every trial and the Markdown has one row per system."""
    summary = summarize(campaign)
    assert summary["systems"]["effectgate"]["trials"] == 8 + len(EFFECTGATE_SEAMS)
    assert summary["systems"]["baseline"]["left_unknown"] is None
    assert summary["systems"]["effectgate"]["duplicate_tickets"] == 0
    assert summary["systems"]["baseline"]["duplicate_tickets"] >= 3
    text = render_markdown(summary, {"command": "x", "trials_per_system": 8})
    rows = [line for line in text.splitlines() if line.startswith("| effect")]
    assert any(r.startswith("| effectgate | 19 |") for r in rows), text
    assert "| baseline | 8 |" in text and "n/a" in text
    json.dumps([r.as_dict() for r in campaign])


def test_a_missing_action_is_explained_from_the_ledger(tmp_path: Path) -> None:
    """A trial's "lost action" note says what the ledger holds: the call, FAILED, and why."""
    from pydantic import BaseModel

    from effectgate import StateDir, open_agent
    from effectgate.errors import NotAccepted
    from effectgate.models import ScriptedChatModel
    from effectgate.testing.campaign._oracle import ledger_outcomes
    from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec

    class Mail(BaseModel):
        to: str

    def refuse(args: Mail, ctx: ToolContext) -> ToolResult:
        raise NotAccepted("mailbox full")

    spec = ToolSpec(
        name="send_email", description="Mail.", args_schema=Mail, func=refuse,
        kind=EffectKind.UNSAFE,
    )  # fmt: skip
    script = {
        "name": "mail",
        "turns": [{"say": "mailing", "tool_calls": [{"name": "send_email", "args": {"to": "a"}}]}],
        "final": "Done.",
    }
    sd = StateDir.open(tmp_path / "s")
    assert ledger_outcomes(sd) == "ledger: no ledger file"
    with open_agent(sd, model=ScriptedChatModel.from_script(script), tools=[spec]) as agent:
        (review,) = agent.start("mail", thread_id="incident").interrupts
        approve = {"decisions": [{"type": "approve"}], "reviewer": "test"}
        agent.resume("incident", answers={review.id: approve})
    line = ledger_outcomes(sd)
    # refused three times: the attempt budget is spent, and the note says so
    assert line.startswith("ledger: send_email FAILED attempt 3 ("), line
    assert "no attempts or time left: mailbox full" in line, line
