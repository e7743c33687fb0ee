"""``effectgate worker``: processes that take threads ready to run, each under its lease.

A worker scans the threads recorded in the ledger and takes the ones it can
move forward:

- **new**: recorded (``submit``) but never run: it starts them;
- **unfinished**: stopped with tasks left and nothing to ask (a worker died
  mid-run, or a run was cut short): it resumes them;
- **waiting for review**: only with a review policy (``approve="all"`` or
  ``"none"``, for demos, tests and benchmarks); otherwise they wait for a
  person (``effectgate resume --decisions``). A thread waiting for a
  reconciliation verdict always waits for a person (``effectgate reconcile``).

Every run goes through ``Agent.start`` / ``Agent.resume``, so through the
thread lease and the runner's recovery rules: a thread whose lease a live
worker holds is skipped; a dead worker's lease is taken over at once when its
process is proven gone (same host), otherwise after the lease expires by the
database's clock; its IN_FLIGHT attempts become UNKNOWN and are settled by
each tool's contract, and an attempt whose worker is not proven gone is
never repeated blindly (``effectgate._process``).

Many workers may run on one machine (``processes``) or on many (each runs
``effectgate worker`` against the same ``--store``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from effectgate._queue import Readiness, readiness
from effectgate.errors import (
    CheckpointCorruptError,
    ClaimLostError,
    ConfigError,
    LedgerBusyError,
    LedgerCorruptError,
    ThreadBusyError,
)
from effectgate.ledger._backoff import full_jitter_delay

if TYPE_CHECKING:
    from effectgate._app import StateDir
    from effectgate.demo.services import ServiceEndpoints
    from effectgate.graph import Agent, RunResult
    from effectgate.ledger import ThreadRecord

__all__ = [
    "MAX_PROCESSES",
    "WorkerOptions",
    "report_line",
    "run_worker_processes",
    "work",
    "worker_main",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How a worker runs.

    ``approve``: ``"all"``, ``"none"`` or ``None`` (leave reviews to people);
    ``poll_s``: seconds between scans when nothing was ready; ``until_idle``:
    exit once every thread is done or waits for a person (none new,
    unfinished or held by a lease); ``reviewer``: name on automatic approvals.
    """

    approve: str | None = None
    poll_s: float = 0.5
    until_idle: bool = False
    reviewer: str = "worker"


def _finished(agent: Agent, thread_id: str) -> bool:
    """Whether the thread is done, as this agent reads it (``False`` if it cannot say)."""
    try:
        return readiness(agent, thread_id) is Readiness.DONE
    except (ConfigError, LedgerCorruptError, CheckpointCorruptError):
        return False


def _answers(
    result: RunResult, opts: WorkerOptions, notes: list[tuple[str, str]]
) -> dict[str, Any]:
    """One answer per pending review the policy may answer, keyed by its interrupt id.

    The policy is the CLI's ``--approve all|none`` (``BlanketDecisions``), the
    one home of that rule: it never approves a possible duplicate (of an
    operation that took effect, or of a compacted one), a repeat of a
    rejected call, a call a reviewer's edit replaced, a compacted operation,
    or a call whose allowed decisions exclude approval. Such a review is left
    for a person, and ``notes`` says why (``("left_for_review", why)``); an
    UNSAFE call approved adds ``("warning", text)``. Reconciliations are left out: a
    verdict is a person's call.
    """
    from effectgate.cli._decisions import BlanketDecisions

    policy = BlanketDecisions(
        approve=opts.approve == "all",
        reviewer=opts.reviewer,
        say=lambda text: notes.append(("left_for_review", text)),
        warn=lambda text: notes.append(("warning", text)),
    )
    answers: dict[str, Any] = {}
    for item in result.interrupts:
        if isinstance(item.value, Mapping) and item.value.get("type") == "review":
            answer = policy.review(item.value)
            if answer is not None:
                answers[item.id] = answer
    return answers


