"""Trials: fresh state and services, worker processes killed and resumed, then the oracle.

One trial = one system, one scenario, one fresh state directory with fresh
``DemoServices`` (both slowed by ``service_delay_s`` per write, the same for
every system, so that kills can land while an effect is on the wire). The
harness starts worker processes (``_worker``), kills them, starts new ones
until the thread is done or a bound is hit, and then asks the external
systems' own storage what happened:

==================  =====================================================================
scenario            what happens
==================  =====================================================================
``kill-random``     1..``max_kills`` runs are SIGKILLed at a uniform random moment in
                    ``[0, kill_span_s]`` after the worker is READY; then resume until done
``kill-seam``       the first run exits 137 at a named seam (effectgate: each
                    ``Failpoint``; others: the same moments in the tools); then resume
``concurrent-start``three processes start the same thread at the same instant (after all
                    are READY); model ids fresh per process, as a real model's would be
``replay-fork``     run to done, then fork from the checkpoint before the create_ticket
                    turn; the model re-proposes the same writes with new tool_call_ids
==================  =====================================================================
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from effectgate._app import StateDir
from effectgate.testing.campaign._oracle import judge
from effectgate.testing.campaign._pgworkers import (
    FAULT_KINDS,
    PG_FAULTS_SCENARIOS,
    ClusterPool,
    run_pg_workers_trial,
)
from effectgate.testing.campaign._systems import (
    EXIT_BUSY,
    EXIT_DONE,
    EXIT_HELD,
    System,
)
from effectgate.testing.campaign._trial import (
    _GATED_BY_EFFECTGATE,
    TrialResult,
    TrialSpec,
    _Trial,
)

if TYPE_CHECKING:
    from effectgate.testing.forkserver import ForkServer

__all__ = [
    "EFFECTGATE_SEAMS",
    "FAULT_KINDS",
    "PG_FAULTS_SCENARIOS",
    "PLAIN_SEAMS",
    "SCENARIOS",
    "TrialResult",
    "TrialSpec",
    "plan_trials",
    "run_trial",
]

SCENARIOS = ("kill-random", "kill-seam", "concurrent-start", "replay-fork")
DEFAULT_MIX = ("kill-random",) * 4 + ("kill-seam",) * 2 + ("concurrent-start", "replay-fork")
"""The scenario cycle: trial ``i`` plays ``mix[i % len(mix)]``."""
PG_WORKERS_SCENARIOS = frozenset({"kill-random", "kill-seam"})
"""What ``effectgate-pg-workers`` plays; its trials of other scenarios play ``kill-random``
(several workers start together in every one of its trials)."""
PG_WORKERS_KILL_SPAN_S = 1.5
"""Its kill moments are uniform in ``[0, 1.5]`` s after READY.

Four workers finish their four threads in 1.4-2.2 s on a quiet 2-core machine
(longer under load): a later kill often found them done, and the trial
proved nothing (``kills == 0``)."""
PG_FAULTS_SPAN_S = 2.0
"""``effectgate-pg-faults``: its random faults are uniform in ``[0, 2]`` s after READY
(a restart takes a second or more, so the threads take longer than without faults)."""

EFFECTGATE_SEAMS = (
    "AFTER_REVIEW_RECORDED#1",
    "AFTER_REVIEW_RECORDED#2",
    "AFTER_IN_FLIGHT_COMMIT@create_ticket",
    "AFTER_IN_FLIGHT_COMMIT@send_email",
    "AFTER_IN_FLIGHT_COMMIT@write_file",
    "AFTER_EXTERNAL_COMMIT@create_ticket",
    "AFTER_EXTERNAL_COMMIT@send_email",
    "AFTER_EXTERNAL_COMMIT@write_file",
    "AFTER_LEDGER_RESULT@create_ticket",
    "AFTER_LEDGER_RESULT@send_email",
    "MID_SUPERSTEP",
)
"""effectgate's failpoints (``EFFECTGATE_FAILPOINT``), as in tests/crash."""
PLAIN_SEAMS = (
    "before_effect@create_ticket",
    "after_effect@create_ticket",
    "after_result@create_ticket",
    "before_effect@send_email",
    "after_effect@send_email",
    "after_result@send_email",
    "after_effect@write_file",
)
"""The same moments in the plain tools (``CAMPAIGN_KILL``): approved/claimed but not sent;
the external system committed; the result recorded but not checkpointed."""


