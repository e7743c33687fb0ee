"""The runner ``demo``, ``run``, ``resume`` and ``--agent`` threads share.

``cli/_runs.py`` (``demo``, ``run``), ``cli/_resume.py`` (``resume``) and
``cli/_loader.py`` (``run --agent``, ``followup``) each say what differs in a
``Plan`` and hand it to ``execute``, which opens the agent (and the demo
services the thread needs), runs ``Plan.begin``, drives the thread to a stop
with the command's ``decision_source`` and prints the ``report``. The checks
every command makes before anything is written live here too:
``decision_source`` (the decisions file, its verdicts' operations) and
``check_crash_tools`` (a ``--crash-at NAME@tool`` naming a tool the agent
will lack).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from effectgate import _failpoints
from effectgate.cli._decisions import (
    BlanketDecisions,
    DecisionSource,
    FileDecisions,
    NoDecisions,
    load_decisions_file,
)
from effectgate.cli._exit import ExitCode, code_for_status
from effectgate.cli._output import Output, command_hint
from effectgate.cli._render import print_summary, result_json, status_line
from effectgate.cli._review_ui import TerminalReviewer
from effectgate.cli._session import (
    Driven,
    Progress,
    arm_failpoint,
    check_failpoint,
    drive,
    external_counts,
    judge_unused_verdicts,
)
from effectgate.cli._signals import STOPPER
from effectgate.errors import ConfigError, DecisionError, LedgerBusyError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from effectgate._app import StateDir
    from effectgate.answers import PendingLike
    from effectgate.demo import DemoServices, ServiceEndpoints
    from effectgate.graph import Agent, RunResult

__all__ = [
    "LEASE_WAIT_S",
    "Plan",
    "RunFlags",
    "check_crash_tools",
    "decision_source",
    "execute",
    "nowhere",
    "refuse_unused_reviews",
    "report",
    "thread_record",
    "uses_services",
]

LEASE_WAIT_S = 2.0
"""Seconds a command waits for a thread another live process holds before exiting 75."""

# Tools are built against these when only the checkpoint is read (status, pending):
# nothing is called, so no service has to run.
_NOWHERE = "http://127.0.0.1:9"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFlags:
    """Flags shared by ``demo``, ``run`` and ``resume``."""

    state_dir: Path
    approve: str | None = None
    """``"all"``, ``"none"`` or ``None``."""
    decisions: Path | None = None
    reviewer: str = "cli"
    crash_at: str | None = None
    store: str | None = None
    """``--store``: a ``postgresql://`` URL for the ledger and checkpoints, or ``None``."""


@dataclass(slots=True, kw_only=True)
class Plan:
    """What differs between the commands ``execute`` runs (demo, run, resume, ``--agent``).

    ``begin`` starts or resumes the thread on the opened agent and returns
    where it stopped; ``execute`` drives it on from there.
    """

    thread_id: str
    model: BaseChatModel
    services: bool
    begin: Callable[[Agent], RunResult]
    prepare: Callable[[DemoServices], None] | None = None
    """What a new demo world needs set on its services first (``effectgate demo``).

    ``None`` (resume, ``run --thread``): the command uses the services an
    ``effectgate services`` already runs for the state directory, when they
    answer, and starts its own only when none do.
    """
    resuming: bool = False
    """A resume: its decisions were meant for a review already waiting."""
    agent_options: Mapping[str, Any] = field(default_factory=dict)
    """``open_agent`` keywords of a ``--agent`` recipe (tools, policy, system prompt)."""


def uses_services(metadata: Mapping[str, Any]) -> bool:
    """Whether a thread runs with the demo ticket and mail tools, from its record's metadata.

    ``effectgate demo`` and ``effectgate run --with-services`` record it
    (``"services": true``); an older demo thread says only ``"kind": "demo"``.
    ``resume`` and ``run --thread`` start the demo services for such a thread.
    """
    return bool(metadata.get("services", metadata.get("kind") == "demo"))