def _run_one(
    agent: Agent,
    thread_id: str,
    state: Readiness,
    opts: WorkerOptions,
    notes: list[tuple[str, str]],
) -> tuple[RunResult, bool]:
    """Run one thread as far as it goes; the result, and whether the run moved it at all.

    A thread at a review that the policy leaves alone (nothing it may
    answer) has not moved: counting it as work would have a worker take it
    again at once, forever, and keep ``until_idle`` from ever ending.
    ``notes`` receives why the policy left a review alone, and its warnings.
    """
    if state is Readiness.NEW:
        record = agent.ledger.get_thread(thread_id)
        task = str(record.input.get("task", "")) if record is not None else ""
        meta = dict(record.metadata) if record is not None else {}
        result = agent.start(task, thread_id=thread_id, metadata=meta)
    else:
        result = agent.resume(thread_id)
    moved = state is not Readiness.REVIEW
    while opts.approve and result.status == "waiting_review":
        answers = _answers(result, opts, notes)
        if not answers:
            break
        result = agent.resume(thread_id, answers=answers)
        moved = True
    return result, moved


def _take(
    agent: Agent,
    thread_id: str,
    state: Readiness,
    opts: WorkerOptions,
    *,
    say: Callable[[Mapping[str, Any]], None] | None,
    skipped: set[str],
    noted: set[str] | None = None,
    stop: threading.Event | None = None,
) -> Literal["moved", "held", "still", "stopped"]:
    """Run one ready thread; ``"moved"``, ``"held"`` (another worker has it) or ``"still"``.

    ``"stopped"``: the run was made and ended early because the worker was
    asked to stop (``stop`` set): it counts as a run, like ``"moved"`` (its
    effects happened), and the loop ends. Before, such a run was taken for
    a held thread and the summary said ``runs 0`` after an approved
    ``run_shell`` had run to its end.

    Why the review policy left a review for a person is said once per
    thread and reason (``noted`` remembers what was said).
    """
    notes: list[tuple[str, str]] = []
    try:
        result, progressed = _run_one(agent, thread_id, state, opts, notes)
    except ThreadBusyError:
        return "held"  # another worker took it between the look and the lease
    except ClaimLostError as exc:
        # This worker's attempt was fenced off mid-call (it was stopped past
        # its lease and another worker took the thread over): the thread is
        # the other worker's now; the late result is kept as a ledger note.
        _say_once(say, noted, {"thread_id": thread_id, "fenced": str(exc)})
        return "held"
    except ConfigError as exc:
        # This worker lacks what the thread needs (a tool it started
        # with): one thread must not stop the others. Say so, once.
        skipped.add(thread_id)
        if say is not None:
            say({"thread_id": thread_id, "was": state.value, "skipped": str(exc)})
        return "still"
    except (LedgerCorruptError, CheckpointCorruptError) as exc:
        _say_once(say, noted, _unreadable(thread_id, exc))
        return "still"
    except KeyboardInterrupt as exc:  # a second signal: the command's error names the thread
        from effectgate.cli._signals import RunAborted

        if isinstance(exc, RunAborted):
            raise
        raise RunAborted(thread_id) from exc
    finally:
        for kind, note in notes:
            _say_once(say, noted, {"thread_id": thread_id, kind: note})
    if not progressed:
        return "still"  # its review waits for what the policy does not answer
    if result.status == "incomplete":
        return _incomplete(thread_id, state, result.error, say=say, noted=noted, stop=stop)
    if say is not None:
        say({"thread_id": thread_id, "was": state.value, "status": result.status})
    return "moved"


def _incomplete(
    thread_id: str,
    state: Readiness,
    error: str | None,
    *,
    say: Callable[[Mapping[str, Any]], None] | None,
    noted: set[str] | None,
    stop: threading.Event | None,
) -> Literal["held", "stopped"]:
    """What ``_take`` makes of a run that ended early (status ``incomplete``).

    Stopped by the worker's own stop (``stop`` set): ``"stopped"``, a run
    made, said once. Otherwise (an operation it needs is in flight under
    another live runner, a model error) taking it again at once would only
    spin: like a held thread, ``"held"``, tried again after the poll pause
    (``until_idle`` waits for it), said once per reason.
    """
    line = {"thread_id": thread_id, "was": state.value, "status": "incomplete", "error": error}
    if stop is not None and stop.is_set():
        if say is not None:
            say(line)
        return "stopped"
    _say_once(say, noted, line)
    return "held"