def plan_trials(
    systems: list[System],
    trials: int,
    *,
    seed: int = 20240611,
    mix: tuple[str, ...] = DEFAULT_MIX,
    max_kills: int = 3,
    kill_span_s: float = 0.8,
    service_delay_s: float = 0.1,
) -> list[TrialSpec]:
    """Plan ``trials`` trials per system, cycling through ``mix`` and the seams.

    Args:
        systems: the systems to test.
        trials: trials per system.
        seed: base of every per-trial seed (the plan and kill times are reproducible).
        mix: the scenario cycle.
        max_kills: most SIGKILLs per ``kill-random`` trial (at least 1 each).
        kill_span_s: kill moments are uniform in ``[0, kill_span_s]`` after READY.
        service_delay_s: per-write delay of both services, in seconds.

    Returns:
        The specs, system by system.

    Raises:
        ValueError: an unknown scenario in ``mix``.
    """
    unknown = sorted(set(mix) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    specs: list[TrialSpec] = []
    for system in systems:
        seams = EFFECTGATE_SEAMS if system in _GATED_BY_EFFECTGATE else PLAIN_SEAMS
        n_seam = 0
        for i in range(trials):
            scenario = mix[i % len(mix)]
            span = kill_span_s
            if system is System.PG_WORKERS:
                span = max(kill_span_s, PG_WORKERS_KILL_SPAN_S)
                if scenario not in PG_WORKERS_SCENARIOS:
                    scenario = "kill-random"
            trial_seed = random.Random(f"{seed}:{i}").randrange(2**31)
            seam = None
            faults: tuple[str, ...] = ()
            if scenario == "kill-seam":
                seam, n_seam = seams[n_seam % len(seams)], n_seam + 1
            kills = random.Random(trial_seed).randint(1, max_kills)
            if system is System.PG_FAULTS:
                span = max(kill_span_s, PG_FAULTS_SPAN_S)
                if seam is not None:
                    # 11 seams and 6 kinds: every pair comes round once in 66 seam trials.
                    scenario, faults = (
                        "faults-seam",
                        (FAULT_KINDS[(n_seam - 1) % len(FAULT_KINDS)],),
                    )
                else:
                    rng = random.Random(trial_seed ^ 0xFA17)
                    scenario = "faults-random"
                    faults = tuple(rng.choice(FAULT_KINDS) for _ in range(kills + 1))
            specs.append(
                TrialSpec(
                    system=system,
                    scenario=scenario,
                    index=i,
                    seed=trial_seed,
                    seam=seam,
                    kills=kills if scenario == "kill-random" else 0,
                    kill_span_s=span,
                    service_delay_s=service_delay_s,
                    faults=faults,
                )
            )
    return specs


# --- worker processes ---------------------------------------------------------------------


def _kill_random(trial: _Trial) -> int | None:
    code: int | None = None
    for _ in range(trial.spec.kills):
        code = trial.run_killed(trial.rng.uniform(0.0, trial.spec.kill_span_s))
        if code in (EXIT_DONE, EXIT_HELD):
            break  # nothing left to kill, or held for a human: more kills change nothing
    return code


def _kill_seam(trial: _Trial) -> int | None:
    seam = trial.spec.seam or ""
    if trial.spec.system in _GATED_BY_EFFECTGATE:
        return trial.run_once(env_extra={"EFFECTGATE_FAILPOINT": seam})
    extra = ("--kill-after-result",) if seam.startswith("after_result") else ()
    return trial.run_once(*extra, env_extra={"CAMPAIGN_KILL": seam})


def _concurrent_start(trial: _Trial) -> int | None:
    go = trial.sd.root / "go"
    workers = [trial.launch("--fresh-ids", "--go-file", str(go)) for _ in range(3)]
    for worker in workers:
        worker.wait_ready()
    go.touch()
    codes = [trial.record(w, w.wait()) for w in workers]
    if EXIT_DONE in codes and all(c in (EXIT_DONE, EXIT_BUSY) for c in codes):
        return EXIT_DONE  # a busy loser ran nothing; a winner saw the thread done
    return next(c for c in codes if c != EXIT_DONE)


def _replay_fork(trial: _Trial) -> int | None:
    first = trial.run_once("--fresh-ids")
    if first != EXIT_DONE:
        trial.result.notes.append(f"initial run ended with {first}; fork skipped")
        return first
    return trial.run_once("--fresh-ids", "--fork")


_SCENARIO_RUN = {
    "kill-random": _kill_random,
    "kill-seam": _kill_seam,
    "concurrent-start": _concurrent_start,
    "replay-fork": _replay_fork,
}


def run_trial(
    spec: TrialSpec,
    workdir: Path,
    *,
    server: ForkServer | None = None,
    keep: bool = False,
    clusters: ClusterPool | None = None,
) -> TrialResult:
    """Run one trial in a fresh state directory under ``workdir`` and judge it.

    Args:
        spec: the trial.
        workdir: parent of the trial's state directory.
        server: fork workers from this server; None: start each as ``python -m``.
        keep: keep the state directory (default: removed after judging).
        clusters: the private clusters of ``effectgate-pg-faults`` trials
            (default: one made for the trial).

    Returns:
        The trial's counts, read from the external systems' own storage.
    """
    from effectgate.demo.services import DemoServices

    if spec.system in (System.PG_WORKERS, System.PG_FAULTS):
        return run_pg_workers_trial(spec, workdir, server=server, keep=keep, clusters=clusters)
    started = time.monotonic()
    root = workdir / f"{spec.system.value}-{spec.scenario}-{spec.index:05d}"
    shutil.rmtree(root, ignore_errors=True)
    sd = StateDir.open(root)
    result = TrialResult(
        system=spec.system.value,
        scenario=spec.scenario,
        index=spec.index,
        seed=spec.seed,
        seam=spec.seam,
    )
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        services.set_fault("tickets", "slow", delay_s=spec.service_delay_s)
        services.set_fault("mail", "slow", delay_s=spec.service_delay_s)
        trial = _Trial(spec, sd, result, random.Random(spec.seed), server)
        trial.finish(_SCENARIO_RUN[spec.scenario](trial))
    judge(spec.system, sd, result)
    result.duration_s = round(time.monotonic() - started, 3)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return result