def _check_verdict_operations(state_dir: Path, source: FileDecisions, path: Path) -> None:
    """Refuse verdicts naming operations the ledger does not hold, before anything runs."""
    from effectgate._app import StateDir

    wanted = source.verdict_operations
    if not wanted:
        return
    known: set[str] = set()
    marker = state_dir.expanduser() / "effectgate.json"
    # StateDir.open refuses a directory that is not ours
    sd = StateDir.open(state_dir, create=False) if marker.is_file() else None
    if sd is not None and sd.has_ledger():
        ledger = sd.open_ledger()
        try:
            known = {op_id for op_id in wanted if ledger.get(op_id) is not None}
        finally:
            ledger.close()
    unknown = [op_id for op_id in wanted if op_id not in known]
    if unknown:
        names = ", ".join(repr(op_id) for op_id in unknown)
        raise DecisionError(
            f"decisions file {path}: verdicts for unknown operation {names}; "
            "see effectgate pending or effectgate ledger list"
        )


def decision_source(flags: RunFlags, output: Output) -> DecisionSource:
    """Where the command's answers come from, checked before anything is written.

    Args:
        flags: ``--approve`` / ``--decisions`` / ``--reviewer`` and the state directory.
        output: where the source's notes go.

    Returns:
        ``FileDecisions`` for ``--decisions``, ``BlanketDecisions`` for
        ``--approve``, ``TerminalReviewer`` when stdin is a terminal, else
        ``NoDecisions`` (the thread is left waiting).

    Raises:
        ConfigError: ``--approve`` and ``--decisions`` given together.
        DecisionError: the decisions file is malformed, or names verdicts for
            operations the ledger does not hold.
    """
    if flags.approve is not None and flags.decisions is not None:
        raise ConfigError("--approve and --decisions exclude each other; give one")
    if flags.decisions is not None:
        source = FileDecisions(
            load_decisions_file(flags.decisions), reviewer=flags.reviewer, say=output.note
        )
        _check_verdict_operations(flags.state_dir, source, flags.decisions)
        return source
    if flags.approve is not None:
        return BlanketDecisions(
            approve=flags.approve == "all", reviewer=flags.reviewer, say=output.note
        )
    if sys.stdin.isatty():
        return TerminalReviewer(output.ui, reviewer=flags.reviewer)
    return NoDecisions()


def check_crash_tools(spec: str | None, state_dir: Path, *, services: bool) -> None:
    """Refuse ``--crash-at NAME@tool`` for a tool the command's agent will not have.

    Runs before the state directory or the services exist: building the
    tool specs touches nothing.

    Args:
        spec: the checked ``--crash-at`` value (``check_failpoint``), or ``None``.
        state_dir: ``--state-dir`` (the file tools' workspace is under it).
        services: whether the agent gets the demo ticket and mail tools.

    Raises:
        ConfigError: the named tool is not a side-effecting tool of that agent.
    """
    if spec is None or "@" not in spec:
        return
    from effectgate._app import default_tools

    tools = default_tools(state_dir / "workspace", nowhere() if services else None)
    _failpoints.check([t.name for t in tools if not t.is_read], spec)


def nowhere() -> ServiceEndpoints:
    """Demo service addresses nobody listens on: tools built for reading, never called.

    Returns:
        ``ServiceEndpoints`` on 127.0.0.1 port 9 (discard): the tool specs and
        the graph's nodes are the same as with the real services.
    """
    from effectgate.demo import ServiceEndpoints

    return ServiceEndpoints(
        ticket_url=_NOWHERE, smtp_host="127.0.0.1", smtp_port=9, mail_url=_NOWHERE
    )