def _threads(
    agent: Agent, say: Callable[[Mapping[str, Any]], None] | None, noted: set[str]
) -> list[ThreadRecord]:
    """The ledger's threads (not their follow-up turns' records); a damaged one is said once.

    Read again on each scan, so a repaired record is taken up. The same list
    ``threads`` and ``pending`` show (``_inspect.thread_records``): before, a
    follow-up turn's record ``T#turn-n`` was taken for a thread and skipped
    with "the task is empty".
    """
    from effectgate.cli._inspect import thread_records

    unreadable: dict[str, str] = {}
    records = thread_records(agent.ledger, unreadable)
    for thread_id, why in unreadable.items():
        _say_once(say, noted, _unreadable(thread_id, why))
    return records


def _unreadable(thread_id: str, exc: Exception | str) -> dict[str, Any]:
    """The line a worker says of a thread whose ledger rows or checkpoint fail to decode."""
    why = str(exc)
    return {
        "thread_id": thread_id,
        "skipped": f"its stored state cannot be read ({why}); left for a person, "
        "the other threads go on",
    }


def _say_once(
    say: Callable[[Mapping[str, Any]], None] | None,
    noted: set[str] | None,
    line: Mapping[str, Any],
) -> None:
    """Say ``line`` unless ``noted`` shows it was said (the same line, to the letter) before."""
    key = json.dumps(line, sort_keys=True, default=str)
    if say is not None and (noted is None or key not in noted):
        say(line)
    if noted is not None:
        noted.add(key)


def work(
    agent: Agent,
    opts: WorkerOptions,
    *,
    say: Callable[[Mapping[str, Any]], None] | None = None,
    stop: threading.Event | None = None,
    refuses: Callable[[ThreadRecord], str | None] | None = None,
) -> int:
    """Take ready threads until stopped (or idle, with ``until_idle``); return how many runs.

    Args:
        agent: an agent on the shared store (``open_agent(..., store=...)``).
        opts: the worker's options.
        say: receives one JSON-compatible line per run (thread, status).
        stop: once set, no new run starts (pair it with ``agent.request_stop``
            to end the current run at a superstep boundary).
        refuses: why this worker must not run a thread (another agent's
            thread: ``worker_main`` matches the thread's recorded
            ``--agent`` recipe), or ``None`` to take it; reported once as
            ``skipped``, like a thread that needs a tool the agent lacks.

    A database that stays out of reach past the store's own retries
    (``DatabaseUnavailableError``, or a ``LedgerBusyError``) does not end the
    worker and says nothing about any thread: it is said once per outage,
    the worker backs off (full jitter, ``poll_s`` doubling up to
    ``_OUTAGE_CAP_S``) and scans again once the database answers. The
    thread it was running stays unfinished and is taken up again then.

    Returns:
        The number of runs this worker made.
    """
    stop = stop or threading.Event()
    runs = 0
    outages = 0
    rng = random.Random()
    state = _ScanState(skipped=set(), noted=set())
    while not stop.is_set():
        try:
            moved, held = _scan(agent, opts, say=say, stop=stop, refuses=refuses, state_of=state)
        except LedgerBusyError as exc:
            outages += 1
            if outages == 1 and say is not None:
                say({"database": "unavailable", "error": str(exc), "worker": agent.worker})
            base = max(opts.poll_s, 0.05)
            stop.wait(full_jitter_delay(outages, base_s=base, cap_s=_OUTAGE_CAP_S, rng=rng))
            continue
        if outages and say is not None:
            say({"database": "available", "worker": agent.worker})
        outages = 0
        runs += moved
        if moved == 0:
            if opts.until_idle and held == 0:
                return runs
            stop.wait(opts.poll_s)
    return runs


