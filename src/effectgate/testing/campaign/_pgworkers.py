"""``effectgate-pg-workers``: 4 ``effectgate worker`` processes and a reviewer on PostgreSQL.

One trial = a fresh schema on the PostgreSQL server (``EFFECTGATE_TEST_POSTGRES``,
default the local one), a fresh state directory bound to it (``--store``),
fresh demo services (slowed as in every trial), and ``THREADS`` threads
recorded for workers (``effectgate.submit``). Then, all at once:

- ``WORKERS`` processes run ``effectgate worker`` (the real command, no
  ``--approve``): they start new threads and resume unfinished ones, each
  under its thread lease;
- one reviewer process answers every pending review with an answer bound to
  its interrupt id (``Agent.resume(answers={interrupt_id: ...})``), which runs
  the thread on under the lease, exactly as ``effectgate resume`` does.

``kill-random``: 1..``max_kills`` SIGKILLs, each at a uniform moment in
``[0, kill_span_s]`` after every process said READY, each hitting one live
process (worker or reviewer) drawn at random. ``kill-seam``: the first
reviewer and the first worker run with ``EFFECTGATE_FAILPOINT=<seam>`` and
exit 137 at their first pass through it (arming every process would let
three of them kill three attempts of one operation in a row: its attempt
budget, after which it is FAILED or held for a person by design). Every
process that dies is replaced at once (bounded by ``max_runs``
replacements); once the reviewer reports every thread done or held for a
person, the workers get SIGTERM (a clean stop).

The oracle reads the ticket service's and the mail sink's own files and the
workspace bytes (``effectgate.testing.oracle.world``): the incident's ticket
once (it is one operation shared by the threads: same alert id), one mail
per thread (distinct Message-IDs), the note referring to the ticket; then
the ledger's open operations, every thread's checkpoint histories and its
final state.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._app import StateDir
from effectgate.testing.campaign._reviewer import LEASE_TTL_S, review_until_settled
from effectgate.testing.campaign._systems import EXIT_DONE, EXIT_HELD, NOTE, TASK
from effectgate.testing.campaign._trial import TrialResult, TrialSpec, _Trial, _Worker

if TYPE_CHECKING:
    from effectgate.testing.forkserver import ForkServer

__all__ = ["LEASE_TTL_S", "THREADS", "WORKERS", "review_until_settled", "run_pg_workers_trial"]

WORKERS = 4
"""``effectgate worker`` processes per trial."""
THREADS = 4
"""Threads submitted per trial (distinct thread ids ``t0``..)."""
_TRIAL_TIMEOUT_S = 180.0
_POLL_S = 0.02
_STOP_TIMEOUT_S = 30.0


def _admin_dsn() -> str:
    from effectgate.testing.postgres import DEFAULT_DSN, ENV_DSN

    return os.environ.get(ENV_DSN) or DEFAULT_DSN


class _Schema:
    """A fresh schema on the campaign's server; dropped (with everything in it) on close."""

    def __init__(self) -> None:
        import psycopg

        from effectgate.testing.postgres import with_search_path

        self.admin = _admin_dsn()
        self.name = f"campaign_{secrets.token_hex(6)}"
        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        self.url = with_search_path(self.admin, self.name)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')


def _prepare(sd: StateDir) -> list[str]:
    """Create the ledger and checkpoint tables once, and record the threads; return their ids."""
    from effectgate._app import open_agent
    from effectgate._queue import submit

    threads = [f"t{n}" for n in range(THREADS)]
    with open_agent(sd) as agent:  # migrates both stores before any worker races to
        for thread_id in threads:
            submit(agent, TASK, thread_id=thread_id)
    return threads


def _pid(worker: _Worker) -> int:
    proc: Any = worker.proc
    return int(proc.pid if hasattr(proc, "pid") else proc.process.pid)


class _Supervisor:
    """The trial's live processes: launch, replace the dead, kill at random, stop."""

    def __init__(self, spec: TrialSpec, sd: StateDir, result: TrialResult, server: Any) -> None:
        self.spec = spec
        self.result = result
        self.trial = _Trial(spec, sd, result, random.Random(spec.seed), server)
        self.rng = random.Random(spec.seed ^ 0x5EED)
        self.live: dict[_Worker, str] = {}
        self.replacements = 0
        self.reviewer_code: int | None = None

    def launch(self, role: str, seam: str | None) -> None:
        env = {"EFFECTGATE_FAILPOINT": seam} if seam else None
        argv = ["--role", role, "--lease-ttl", str(LEASE_TTL_S)]
        self.live[self.trial.launch(*argv, env_extra=env)] = role

    def wait_ready(self) -> None:
        for worker in list(self.live):
            worker.wait_ready()

    def reap(self) -> bool:
        """Record the processes that ended and replace the dead; True once the reviewer is done."""
        for worker, role in list(self.live.items()):
            code = worker.proc.wait(0)
            if code is None:
                continue
            del self.live[worker]
            self.trial.record(worker, code)
            if role == "reviewer" and code in (EXIT_DONE, EXIT_HELD):
                self.reviewer_code = code
                continue
            if code in (137, -signal.SIGKILL):
                self.result.kills += 1
            elif not (role == "worker" and code == 0):
                summary = worker.summary()
                self.result.notes.append(f"{role} exited {code}: {summary.get('error', '')}")
            if self.replacements >= self.spec.max_runs:
                continue
            self.replacements += 1
            self.result.resumes += 1
            self.launch(role, None)
        return self.reviewer_code is not None

    def kill_one(self) -> None:
        candidates = [w for w in self.live if w.proc.wait(0) is None]
        if candidates:
            self.rng.choice(candidates).proc.kill()  # counted when reaped (exit -9)

    def stop(self) -> None:
        """SIGTERM the workers (they finish their run and exit 0); SIGKILL what hangs."""
        for worker in self.live:
            if worker.proc.wait(0) is None:  # not reaped yet: the pid is still its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(_pid(worker), signal.SIGTERM)
        for worker in list(self.live):
            code = worker.proc.wait(_STOP_TIMEOUT_S)
            if code is None:
                worker.hung = True
                worker.proc.kill()
                code = worker.proc.wait(None)
            self.trial.record(worker, code if code is not None else -9)
        self.live.clear()


