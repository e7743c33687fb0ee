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

``effectgate-pg-faults`` runs the same processes against a private cluster
(``PrivateCluster``, one per trial running at once, reused across trials
with a fresh schema each) reached through a ``DroppingProxy``, and injects
``FAULT_KINDS``: a SIGKILL of a live process; ``pg_terminate_backend`` of
every backend of the trial's database; a restart of the cluster (``fast``
or ``immediate``, the latter a crash with recovery, asynchronous commits
lost); every connection cut at the proxy; a worker SIGSTOPped past its
lease (``LEASE_TTL_S`` plus 0.5-1.5 s), then SIGCONT. ``faults-random``
injects 2..``max_kills + 1`` of them at uniform moments in
``[0, kill_span_s]``; ``faults-seam`` runs the first reviewer and one
worker with ``EFFECTGATE_FAILPOINT=<seam>`` and
``EFFECTGATE_FAILPOINT_ACTION=stop``: each stops itself at its first pass
through the seam, the harness applies the trial's one fault while it is
frozen there, then continues it (a SIGKILLed one is replaced). A thread
left waiting for a reconciliation verdict (a stopped worker's call:
"not found" is not trusted while its worker may live) is settled once
every process has ended, by a person who reads the services' own records
(``_reviewer.verdict_for``), with one worker to run the threads on.

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
import queue
import random
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._app import StateDir
from effectgate.testing.campaign._reviewer import LEASE_TTL_S, review_until_settled
from effectgate.testing.campaign._systems import EXIT_DONE, EXIT_HELD, NOTE, TASK, System
from effectgate.testing.campaign._trial import TrialResult, TrialSpec, _Trial, _Worker

if TYPE_CHECKING:
    from effectgate.testing.forkserver import ForkServer
    from effectgate.testing.postgres import PrivateCluster
    from effectgate.testing.tcp_proxy import DroppingProxy

__all__ = [
    "FAULT_KINDS",
    "LEASE_TTL_S",
    "PG_FAULTS_SCENARIOS",
    "THREADS",
    "WORKERS",
    "ClusterPool",
    "review_until_settled",
    "run_pg_workers_trial",
]

WORKERS = 4
"""``effectgate worker`` processes per trial."""
THREADS = 4
"""Threads submitted per trial (distinct thread ids ``t0``..)."""
_TRIAL_TIMEOUT_S = 180.0
_POLL_S = 0.02
_STOP_TIMEOUT_S = 30.0

FAULT_KINDS = ("sigkill", "terminate", "restart-fast", "restart-immediate", "drop", "sigstop")
"""What ``effectgate-pg-faults`` injects (see the module docstring)."""
PG_FAULTS_SCENARIOS = ("faults-random", "faults-seam")
"""Its scenarios: faults at random moments, or one fault while a process is frozen at a seam."""
_DB_FAULTS = frozenset({"terminate", "restart-fast", "restart-immediate", "drop"})
_STOP_PAST_LEASE_S = (LEASE_TTL_S + 0.5, LEASE_TTL_S + 1.5)
_CLUSTER_DB = "campaign"
_CLUSTER_MAX_CONNECTIONS = 120