_OUTAGE_CAP_S = 5.0
"""The longest pause, in seconds, between two scans of a worker whose database is unavailable."""


@dataclass(slots=True)
class _ScanState:
    skipped: set[str]
    """Threads this worker cannot run (a tool it lacks): reported once, then left alone."""
    noted: set[str]
    """Why the review policy left a review for a person, per thread: said once."""


def _scan(
    agent: Agent,
    opts: WorkerOptions,
    *,
    say: Callable[[Mapping[str, Any]], None] | None,
    stop: threading.Event,
    refuses: Callable[[ThreadRecord], str | None] | None,
    state_of: _ScanState,
) -> tuple[int, int]:
    """One pass over the threads: ``(moved, held)``; each thread moved is one run.

    Raises:
        LedgerBusyError: the database was unavailable (or locked) past its retries.
    """
    skipped, noted = state_of.skipped, state_of.noted
    moved = held = 0
    for record in _threads(agent, say, noted):
        if stop.is_set():
            break
        if record.thread_id in skipped:
            continue
        why = refuses(record) if refuses is not None else None
        if why is not None:
            skipped.add(record.thread_id)
            # Said only of a thread with something left to do: another
            # agent's finished thread is nobody's work.
            if say is not None and not _finished(agent, record.thread_id):
                say({"thread_id": record.thread_id, "skipped": why})
            continue
        try:
            state = readiness(agent, record.thread_id)
        except (LedgerCorruptError, CheckpointCorruptError) as exc:
            # One damaged row must not stop every worker (each would
            # meet it on its scan): the thread waits for a person, the
            # others go on. Read again on each scan, so a repaired
            # thread is taken; said once.
            _say_once(say, noted, _unreadable(record.thread_id, exc))
            continue
        if state is Readiness.HELD:
            held += 1
        takes_review = state is Readiness.REVIEW and opts.approve is not None
        if state not in (Readiness.NEW, Readiness.UNFINISHED) and not takes_review:
            continue
        outcome = _take(
            agent, record.thread_id, state, opts, say=say, skipped=skipped, noted=noted, stop=stop
        )
        held += outcome == "held"
        moved += outcome in ("moved", "stopped")
    return moved, held


MAX_PROCESSES = 64
"""The most worker processes one ``effectgate worker --processes N`` runs.

Each is a Python process with its own connections (up to a few hundred MB
and several database connections): past this, start more pools or more
machines rather than exhaust one host's memory and the server's
``max_connections`` by a typo."""