def _run(sup: _Supervisor) -> None:
    spec = sup.spec
    seam = spec.seam if spec.scenario == "kill-seam" else None
    # The seam is armed in the first reviewer (it answers reviews and runs the
    # effects that follow) and in one worker (it starts threads and resumes the
    # ones the dead leave): at most two attempts of one operation die at it,
    # inside its attempt budget of three, so a third can settle it.
    for n in range(WORKERS):
        sup.launch("worker", seam if n == 0 else None)
    sup.launch("reviewer", seam)
    sup.wait_ready()
    started = time.monotonic()
    kill_at = sorted(sup.rng.uniform(0.0, spec.kill_span_s) for _ in range(spec.kills))
    while time.monotonic() - started < _TRIAL_TIMEOUT_S:
        if sup.reap():
            break
        if not sup.live:
            sup.result.notes.append("every process ended and no replacement is left")
            break
        while kill_at and time.monotonic() - started >= kill_at[0]:
            kill_at.pop(0)
            sup.kill_one()
        time.sleep(_POLL_S)
    else:
        sup.result.notes.append(f"not settled within {_TRIAL_TIMEOUT_S:.0f} s")
    sup.stop()


def _judge(sd: StateDir, url: str, threads: list[str], result: TrialResult) -> None:
    from effectgate._app import open_agent
    from effectgate._queue import Readiness, readiness
    from effectgate.ledger import OpState
    from effectgate.ledger._postgres import PostgresLedger
    from effectgate.testing.oracle import checkpoint_problems, world

    w = world(sd)
    result.tickets, result.mails = w.tickets, w.mails
    result.duplicate_tickets = max(w.duplicate_tickets, w.tickets - 1)
    result.duplicate_mails = max(w.duplicate_mails, w.mails - len(threads))
    distinct_mails = w.mails - w.duplicate_mails
    note = w.files.get(NOTE, b"").decode("utf-8", errors="replace")
    from effectgate.demo.services import read_tickets

    refers = any(f"TICKET-{t['ticket_id']}" in note for t in read_tickets(sd.services))
    result.lost_actions = (w.tickets == 0) + max(0, len(threads) - distinct_mails) + (not refers)
    open_states = [OpState.IN_FLIGHT, OpState.UNKNOWN, OpState.NEEDS_RECONCILIATION]
    with PostgresLedger(url) as ledger:
        result.left_unknown = len(ledger.list(states=open_states))
    result.history_problems = sum(len(checkpoint_problems(url, t)) for t in threads)
    with open_agent(sd) as agent:
        states = {t: readiness(agent, t) for t in threads}
    unfinished = sorted(t for t, s in states.items() if s is not Readiness.DONE)
    result.finished = not unfinished
    result.held = any(s in (Readiness.REVIEW, Readiness.RECONCILIATION) for s in states.values())
    if unfinished:
        result.notes.append(
            "unfinished: " + ", ".join(f"{t} {states[t].value}" for t in unfinished)
        )


def run_pg_workers_trial(
    spec: TrialSpec, workdir: Path, *, server: ForkServer | None = None, keep: bool = False
) -> TrialResult:
    """Run one ``effectgate-pg-workers`` trial (see the module docstring) and judge it.

    Args:
        spec: the trial (``kill-random`` or ``kill-seam``).
        workdir: parent of the trial's state directory.
        server: fork workers from this server; None: start each as ``python -m``.
        keep: keep the state directory and the schema (default: both removed).

    Returns:
        The counts, read from the ticket and mail services' own files, the
        workspace, the ledger and the checkpoints in PostgreSQL.

    Raises:
        psycopg.OperationalError: the PostgreSQL server cannot be reached.
    """
    from effectgate.demo.services import DemoServices

    started = time.monotonic()
    root = workdir / f"{spec.system.value}-{spec.scenario}-{spec.index:05d}"
    shutil.rmtree(root, ignore_errors=True)
    schema = _Schema()
    result = TrialResult(
        system=spec.system.value,
        scenario=spec.scenario,
        index=spec.index,
        seed=spec.seed,
        seam=spec.seam,
    )
    try:
        sd = StateDir.open(root, store=schema.url)
        with DemoServices(sd.services) as services:
            services.set_error_rate("orders", 0.12)
            services.set_fault("tickets", "slow", delay_s=spec.service_delay_s)
            services.set_fault("mail", "slow", delay_s=spec.service_delay_s)
            threads = _prepare(sd)
            _run(_Supervisor(spec, sd, result, server))
        _judge(sd, schema.url, threads, result)
    finally:
        if not keep:
            schema.drop()
            shutil.rmtree(root, ignore_errors=True)
    result.duration_s = round(time.monotonic() - started, 3)
    return result
