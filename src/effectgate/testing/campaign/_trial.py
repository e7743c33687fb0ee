"""One trial's parts: its plan (``TrialSpec``), its record (``TrialResult``), its processes.

``_Trial`` starts worker processes (``_worker``, as subprocesses or forks of
a ``ForkServer``), waits for READY, and resumes the thread until it is done
or a bound is hit; the scenarios that kill them live in ``_harness``, the
judging in ``_oracle``. This module imports neither, so both import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._app import StateDir
from effectgate.testing.campaign._systems import (
    EXIT_BUSY,
    EXIT_DONE,
    EXIT_HELD,
    THREAD,
    System,
)

if TYPE_CHECKING:
    from effectgate.testing.forkserver import ForkedProcess, ForkServer

__all__ = ["TrialResult", "TrialSpec"]

_WORKER_MODULE = "effectgate.testing.campaign._worker"
_GATED_BY_EFFECTGATE = frozenset(
    {System.EFFECTGATE, System.MIDDLEWARE, System.PG_WORKERS, System.PG_FAULTS}
)
"""Systems whose seams are effectgate's failpoints."""
_READY_TIMEOUT_S = 90.0
_POLL_S = 0.005
_SEAM_VARS = ("EFFECTGATE_FAILPOINT", "EFFECTGATE_FAILPOINT_ACTION", "CAMPAIGN_KILL")
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
    faults: tuple[str, ...] = ()
    """``effectgate-pg-faults``: the faults to inject (``FAULT_KINDS``), at random moments
    (``faults-random``) or the one applied while a process is stopped at ``seam``."""


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
    faults: dict[str, int] = field(default_factory=dict)
    """Faults delivered, by kind (``effectgate-pg-faults``; SIGKILLs are also in ``kills``)."""
    verdicts: int = 0
    """Reconciliation verdicts the trial's person gave once every process had ended."""
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the trial as JSON-ready data."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class _Popen:
    """A worker started as ``python -m ...`` (the mode without a fork server)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> None:
        command = [sys.executable, "-m", _WORKER_MODULE, *argv]
        with stdout.open("ab") as out, stderr.open("ab") as err:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env
            )

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)

    @property
    def pid(self) -> int:
        return self.process.pid

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
            proc = self.server.spawn(argv, env, stdout, stderr, module=_WORKER_MODULE)
            return _Worker(proc, stdout)
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