_RESTARTS_PER_MINUTE = 10
"""Replacements of killed workers allowed in any 60 s: past it the pool stops replacing them."""


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _spawn(
    command: Sequence[str], env: Mapping[str, str] | None, into: list[subprocess.Popen[bytes]]
) -> None:
    """Start one worker process into ``into``, SIGINT and SIGTERM blocked until it handles them.

    A child inherits the signal mask across ``exec``; the CLI unblocks the
    two signals right after installing its handler (``effectgate.cli.main``),
    so a stop the pool passes on while a child is still starting Python is
    delivered then, and handled, instead of killing it with no summary. The
    pool's own handler is held off too until the child is in ``into``, so
    it passes the stop on to that child as well.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        from effectgate.cli._output import json_stdout

        out = json_stdout()  # with --json, fd 1 is stderr now: give the child the real stdout
        try:
            stdout: Any = out if out.fileno() >= 0 else None
        except (AttributeError, OSError, ValueError):
            stdout = None
        into.append(
            subprocess.Popen(command, env=None if env is None else dict(env), stdout=stdout)
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_worker_processes(
    argv: Sequence[str],
    processes: int,
    *,
    env: Mapping[str, str] | None = None,
    stopped: Callable[[], bool] | None = None,
) -> int:
    """Run ``processes`` copies of the worker command line, replacing any killed; return the exit.

    A child killed by a signal (``kill -9``, the OOM killer) is replaced at
    once, with one line on stderr, as a process supervisor would (its threads
    are taken over by the others meanwhile, repeating no effect). A child
    that exits by itself (idle with ``--until-idle``, an error) is not. More
    than ``_RESTARTS_PER_MINUTE`` replacements in a minute stop the
    replacing, so a worker that is killed at every start does not loop.
    SIGINT and SIGTERM are passed on to every child, which finishes its run
    (a stop request) and exits; nothing is replaced after that.

    Args:
        argv: the arguments after ``effectgate`` for one worker (``--processes 1``).
        processes: how many to run.
        env: the children's environment (default: this process's). A secret
            such as the ``--store`` URL goes here, never on ``argv``: any
            user of the machine reads a process's argv (``ps``,
            ``/proc/PID/cmdline``), only its owner its environment.
        stopped: whether a stop came before this pool's handler was in place
            (the CLI's ``STOPPER.requested``); then no worker is started and
            the pool returns 5.

    Returns:
        The worst exit status of the children, a death by a signal counted as
        1 (an unexpected error; its threads stay resumable), never the raw
        negative status (which a shell shows as 247 for ``kill -9``).
    """
    command = [sys.executable, "-m", "effectgate.cli", *argv]
    environ = None if env is None else dict(env)
    children: list[subprocess.Popen[bytes]] = []
    # A plain flag, never an Event: ``Event.set`` in the handler deadlocks if
    # the signal lands while the main thread holds the Event's lock.
    stopping: list[int] = []
    restarts: list[float] = []

    def forward(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in _STOP_SIGNALS}
    codes: list[int] = []
    try:
        if stopped is not None and stopped():
            from effectgate.cli._exit import ExitCode

            stopping.append(0)  # stopped while the pool was starting: start no worker
            codes.append(int(ExitCode.INCOMPLETE))
        for _ in range(processes):
            if not stopping:
                _spawn(command, environ, children)
        while children:
            for child in list(children):
                code = child.poll()
                if code is None:
                    continue
                children.remove(child)
                now = time.monotonic()
                restarts[:] = [t for t in restarts if now - t < 60.0]
                if code < 0 and not stopping:
                    name = signal.Signals(-code).name if -code in signal.valid_signals() else code
                    if len(restarts) < _RESTARTS_PER_MINUTE:
                        restarts.append(now)
                        _spawn(command, environ, children)
                        print(
                            f"effectgate worker: worker {child.pid} was killed ({name}); "
                            "started another",
                            file=sys.stderr,
                            flush=True,
                        )
                        continue
                    print(
                        f"effectgate worker: worker {child.pid} was killed ({name}); "
                        f"not replaced ({_RESTARTS_PER_MINUTE} replacements in the last minute)",
                        file=sys.stderr,
                        flush=True,
                    )
                codes.append(1 if code < 0 else code)
            if children:
                time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return max(codes, key=lambda c: (c != 0, c), default=0)


def report_line(data: Mapping[str, Any]) -> None:
    """Print one JSON line on stdout (the worker's progress format with ``--json``)."""
    from effectgate.cli._output import json_stdout

    print(json.dumps(dict(data), default=str), file=json_stdout(), flush=True)


def report_text(data: Mapping[str, Any]) -> None:
    """Print one ``key=value`` line on stdout (the worker's progress format without ``--json``)."""
    from effectgate.cli._render import terminal_safe

    print(" ".join(f"{k}={terminal_safe(str(v))}" for k, v in data.items()), flush=True)


def _refuses(
    sd: StateDir,
    spec: str | None,
    model: str | None = None,
    *,
    services: bool = False,
    state_dir: Path | None = None,
) -> Callable[[ThreadRecord], str | None]:
    """Skip the threads of another agent: each thread runs with the recipe it was started with.

    And with the model it was started with: a thread whose record names a
    model spec (``effectgate run --model``) other than ``model`` (this
    worker's ``--model``, compared as ``stored_model_spec`` stores it) is
    left for a worker with that model. Another model would propose calls
    the thread never planned and could end it ``done`` on a wrong answer.
    A thread that records no model (started through the library) runs
    with ``model``.

    And with the demo services it was started with (``effectgate demo``,
    ``run --with-services``): without their addresses (``services``: this
    worker read ``services/endpoints.json``) its agent lacks the ticket and
    mail tools, and recovering an interrupted call without them would leave
    for a person what a lookup settles. Such a thread's line names
    ``effectgate resume --thread T`` (``state_dir``: the ``--state-dir`` to
    spell in it), which starts the services, and the worker that takes it
    while ``effectgate services`` runs.
    """
    from effectgate.cli._loader import thread_agent
    from effectgate.cli._runner import uses_services
    from effectgate.cli._runs import services_skip, stored_model_spec

    mine = None if model is None else stored_model_spec(model)
    demo_tools = "the demo ticket and mail services"

    def why(record: ThreadRecord) -> str | None:
        theirs = thread_agent(sd, record.thread_id, record.metadata)
        needs = theirs is None and uses_services(record.metadata)
        if theirs != spec:
            if needs:
                return services_skip(
                    state_dir,
                    record.thread_id,
                    f"it runs with the built-in tools and {demo_tools}",
                    "a worker without --agent",
                )
            if theirs is None:
                return "it runs with the built-in tools: a worker without --agent takes it"
            return f"it runs with --agent {theirs}: a worker with --agent {theirs} takes it"
        recorded = record.metadata.get("model")
        if mine is not None and isinstance(recorded, str) and recorded != mine:
            if needs:
                return services_skip(
                    state_dir,
                    record.thread_id,
                    f"it runs with --model {recorded} and {demo_tools}",
                    f"a worker with --model {recorded}",
                )
            return f"it runs with --model {recorded}: a worker with --model {recorded} takes it"
        if needs and not services:
            return services_skip(
                state_dir,
                record.thread_id,
                f"it runs with {demo_tools} and none runs for this worker "
                "(no services/endpoints.json that names answering ones)",
                "a worker",
            )
        return None

    return why


def _service_endpoints(path: Path, *, probe: bool = True) -> ServiceEndpoints | None:
    """The demo services' addresses from ``path`` (``effectgate services`` writes it), or ``None``.

    Args:
        path: the state directory's ``services/endpoints.json``.
        probe: ask whether the servers can be used (``demo.services.serving``:
            their owner process is not gone and they answer).
            A file naming servers that do not (an ``effectgate services`` that
            was killed, or stopped on another machine) is treated as absent,
            with one note on stderr: the worker then leaves the demo threads
            with the line that names who takes them, rather than run their
            calls against ports nothing listens on. A pool's parent checks
            the file without probing; each worker process probes for itself.

    Returns:
        ``None`` when there is no such file (no services started here), or
        when ``probe`` found its servers not answering.

    Raises:
        ConfigError: the file is damaged (``demo.services.published_endpoints``):
            the worker would otherwise send the tools' requests nowhere, or crash.
    """
    from effectgate.demo.services import published_endpoints, serving

    endpoints = published_endpoints(path.parent)
    if endpoints is not None and probe and not serving(path.parent, endpoints):
        print(
            f"effectgate worker: {path} names demo services that do not answer "
            f"({endpoints.ticket_url}, {endpoints.mail_url}, SMTP "
            f"{endpoints.smtp_host}:{endpoints.smtp_port}): taken as absent, their threads "
            "are left; run 'effectgate services' for this state directory",
            file=sys.stderr,
            flush=True,
        )
        return None
    return endpoints


def worker_main(
    state_dir: Path,
    *,
    store: str | None,
    processes: int,
    model: str,
    approve: str | None,
    until_idle: bool,
    lease_ttl_s: float,
    json_out: bool = True,
    agent_spec: str | None = None,
) -> int:
    """``effectgate worker``: run ``processes`` workers on a state directory; return the exit code.

    The demo services' addresses are read from ``services/endpoints.json``
    when present (``effectgate services`` writes it), so the ticket and mail
    tools reach them; the model is ``model`` for every thread. With
    ``agent_spec`` (``module:factory``, as ``effectgate run --agent``) the
    agent is built from that recipe (its tools, policy, prompt, and its model
    if it names one), and the worker takes only the threads recorded with
    that recipe; without it, only the threads of the built-in tools.

    Raises:
        ConfigError: bad state directory, store, model specification or recipe,
            or ``processes`` outside 1..``MAX_PROCESSES``.
    """
    if not 1 <= processes <= MAX_PROCESSES:
        raise ConfigError(
            f"--processes {processes}: expected 1 to {MAX_PROCESSES} worker processes "
            "per pool; start more pools (or machines) for more"
        )
    from effectgate._app import StateDir, open_agent
    from effectgate.cli._loader import load_recipe, recipe_options

    sd: StateDir = StateDir.open(state_dir, store=store)
    recipe = load_recipe(agent_spec, sd) if agent_spec is not None else None
    # A damaged file is refused once, before forking; each worker probes for itself.
    endpoints = _service_endpoints(sd.services / "endpoints.json", probe=processes == 1)
    if processes > 1:
        argv = ["worker", "--state-dir", str(sd.root), "--processes", "1", "--model", model]
        argv += ["--lease-ttl", str(lease_ttl_s)]
        argv += ["--approve", approve] if approve else []
        argv += ["--until-idle"] if until_idle else []
        argv += ["--agent", agent_spec] if agent_spec else []
        argv += ["--json"] if json_out else []
        # The store URL may hold a password: the children get it in their
        # environment (readable by its owner only), never on argv (``ps``).
        env = dict(os.environ)
        if store:
            from effectgate._postgres_app import STORE_ENV

            env[STORE_ENV] = store  # the envvar of the CLI's --store
        from effectgate.cli._signals import STOPPER

        return run_worker_processes(argv, processes, env=env, stopped=lambda: STOPPER.requested)
    opts = WorkerOptions(approve=approve, until_idle=until_idle)
    options: dict[str, Any] = {"model": model, "endpoints": endpoints}
    if recipe is not None:  # the recipe's tools, policy, prompt; its model, else --model
        options = {"model": recipe.model or model, **recipe_options(recipe)}
    from effectgate.cli._exit import ExitCode
    from effectgate.cli._signals import STOPPER

    say = report_line if json_out else report_text
    runs = 0
    with open_agent(sd, lease_ttl_s=lease_ttl_s, **options) as agent:
        stop = threading.Event()
        # The CLI's one handler (``STOPPER``, installed before anything else)
        # has seen every signal since the process began; a stop that came
        # during start-up is read here, and one during a run reaches both the
        # loop and the run through ``_LoopStop`` (from a thread of its own:
        # see ``stop_from_signal``). A second signal aborts (the handler).
        with STOPPER.running(_LoopStop(stop, agent)):
            if not STOPPER.requested:
                print(READY_LINE.format(worker=agent.worker), file=sys.stderr, flush=True)
                refuses = _refuses(
                    sd,
                    agent_spec,
                    model if recipe is None else None,
                    services=endpoints is not None,
                    state_dir=state_dir,
                )
                runs = work(agent, opts, say=say, stop=stop, refuses=refuses)
        say({"worker": agent.worker, "runs": runs, "stopped": STOPPER.requested})
    # Stopped by SIGINT / SIGTERM: incomplete, as every command the table documents.
    return int(ExitCode.INCOMPLETE if STOPPER.requested else ExitCode.DONE)


READY_LINE = "effectgate worker: ready ({worker}); SIGINT or SIGTERM stops it"
"""The stderr line a worker prints once it has opened the store and takes threads.

Documented (docs/postgres.md): a supervisor or a test may wait for it. A stop
at any moment, before or after it, ends the worker with its summary line."""


class _LoopStop:
    """What a worker's stop request does: end the loop (no new run) and the current run."""

    def __init__(self, stop: threading.Event, agent: Agent) -> None:
        self._stop, self._agent = stop, agent

    def request_stop(self, reason: str = "worker stopping") -> None:
        """Set the loop's stop event, then ask the agent's current run to stop."""
        self._stop.set()
        self._agent.request_stop(reason)