def thread_record(sd: StateDir, thread_id: str) -> Mapping[str, Any]:
    """Return a thread's metadata, reading the ledger without creating it.

    Raises:
        ConfigError: the state directory has no ledger, or no such thread.
    """
    if not sd.has_ledger():
        raise ConfigError(f"unknown thread {thread_id!r}: {sd.root} has no ledger yet")
    ledger = sd.open_ledger()
    try:
        record = ledger.get_thread(thread_id)
    finally:
        ledger.close()
    if record is None:
        raise ConfigError(f"unknown thread {thread_id!r} in {sd.root} (see effectgate threads)")
    return dict(record.metadata)


def execute(
    sd: StateDir, flags: RunFlags, plan: Plan, source: DecisionSource, output: Output
) -> int:
    """Open the agent for ``plan``, run ``plan.begin``, drive the thread to a stop, report.

    The demo services are started when ``plan.services`` asks for them and
    none already run for the state directory (or always, with
    ``plan.prepare``). The ``--crash-at`` failpoint is armed only once the
    agent is open. After the run, a resume's decisions file that answered no
    review is refused (``refuse_unused_reviews``) and unused verdicts are noted.

    Args:
        sd: the opened state directory.
        flags: the command's flags (failpoint, state directory as given).
        plan: what the command runs.
        source: where answers come from (``decision_source``).
        output: where progress, notes and the result go.

    Returns:
        The exit code (``report``).

    Raises:
        DecisionError: an answer does not fit, or a resume's decisions file
            answered none of the reviews.
        ThreadBusyError: another live process holds the thread (after
            ``LEASE_WAIT_S``).
        KeyboardInterrupt: a signal came before the run began.
    """
    from effectgate._app import open_agent
    from effectgate.demo import DemoServices
    from effectgate.demo.services import running_endpoints

    progress = Progress(output.progress)
    crash = check_failpoint(flags.crash_at)
    endpoints: ServiceEndpoints | None = None
    with contextlib.ExitStack() as stack:
        if plan.services:
            endpoints = None if plan.prepare is not None else running_endpoints(sd.services)
            if endpoints is None:
                services = stack.enter_context(DemoServices(sd.services))
                if plan.prepare is not None:
                    plan.prepare(services)
                endpoints = services.endpoints
        agent = stack.enter_context(
            open_agent(
                sd,
                model=plan.model,
                endpoints=endpoints,
                on_event=progress.on_event,
                on_wait=progress.on_wait,
                # ride over another command's brief hold (e.g. a concurrent
                # start that only finds the thread exists) before exiting 75
                lease_wait_s=LEASE_WAIT_S,
                **plan.agent_options,
            )
        )
        output.progress(f"thread {plan.thread_id} (state in {sd.root})")
        arm_failpoint(crash)
        if STOPPER.requested:
            # A signal came while the services or the agent were being set up:
            # start nothing; ``handled`` says whether ``resume`` continues.
            raise KeyboardInterrupt
        with STOPPER.running(agent):
            result = plan.begin(agent)
        driven = drive(agent, result, source, stopper=STOPPER, say=output.note)
        judge_unused_verdicts(agent, source, say=output.note, pending=driven.result.interrupts)
    if crash is not None:
        # Still alive: the seam was never passed (e.g. MID_SUPERSTEP needs a
        # batch of parallel calls); the run was not the crash test it was meant to be.
        output.note(f"--crash-at {crash}: that seam was never reached in this run")
    if plan.resuming:
        refuse_unused_reviews(source, plan.thread_id, driven.result.interrupts)
    if isinstance(source, FileDecisions) and source.unused_verdicts:
        unused = ", ".join(source.unused_verdicts)
        output.note(f"decisions file: verdicts not used (nothing asked for them): {unused}")
    return report(driven, sd, output, state_dir=flags.state_dir)


