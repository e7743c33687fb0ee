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

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._app import StateDir
from effectgate.testing.campaign._oracle import THREAD, judge
from effectgate.testing.campaign._systems import (
    EXIT_BUSY,
    EXIT_DONE,
    EXIT_HELD,
    System,
)

if TYPE_CHECKING:
    from effectgate.testing.campaign._forkserver import ForkedProcess, ForkServer

__all__ = [
    "EFFECTGATE_SEAMS",
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

_GATED_BY_EFFECTGATE = frozenset({System.EFFECTGATE, System.MIDDLEWARE, System.PG_WORKERS})
"""Systems whose seams are effectgate's failpoints."""
_READY_TIMEOUT_S = 90.0
_POLL_S = 0.005
_SEAM_VARS = ("EFFECTGATE_FAILPOINT", "CAMPAIGN_KILL")
_RUN_TIMEOUT_S = 120.0
_BUSY_PAUSE_S = 0.2
_HELD_RETRIES = 1  # one more process after "held": a concurrent winner may have finished


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    """One planned trial; everything random about it derives from ``seed``."""

    system: System
    scenario: str
    index: int
    """Position in the system's trial list (0-based)."""
    seed: int
    seam: str | None = None
    """The seam of a ``kill-seam`` trial."""
    kills: int = 0
    """SIGKILLs a ``kill-random`` trial tries to deliver."""
    kill_span_s: float = 0.8
    """Upper bound of the random kill moment after READY, in seconds."""
    service_delay_s: float = 0.1
    """Each ticket create and mail DATA is held this long by the services, in seconds."""
    max_runs: int = 12
    """Worker processes a trial may start after its planned ones."""


@dataclass(slots=True, kw_only=True)
class TrialResult:
    """What one trial did and what the external systems say about it."""

    system: str
    scenario: str
    index: int
    seed: int
    seam: str | None
    kills: int = 0
    """SIGKILLs delivered plus runs that exited at a seam."""
    processes: int = 0
    resumes: int = 0
    """Processes started beyond the scenario's planned ones, to finish the thread."""
    exit_codes: list[int] = field(default_factory=list)
    finished: bool = False
    """The last worker reported the thread done."""
    held: bool = False
    """The thread stopped waiting for a human (reconciliation / unresolved)."""
    stalled: bool = False
    """The driver could not move the thread at all (two processes in a row)."""
    tickets: int = 0
    mails: int = 0
    duplicate_tickets: int = 0
    """Tickets beyond the one the workflow asks for."""
    duplicate_mails: int = 0
    """Mails beyond the one the workflow asks for (every send has a new Message-ID)."""
    lost_actions: int = 0
    """Expected effects missing at the end: ticket, mail, note (referring to a ticket)."""
    left_unknown: int | None = None
    """Operations the system itself holds as unresolved; None: it keeps no record."""
    history_problems: int = 0
    """Checkpoints whose message history breaks the tool-call pairing rules."""
    runner_refused_fork: bool = False
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the trial as JSON-ready data."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


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
            if scenario == "kill-seam":
                seam, n_seam = seams[n_seam % len(seams)], n_seam + 1
            kills = random.Random(trial_seed).randint(1, max_kills)
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
                )
            )
    return specs


# --- worker processes ---------------------------------------------------------------------


