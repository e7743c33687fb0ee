"""The bounded kill campaign of 4 ``effectgate worker`` processes on PostgreSQL.

Three trials (one SIGKILLing processes at random moments, two killing the
first reviewer and one worker at a failpoint: after a review answer was
recorded, and after the mail sink took a mail), each on a fresh schema;
the assertions read the ticket service's and mail sink's own files, the
workspace, and the ledger and checkpoints in PostgreSQL.
"""

from __future__ import annotations

import dataclasses

import pytest

from effectgate.testing.campaign import System, TrialResult, plan_trials, run_campaign
from effectgate.testing.campaign._harness import PG_WORKERS_KILL_SPAN_S
from effectgate.testing.campaign._pgworkers import THREADS
from effectgate.testing.postgres import ENV_DSN

pytestmark = [pytest.mark.crash, pytest.mark.slow]


@pytest.fixture(scope="module")
def trials(postgres_database: str, tmp_path_factory: pytest.TempPathFactory) -> list[TrialResult]:
    """kill-random; kill-seam after a review answer is recorded; after a mail was sent."""
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV_DSN, postgres_database)  # schemas go into the session's scratch database
    try:
        specs = plan_trials([System.PG_WORKERS], 5, seed=11, max_kills=3)
        mail = dataclasses.replace(specs[4], seam="AFTER_EXTERNAL_COMMIT@send_email")
        picked = [specs[0], specs[4], mail]
        assert [s.scenario for s in picked] == ["kill-random", "kill-seam", "kill-seam"]
        return run_campaign(picked, tmp_path_factory.mktemp("pgcampaign"), jobs=1)
    finally:
        mp.undo()


def test_plan_maps_every_scenario_to_a_worker_scenario() -> None:
    """The default mix's single-thread scenarios become kill-random; seams walk the failpoints."""
    specs = plan_trials([System.PG_WORKERS], 8, seed=1)
    assert {s.scenario for s in specs} == {"kill-random", "kill-seam"}
    assert [s.seam for s in specs if s.scenario == "kill-seam"] == [
        "AFTER_REVIEW_RECORDED#1",
        "AFTER_REVIEW_RECORDED#2",
    ]
    assert all(s.kill_span_s >= PG_WORKERS_KILL_SPAN_S for s in specs)


def test_workers_killed_at_random_and_at_a_seam_repeat_and_lose_nothing(
    trials: list[TrialResult],
) -> None:
    """One ticket, one mail per thread, the note; nothing open, no bad history, all done."""
    for r in trials:
        assert r.kills >= 1, r  # a kill landed, or the trial proved nothing
        assert (r.tickets, r.mails) == (1, THREADS), r
        assert (r.duplicate_tickets, r.duplicate_mails, r.lost_actions) == (0, 0, 0), r
        assert r.left_unknown == 0, r
        assert r.history_problems == 0, r
        assert r.finished and not r.held, r