class ClusterPool:
    """Private PostgreSQL clusters for ``effectgate-pg-faults``, one per trial running at once.

    A trial takes one (``take``), breaks it as it likes (restarts included)
    and gives it back running; the next trial on it gets a fresh schema in
    its database ``campaign``. ``close`` stops and removes every cluster.
    Creating one costs an ``initdb`` (about a second); reusing it, nothing.

    Raises:
        FileNotFoundError: ``initdb`` / ``pg_ctl`` are not installed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[PrivateCluster] = []
        self._all: list[PrivateCluster] = []

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def take(self) -> Iterator[PrivateCluster]:
        """Yield a running cluster of this pool's, no other trial's meanwhile."""
        import psycopg

        from effectgate.testing.postgres import PrivateCluster

        with self._lock:
            cluster = self._free.pop() if self._free else None
        if cluster is None:
            cluster = PrivateCluster(max_connections=_CLUSTER_MAX_CONNECTIONS)
            with self._lock:
                self._all.append(cluster)
            cluster.start()
            with psycopg.connect(cluster.admin_dsn, autocommit=True, connect_timeout=10) as c:
                c.execute(f'CREATE DATABASE "{_CLUSTER_DB}"')
        else:
            _ensure_up(cluster)
        try:
            yield cluster
        finally:
            with self._lock:
                self._free.append(cluster)

    def close(self) -> None:
        """Stop and remove every cluster this pool made."""
        with self._lock:
            clusters, self._all, self._free = self._all, [], []
        for cluster in clusters:
            cluster.close()


def _ensure_up(cluster: PrivateCluster) -> None:
    """Start ``cluster`` if it does not answer (a restart that failed half-way)."""
    import subprocess

    import psycopg

    try:
        with psycopg.connect(cluster.admin_dsn, connect_timeout=5):
            return
    except psycopg.OperationalError:
        pass
    with contextlib.suppress(subprocess.CalledProcessError):
        cluster.start()


class _Injector:
    """Database and network faults of one trial, applied one at a time in a thread of their own.

    A restart takes a second or more; the supervisor goes on reaping and
    replacing processes meanwhile. Each fault delivered is counted in
    ``result.faults`` by kind.
    """

    def __init__(self, cluster: PrivateCluster, proxy: DroppingProxy, result: TrialResult) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.result = result
        self.lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._thread.start()

    def count(self, kind: str) -> None:
        with self.lock:
            self.result.faults[kind] = self.result.faults.get(kind, 0) + 1

    def submit(self, kind: str) -> None:
        """Apply ``kind`` (one of the database faults) soon, after those before it."""
        self._queue.put(kind)

    def apply(self, kind: str) -> None:
        """Apply ``kind`` now and wait until it is done (the server back up after a restart)."""
        import subprocess

        try:
            if kind == "terminate":
                self.cluster.terminate_backends(_CLUSTER_DB)
            elif kind == "restart-fast":
                self.cluster.restart("fast")
            elif kind == "restart-immediate":
                self.cluster.restart("immediate")
            elif kind == "drop":
                self.proxy.drop_all()
            else:  # pragma: no cover - a planning error
                raise ValueError(f"not a database fault: {kind!r}")
        except (subprocess.CalledProcessError, OSError) as exc:
            with self.lock:
                self.result.notes.append(f"fault {kind} failed: {exc}")
            _ensure_up(self.cluster)
            return
        self.count(kind)

    def _run(self) -> None:
        while (kind := self._queue.get()) is not None:
            try:
                self.apply(kind)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def close(self) -> None:
        """Wait for the faults submitted so far, then end the thread."""
        self._queue.put(None)
        self._thread.join()


def _stopped(worker: _Worker) -> bool:
    """Whether ``worker``'s process is stopped (state ``T`` in ``/proc``)."""
    try:
        text = Path(f"/proc/{_pid(worker)}/stat").read_text()
    except OSError:
        return False
    return text.rpartition(")")[2].split()[:1] == ["T"]


def _admin_dsn() -> str:
    from effectgate.testing.postgres import DEFAULT_DSN, ENV_DSN

    return os.environ.get(ENV_DSN) or DEFAULT_DSN


class _Schema:
    """A fresh schema on the campaign's server; dropped (with everything in it) on close.

    Args:
        admin: a DSN of the database to create it in (default: the campaign's server).
        reach: the DSN the trial's processes use for that database (a proxy's;
            default ``admin``).
    """

    def __init__(self, admin: str | None = None, reach: str | None = None) -> None:
        import psycopg

        from effectgate.testing.postgres import with_search_path

        self.admin = admin or _admin_dsn()
        self.name = f"campaign_{secrets.token_hex(6)}"
        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        self.url = with_search_path(reach or self.admin, self.name)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')


_PREPARE_TRIES = 5
"""Tries of a trial's set-up before the trial (and the run) fails."""