def refuse_unused_reviews(
    source: DecisionSource, thread_id: str, waiting: Sequence[PendingLike] = ()
) -> None:
    """A decisions file whose review answers all went unused did not do what it says.

    Typically another process answered first and the thread had no review left
    (or was done) when this one looked: exiting 0 would tell a script its
    answer (say, a reject) was applied. With reviews still ``waiting``, the
    file answers none of them, and the error names them.

    Args:
        source: the command's answers; only a ``FileDecisions`` can be refused.
        thread_id: the thread, named in the error.
        waiting: the interrupts the thread still waits on after the run.

    Raises:
        DecisionError: the file gave review answers and none was used.
    """
    if not (isinstance(source, FileDecisions) and source.reviews_given and not source.reviews_used):
        return
    reviews = [item for item in waiting if item.kind == "review"]
    if reviews:
        from effectgate.answers import pending_line

        raise DecisionError(
            f"the decisions file answers none of the reviews pending on thread {thread_id!r} "
            f"({'; '.join(map(pending_line, reviews))}): its answers were not applied"
        )
    raise DecisionError(
        f"no review was pending on thread {thread_id!r}: the decisions file's answers "
        "were not applied (was it answered elsewhere?)"
    )


def _exit_code(driven: Driven) -> ExitCode:
    if driven.refused:
        return ExitCode.BAD_INPUT
    if STOPPER.requested:
        # Documented: once SIGINT / SIGTERM arrived the command ends with 5,
        # whatever the thread's state; ``status`` says where it stands.
        return ExitCode.INCOMPLETE
    return code_for_status(driven.result.status)


def report(
    driven: Driven | RunResult, sd: StateDir, output: Output, *, state_dir: Path | None = None
) -> int:
    """Print the summary (or the JSON object) and return the exit code.

    Args:
        driven: where the thread stands (and any refused answer).
        sd: the opened state directory (external counts are read from it).
        output: where to print.
        state_dir: ``--state-dir`` as given, for the printed next steps.

    Returns:
        2 if the graph refused an answer, 5 after a signal, else the status's code.

    Raises:
        LedgerBusyError: the run stopped because a node met a ledger lock that
            stayed taken or a database that stayed unavailable past its
            retries (``RunResult.cause``): the command's one-line "busy, try
            again" (exit 75), as when the store is unreachable after the run
            too. The thread stays resumable; nothing was repeated.
    """
    if not isinstance(driven, Driven):
        driven = Driven(driven)
    result = driven.result
    if isinstance(result.cause, LedgerBusyError) and not STOPPER.requested:
        raise result.cause
    code = _exit_code(driven)
    external = external_counts(sd.services, sd.workspace)
    for note in result.notes:  # e.g. a lease release that failed
        output.note(note)
    if STOPPER.requested:
        output.note(f"{STOPPER.reason}: the command ends with exit 5")
    if output.json_mode:
        output.emit_json(
            result_json(
                result,
                exit_code=int(code),
                external=external,
                notes=output.notes,
                refused=driven.refused,
                stopped_by=STOPPER.signal_name,
            )
        )
    else:
        print_summary(output.out, result, external=external, exit_code=int(code))
    for line in driven.refused:
        output.err.print(f"[bold red]error[/] (bad_input, exit 2): {escape(line)}")
    if not output.json_mode:
        # Printed at the very end of the command, after what it recovered (_recovery).
        for line in _next_steps(result, code, state_dir):
            output.last(escape(line))
        output.last(status_line(result, int(code)))
    return int(code)


def _next_steps(result: RunResult, code: ExitCode, state_dir: Path | None) -> Sequence[str]:
    if code == ExitCode.DONE:
        return []
    lines = []
    for item in result.interrupts:
        if item.kind == "reconciliation":
            op_id = str(item.value.get("operation_id"))
            settle = command_hint(state_dir, "reconcile", op_id, "--succeeded", "REF")
            lines.append(f"settle it with: {settle}  (or --failed)")
        elif item.kind == "question":
            lines.append(
                f'answer the question with a decisions file {{"answers": {{"{item.id}": ...}}}} '
                "and resume --decisions FILE"
            )
    resume = command_hint(state_dir, "resume", "--thread", result.thread_id)
    lines.append(f"continue with: {resume}")
    return lines
