"""The bounded fault campaign: 4 ``effectgate worker`` processes on a private cluster, broken.

Three ``effectgate-pg-faults`` trials, each on a private cluster of its own
(``initdb``, reused for nothing else) reached through a TCP proxy, cover
every fault kind: one trial terminates every backend, restarts the cluster
``fast`` and SIGKILLs a process; one restarts it ``immediate`` (a crash:
asynchronous commits lost), SIGSTOPs a worker past its lease and cuts every
connection at the proxy; one freezes a process at the moment its mail's
attempt is durably IN_FLIGHT and keeps it frozen past its lease while the
others take its thread over. The assertions read the ticket service's and
mail sink's own files, the workspace, and the ledger and checkpoints.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from effectgate.testing.campaign import FAULT_KINDS, System, TrialResult, plan_trials, run_campaign
from effectgate.testing.campaign._pgworkers import THREADS
from tests.postgres._private import require_private_cluster

pytestmark = [pytest.mark.crash, pytest.mark.slow]

RANDOM = (
    ("terminate", "restart-fast", "sigkill"),
    ("restart-immediate", "sigstop", "drop"),
)
SEAM = ("AFTER_IN_FLIGHT_COMMIT@send_email", "sigstop")


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> list[TrialResult]:
    """Two trials of random faults, one of a worker frozen at a seam past its lease."""
    require_private_cluster()
    specs = plan_trials([System.PG_FAULTS], 5, seed=7)
    assert [s.scenario for s in specs] == ["faults-random"] * 4 + ["faults-seam"]
    # Faults in the first second after READY: every one lands before the threads are done.
    picked = [
        dataclasses.replace(specs[i], faults=faults, kill_span_s=1.0)
        for i, faults in enumerate(RANDOM)
    ]
    picked.append(dataclasses.replace(specs[4], seam=SEAM[0], faults=(SEAM[1],)))
    return run_campaign(picked, tmp_path_factory.mktemp("pgfaults"), jobs=2)


def test_plan_covers_every_fault_kind_at_random_and_at_seams() -> None:
    """Random trials draw 2..max_kills+1 kinds; seam trials walk every (seam, kind) pair."""
    specs = plan_trials([System.PG_FAULTS], 8 * 33, seed=3)
    random_ = [s for s in specs if s.scenario == "faults-random"]
    seams = [s for s in specs if s.scenario == "faults-seam"]
    assert all(2 <= len(s.faults) <= 4 for s in random_)
    assert {k for s in random_ for k in s.faults} == set(FAULT_KINDS)
    assert len({(s.seam, s.faults) for s in seams}) == len(seams) == 66


def test_database_and_process_faults_repeat_nothing_and_lose_nothing(
    trials: list[TrialResult],
) -> None:
    """One ticket, one mail per thread, the note; nothing open, no bad history, all done."""
    delivered = {kind for r in trials for kind in r.faults}
    assert delivered == set(FAULT_KINDS), [r.faults for r in trials]
    for r in trials[: len(RANDOM)]:
        assert set(r.faults) == set(RANDOM[trials.index(r)]), r
    assert set(trials[-1].faults) == {"sigstop"}, trials[-1]  # it met its seam
    for r in trials:
        assert (r.tickets, r.mails) == (1, THREADS), r
        assert (r.duplicate_tickets, r.duplicate_mails, r.lost_actions) == (0, 0, 0), r
        assert r.left_unknown == 0, r
        assert r.history_problems == 0, r
        assert r.finished, r
        # no process ended by an error of its own (a traceback is exit 1; a database
        # that stayed away past the retry budget would be 75)
        assert not [n for n in r.notes if re.search(r" exited (?!75:)", n)], r