def _prepare(sd: StateDir, cluster: PrivateCluster | None, result: TrialResult) -> list[str]:
    """Create the ledger and checkpoint tables once, and record the threads; return their ids.

    The set-up is idempotent (``submit`` of a recorded thread with the same
    task changes nothing), so a database that is unavailable for a while (a
    private cluster still recovering from the previous trial's immediate
    restart, on a loaded machine) is waited for: up to ``_PREPARE_TRIES``
    tries with exponential backoff (1, 2, 4, 8 s), the cluster started again
    if it does not answer, each retry noted in ``result.notes``.

    Raises:
        LedgerBusyError: the database stayed unavailable through every try.
    """
    from effectgate._app import open_agent
    from effectgate._queue import submit
    from effectgate.errors import LedgerBusyError

    threads = [f"t{n}" for n in range(THREADS)]
    for attempt in range(1, _PREPARE_TRIES + 1):
        try:
            with open_agent(sd) as agent:  # migrates both stores before any worker races to
                for thread_id in threads:
                    submit(agent, TASK, thread_id=thread_id)
            return threads
        except LedgerBusyError as exc:  # DatabaseUnavailableError is one
            if attempt == _PREPARE_TRIES:
                raise
            result.notes.append(f"set-up try {attempt} met {type(exc).__name__}; retried")
            if cluster is not None:
                _ensure_up(cluster)
            time.sleep(2 ** (attempt - 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _pid(worker: _Worker) -> int:
    proc: Any = worker.proc
    return int(proc.pid if hasattr(proc, "pid") else proc.process.pid)


class _Supervisor:
    """The trial's live processes: launch, replace the dead, kill at random, stop.

    With an ``injector`` (``effectgate-pg-faults``) it also freezes workers
    past their lease and continues them, and handles processes stopped at
    their seam.
    """

    def __init__(
        self,
        spec: TrialSpec,
        sd: StateDir,
        result: TrialResult,
        server: Any,
        injector: _Injector | None = None,
    ) -> None:
        self.spec = spec
        self.result = result
        self.trial = _Trial(spec, sd, result, random.Random(spec.seed), server)
        self.rng = random.Random(spec.seed ^ 0x5EED)
        self.live: dict[_Worker, str] = {}
        self.replacements = 0
        self.reviewer_code: int | None = None
        self.injector = injector
        self.frozen: dict[_Worker, float] = {}
        """Processes this harness stopped, and when (monotonic) to continue each."""
        self.armed: set[_Worker] = set()
        """Processes that stop themselves at the seam and have not met it yet."""
        self.seamed: set[_Worker] = set()
        """Every process started with the stop action (a later pass stops it again)."""

    def launch(self, role: str, seam: str | None, *, stop_at_seam: bool = False) -> None:
        env: dict[str, str] = {}
        if seam:
            env["EFFECTGATE_FAILPOINT"] = seam
            if stop_at_seam:
                env["EFFECTGATE_FAILPOINT_ACTION"] = "stop"
        argv = ["--role", role, "--lease-ttl", str(LEASE_TTL_S)]
        worker = self.trial.launch(*argv, env_extra=env or None)
        self.live[worker] = role
        if seam and stop_at_seam:
            self.armed.add(worker)
            self.seamed.add(worker)

    def wait_ready(self) -> None:
        for worker in list(self.live):
            worker.wait_ready()

    def _forget(self, worker: _Worker) -> None:
        self.frozen.pop(worker, None)
        self.armed.discard(worker)
        self.seamed.discard(worker)

    def reap(self, *, replace: bool = True) -> bool:
        """Record the processes that ended and replace the dead; True once the reviewer is done."""
        for worker, role in list(self.live.items()):
            code = worker.proc.wait(0)
            if code is None:
                continue
            del self.live[worker]
            self._forget(worker)
            self.trial.record(worker, code)
            if role in ("reviewer", "person") and code in (EXIT_DONE, EXIT_HELD):
                self.reviewer_code = code
                if role == "person":
                    self.result.verdicts += _verdicts_given(worker)
                continue
            if code in (137, -signal.SIGKILL):
                self.result.kills += 1
            elif not (role == "worker" and code == 0):
                summary = worker.summary()
                self.result.notes.append(f"{role} exited {code}: {summary.get('error', '')}")
            if not replace or self.replacements >= self.spec.max_runs:
                continue
            self.replacements += 1
            self.result.resumes += 1
            self.launch(role, None)
        return self.reviewer_code is not None

    def kill_one(self) -> None:
        candidates = [w for w in self.live if w.proc.wait(0) is None]
        if candidates:
            self.rng.choice(candidates).proc.kill()  # counted when reaped (exit -9)
            if self.injector is not None:
                self.injector.count("sigkill")

    def freeze(self, worker: _Worker) -> None:
        """SIGSTOP ``worker`` for longer than its lease; ``thaw`` continues it."""
        worker.proc.send_signal(signal.SIGSTOP)
        self.frozen[worker] = time.monotonic() + self.rng.uniform(*_STOP_PAST_LEASE_S)
        if self.injector is not None:
            self.injector.count("sigstop")

    def freeze_one(self) -> None:
        candidates = [
            w for w, role in self.live.items()
            if role == "worker" and w not in self.frozen and w.proc.wait(0) is None
        ]  # fmt: skip
        if candidates:
            self.freeze(self.rng.choice(candidates))

    def thaw(self, *, all_now: bool = False) -> None:
        """SIGCONT the frozen processes whose time is up (every one with ``all_now``)."""
        now = time.monotonic()
        for worker, until in list(self.frozen.items()):
            if all_now or now >= until:
                del self.frozen[worker]
                worker.proc.send_signal(signal.SIGCONT)

    def at_seam(self, kind: str | None) -> None:
        """Apply ``kind`` to each armed process stopped at its seam; continue later stops."""
        for worker in list(self.seamed):
            if worker in self.frozen or worker.proc.wait(0) is not None or not _stopped(worker):
                continue
            if worker not in self.armed or kind is None:
                worker.proc.send_signal(signal.SIGCONT)  # a later pass: go on
                continue
            self.armed.discard(worker)
            if kind == "sigkill":
                worker.proc.kill()
                assert self.injector is not None
                self.injector.count("sigkill")
            elif kind == "sigstop":  # it is stopped already: keep it so, past its lease
                self.frozen[worker] = time.monotonic() + self.rng.uniform(*_STOP_PAST_LEASE_S)
                assert self.injector is not None
                self.injector.count("sigstop")
            else:
                assert self.injector is not None
                self.injector.apply(kind)  # while the process is frozen at the seam
                worker.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the workers (they finish their run and exit 0); SIGKILL what hangs.

        Frozen processes are continued first; one that stops itself at its
        seam again on its way out is continued again.
        """
        self.armed.clear()
        self.thaw(all_now=True)
        for worker in self.live:
            if worker.proc.wait(0) is None:  # not reaped yet: the pid is still its own
                worker.proc.send_signal(signal.SIGCONT)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(_pid(worker), signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        for worker in list(self.live):
            code = worker.proc.wait(0)
            while code is None and time.monotonic() < deadline:
                self.at_seam(None)
                code = worker.proc.wait(_POLL_S * 5)
            if code is None:
                worker.hung = True
                worker.proc.kill()
                code = worker.proc.wait(None)
            self.trial.record(worker, code if code is not None else -9)
        self.live.clear()
        self.seamed.clear()


def _verdicts_given(worker: _Worker) -> int:
    """How many reconciliation verdicts the person process gave (its ``verdict`` lines)."""
    import json

    count = 0
    for raw in worker.stdout.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            count += isinstance(line, dict) and "verdict" in line
    return count


def _schedule(sup: _Supervisor) -> list[tuple[float, str]]:
    """The random moments (seconds after READY) and what happens at each."""
    spec = sup.spec
    if spec.system is System.PG_FAULTS:
        if spec.scenario != "faults-random":
            return []
        return sorted((sup.rng.uniform(0.0, spec.kill_span_s), kind) for kind in spec.faults)
    return sorted((sup.rng.uniform(0.0, spec.kill_span_s), "sigkill") for _ in range(spec.kills))


def _deliver(sup: _Supervisor, kind: str) -> None:
    if kind == "sigkill":
        sup.kill_one()
    elif kind == "sigstop":
        sup.freeze_one()
    else:
        assert sup.injector is not None
        sup.injector.submit(kind)


def _run(sup: _Supervisor) -> None:
    spec = sup.spec
    faults = spec.system is System.PG_FAULTS
    seam = spec.seam if spec.scenario in ("kill-seam", "faults-seam") else None
    seam_kind = spec.faults[0] if faults and seam and spec.faults else None
    # The seam is armed in the first reviewer (it answers reviews and runs the
    # effects that follow) and in one worker (it starts threads and resumes the
    # ones the dead leave): at most two attempts of one operation die at it,
    # inside its attempt budget of three, so a third can settle it.
    for n in range(WORKERS):
        sup.launch("worker", seam if n == 0 else None, stop_at_seam=faults)
    sup.launch("reviewer", seam, stop_at_seam=faults)
    sup.wait_ready()
    started = time.monotonic()
    plan = _schedule(sup)
    while time.monotonic() - started < _TRIAL_TIMEOUT_S:
        sup.thaw()
        if faults:
            sup.at_seam(seam_kind)
        if sup.reap():
            break
        if not sup.live:
            sup.result.notes.append("every process ended and no replacement is left")
            break
        while plan and time.monotonic() - started >= plan[0][0]:
            _deliver(sup, plan.pop(0)[1])
        time.sleep(_POLL_S)
    else:
        sup.result.notes.append(f"not settled within {_TRIAL_TIMEOUT_S:.0f} s")
    if sup.injector is not None:
        sup.injector.close()  # every database fault done: the server is up
    sup.stop()
    if faults and sup.reviewer_code == EXIT_HELD:
        _settle_by_a_person(sup)


def _settle_by_a_person(sup: _Supervisor) -> None:
    """Every process has ended: a person gives the verdicts, one worker runs the threads on."""
    sup.reviewer_code = None
    sup.launch("worker", None)
    sup.launch("person", None)
    deadline = time.monotonic() + _TRIAL_TIMEOUT_S
    while time.monotonic() < deadline and not sup.reap(replace=False) and sup.live:
        time.sleep(_POLL_S)
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
    spec: TrialSpec,
    workdir: Path,
    *,
    server: ForkServer | None = None,
    keep: bool = False,
    clusters: ClusterPool | None = None,
) -> TrialResult:
    """Run one ``effectgate-pg-workers`` or ``-pg-faults`` trial (module docstring); judge it.

    Args:
        spec: the trial (``kill-random`` or ``kill-seam``; ``faults-random`` or
            ``faults-seam`` for ``effectgate-pg-faults``).
        workdir: parent of the trial's state directory.
        server: fork workers from this server; None: start each as ``python -m``.
        keep: keep the state directory and the schema (default: both removed).
        clusters: where ``effectgate-pg-faults`` takes its private cluster
            (default: one made for this trial and removed after it).

    Returns:
        The counts, read from the ticket and mail services' own files, the
        workspace, the ledger and the checkpoints in PostgreSQL.

    Raises:
        psycopg.OperationalError: the PostgreSQL server cannot be reached.
        FileNotFoundError: ``effectgate-pg-faults`` without ``initdb`` / ``pg_ctl``.
    """
    if spec.system is not System.PG_FAULTS:
        return _trial_on(spec, workdir, server=server, keep=keep, cluster=None)
    with contextlib.ExitStack() as stack:
        pool = clusters if clusters is not None else stack.enter_context(ClusterPool())
        cluster = stack.enter_context(pool.take())
        return _trial_on(spec, workdir, server=server, keep=keep, cluster=cluster)


def _trial_on(
    spec: TrialSpec,
    workdir: Path,
    *,
    server: ForkServer | None,
    keep: bool,
    cluster: PrivateCluster | None,
) -> TrialResult:
    from effectgate.demo.services import DemoServices
    from effectgate.testing.tcp_proxy import DroppingProxy

    started = time.monotonic()
    root = workdir / f"{spec.system.value}-{spec.scenario}-{spec.index:05d}"
    shutil.rmtree(root, ignore_errors=True)
    proxy = DroppingProxy(("127.0.0.1", cluster.port)) if cluster is not None else None
    if cluster is not None and proxy is not None:
        reach = f"postgresql://postgres@127.0.0.1:{proxy.port}/{_CLUSTER_DB}"
        schema = _Schema(cluster.url(_CLUSTER_DB), reach)
    else:
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
            threads = _prepare(sd, cluster, result)
            injector = None
            if cluster is not None and proxy is not None:
                injector = _Injector(cluster, proxy, result)
            _run(_Supervisor(spec, sd, result, server, injector))
        _judge(sd, schema.url, threads, result)
    finally:
        if not keep:
            schema.drop()
            shutil.rmtree(root, ignore_errors=True)
        if proxy is not None:
            proxy.close()
    result.duration_s = round(time.monotonic() - started, 3)
    return result