class _Popen:
    """A worker started as ``python -m ...`` (the mode without a fork server)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> None:
        command = [sys.executable, "-m", "effectgate.testing.campaign._worker", *argv]
        with stdout.open("ab") as out, stderr.open("ab") as err:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env
            )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class _Worker:
    """One worker process, forked or started; READY and the summary are read from its stdout."""

    def __init__(self, proc: _Popen | ForkedProcess, stdout: Path) -> None:
        self.proc = proc
        self.stdout = stdout
        self.hung = False  # outlived its timeout and was killed by the harness

    def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b'"ready"' in self.stdout.read_bytes():
                return
            if self.proc.wait(_POLL_S) is not None:
                return  # ended before READY: nothing to wait for

    def wait(self, timeout: float = _RUN_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout)
        if code is None:
            self.hung = True
            self.proc.kill()
            code = self.proc.wait(None)
        assert code is not None
        return code

    def summary(self) -> dict[str, Any]:
        found: list[dict[str, Any]] = []
        for raw in self.stdout.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict) and "event" not in line:
                    found.append(line)
        return found[-1] if found else {}


@dataclass(slots=True)
class _Trial:
    spec: TrialSpec
    sd: StateDir
    result: TrialResult
    rng: random.Random
    server: ForkServer | None
    last: _Worker | None = None

    def launch(self, *extra: str, env_extra: dict[str, str] | None = None) -> _Worker:
        argv = [
            "--system",
            self.spec.system.value,
            "--state-dir",
            str(self.sd.root),
            "--thread",
            THREAD,
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SEAM_VARS}
        env.update(env_extra or {})
        self.result.processes += 1
        stdout = self.sd.root / f"worker-{self.result.processes}.out"
        stderr = self.sd.root / "workers.log"
        stdout.touch()
        if self.server is not None:
            return _Worker(self.server.spawn(argv, env, stdout, stderr), stdout)
        return _Worker(_Popen(argv, env, stdout, stderr), stdout)

    def record(self, worker: _Worker, code: int) -> int:
        self.last = worker
        self.result.exit_codes.append(code)
        if worker.hung:
            self.result.notes.append(f"process {self.result.processes} hung; killed")
        summary = worker.summary()
        if summary.get("runner_refused_fork"):
            self.result.runner_refused_fork = True
        return code

    def run_killed(self, delay_s: float) -> int:
        """Run one worker and SIGKILL it ``delay_s`` after READY unless it ended first."""
        worker = self.launch()
        worker.wait_ready()
        code = worker.proc.wait(delay_s)
        if code is None:
            worker.proc.kill()
            self.result.kills += 1
            code = worker.wait()
        return self.record(worker, code)

    def run_once(self, *extra: str, env_extra: dict[str, str] | None = None) -> int:
        worker = self.launch(*extra, env_extra=env_extra)
        code = self.record(worker, worker.wait())
        if code in (137, -signal.SIGKILL) and not worker.hung:
            self.result.kills += 1
        return code

    def _stalled(self) -> bool:
        if self.last is None:
            return False
        return str(self.last.summary().get("status", "")).startswith("stalled")

    def finish(self, last: int | None) -> None:
        """Start new workers until the thread is done, held for a human, or the bound."""
        held = stalled = 0
        code = last
        for _ in range(self.spec.max_runs):
            if code == EXIT_DONE:
                break
            if code == EXIT_HELD:
                if held >= _HELD_RETRIES:
                    break
                held += 1
            if self._stalled():
                stalled += 1
                if stalled > _HELD_RETRIES:
                    break  # two fresh processes could not move the thread at all
            if code == EXIT_BUSY:
                time.sleep(_BUSY_PAUSE_S)
            self.result.resumes += 1
            code = self.run_once()
        self.result.finished = code == EXIT_DONE
        self.result.held = code == EXIT_HELD
        self.result.stalled = not self.result.finished and self._stalled()
        if not self.result.finished and self.last is not None:
            summary = self.last.summary()
            errors = summary.get("errors") or [summary.get("error")]
            self.result.notes.append(f"last worker: {summary.get('status')}: {errors[-1]}")


# --- scenarios ----------------------------------------------------------------------------


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
    spec: TrialSpec, workdir: Path, *, server: ForkServer | None = None, keep: bool = False
) -> TrialResult:
    """Run one trial in a fresh state directory under ``workdir`` and judge it.

    Args:
        spec: the trial.
        workdir: parent of the trial's state directory.
        server: fork workers from this server; None: start each as ``python -m``.
        keep: keep the state directory (default: removed after judging).

    Returns:
        The trial's counts, read from the external systems' own storage.
    """
    from effectgate.demo.services import DemoServices

    if spec.system is System.PG_WORKERS:
        from effectgate.testing.campaign._pgworkers import run_pg_workers_trial

        return run_pg_workers_trial(spec, workdir, server=server, keep=keep)
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
