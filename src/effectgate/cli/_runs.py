"""``effectgate demo``, ``run`` and ``resume``: build the agent, run, review, report.

Bad input is refused before anything is written: the decisions file and the
failpoint name are checked first, then the model spec, then the state
directory (``StateDir.open`` refuses a directory that is not ours). Each run
records its model spec and whether it used the demo services in the thread's
metadata, so ``resume`` in a new process rebuilds the same agent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from effectgate.errors import ConfigError, DecisionError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from effectgate._app import StateDir
    from effectgate.answers import PendingLike
    from effectgate.demo import DemoServices, ServiceEndpoints
    from effectgate.graph import Agent, RunResult

__all__ = [
    "DEMO_MODEL",
    "DEMO_TASK",
    "RunFlags",
    "inspection_agent",
    "new_thread_id",
    "report",
    "run_demo",
    "run_task",
    "services_skip",
    "stored_model_spec",
    "thread_record",
    "uses_services",
]

DEMO_MODEL = "scripted:incident"
DEMO_TASK = (
    "An alert says the order service may be failing. Check its error rate over the last "
    "5 minutes; if it is above 5%, open a ticket, mail the on-call engineer with the ticket "
    "number, and write an incident note into the workspace."
)

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
class _Plan:
    """What differs between the three commands."""

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


def new_thread_id(kind: str) -> str:
    """Return a fresh thread id: ``demo-<8 hex>`` for the demo, 32 hex otherwise."""
    return f"demo-{uuid.uuid4().hex[:8]}" if kind == "demo" else uuid.uuid4().hex


def uses_services(metadata: Mapping[str, Any]) -> bool:
    """Whether a thread runs with the demo ticket and mail tools, from its record's metadata.

    ``effectgate demo`` and ``effectgate run --with-services`` record it
    (``"services": true``); an older demo thread says only ``"kind": "demo"``.
    ``resume`` and ``run --thread`` start the demo services for such a thread.
    """
    return bool(metadata.get("services", metadata.get("kind") == "demo"))


def services_skip(state_dir: Path | None, thread_id: str, why: str, worker: str) -> str:
    """The one line a worker says of a demo-services thread it leaves: why, and who takes it.

    ``effectgate resume`` takes such a thread to its end (it starts the demo
    services itself, with the thread's recorded model and tools); so does
    ``worker`` (e.g. "a worker without --agent") while ``effectgate
    services`` runs for the state directory (``services/endpoints.json``).

    Args:
        state_dir: the worker's ``--state-dir`` as given (spelled in the commands).
        thread_id: the thread left.
        why: what this worker lacks, e.g. "it runs with the demo ticket and mail services".
        worker: the worker that takes it while the services run.
    """
    resume = command_hint(state_dir, "resume", "--thread", thread_id)
    services = command_hint(state_dir, "services")
    return f"{why}: {resume} takes it (it starts them), or {worker} while {services} runs"


def stored_model_spec(spec: str) -> str:
    """Return the spec to store for ``resume``: a scripted model's file path made absolute.

    ``resume`` may run from another directory, where a relative path names
    nothing (or another file). Packaged names and ``openai:`` specs are kept.
    """
    provider, sep, rest = spec.partition(":")
    text = rest.strip()
    if provider != "scripted" or not sep:
        return spec
    if os.sep in text or "/" in text or text.endswith((".yaml", ".yml", ".json")):
        return f"scripted:{os.path.abspath(Path(text).expanduser())}"
    return spec


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


def _source(flags: RunFlags, output: Output) -> DecisionSource:
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


def _model(spec: str, options: Mapping[str, Any]) -> BaseChatModel:
    from effectgate.models import make_model

    return make_model(spec, **{k: v for k, v in options.items() if v is not None})


def _check_crash_tools(spec: str | None, state_dir: Path, *, services: bool) -> None:
    """Refuse ``--crash-at NAME@tool`` for a tool the command's agent will not have.

    Runs before the state directory or the services exist: building the
    tool specs touches nothing.
    """
    if spec is None or "@" not in spec:
        return
    from effectgate._app import default_tools

    tools = default_tools(state_dir / "workspace", _nowhere() if services else None)
    _failpoints.check([t.name for t in tools if not t.is_read], spec)


def _script_tool_names(script: Mapping[str, Any]) -> list[str]:
    """Every tool name a validated script's turns (and follow-ups' turns) call, in order."""
    names: list[str] = []
    for part in [script, *script.get("followups", [])]:
        for turn in part.get("turns", []):
            for call in turn.get("tool_calls", []):
                if call["name"] not in names:
                    names.append(call["name"])
    return names


def _check_script_tools(model: BaseChatModel, state_dir: Path, *, services: bool) -> None:
    """Refuse a scripted model that calls demo service tools when the run has none.

    Without the check, ``run --model scripted:incident`` (no ``--with-services``)
    ends ``done`` after its first call failed as an unknown tool. A tool that
    the services would not bring either is left to the run (a script may test
    exactly that).

    Raises:
        ConfigError: the script names a tool only ``--with-services`` brings.
    """
    from effectgate._app import default_tools
    from effectgate.models import ScriptedChatModel

    if services or not isinstance(model, ScriptedChatModel):
        return
    workspace = state_dir / "workspace"
    plain = {t.name for t in default_tools(workspace, None)}
    served = {t.name for t in default_tools(workspace, _nowhere())}
    needed = [n for n in _script_tool_names(model.script) if n not in plain and n in served]
    if needed:
        name = model.script.get("name", "scripted")
        raise ConfigError(
            f"the scripted model {name!r} calls {', '.join(needed)}, which come with the "
            "demo services: add --with-services (or run effectgate demo)"
        )


def _nowhere() -> ServiceEndpoints:
    """Demo service addresses nobody listens on: tools built for reading, never called."""
    from effectgate.demo import ServiceEndpoints

    return ServiceEndpoints(
        ticket_url=_NOWHERE, smtp_host="127.0.0.1", smtp_port=9, mail_url=_NOWHERE
    )


@contextlib.contextmanager
def inspection_agent(sd: StateDir) -> Iterator[Agent]:
    """Open an agent that can read any thread's state and never calls anything.

    It carries every built-in tool (against an address nobody listens on) so
    the graph has the same nodes as the agent that wrote the checkpoints.
    """
    from effectgate._app import default_tools, open_agent

    tools = default_tools(sd.workspace, _nowhere())
    with open_agent(sd, model=DEMO_MODEL, tools=tools) as agent:
        yield agent


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


def _execute(
    sd: StateDir, flags: RunFlags, plan: _Plan, source: DecisionSource, output: Output
) -> int:
    from effectgate._app import open_agent
    from effectgate.demo import DemoServices

    progress = Progress(output.progress)
    crash = check_failpoint(flags.crash_at)
    endpoints: ServiceEndpoints | None = None
    with contextlib.ExitStack() as stack:
        if plan.services:
            endpoints = None if plan.prepare is not None else _running_services(sd)
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
        _refuse_unused_reviews(source, plan.thread_id, driven.result.interrupts)
    if isinstance(source, FileDecisions) and source.unused_verdicts:
        unused = ", ".join(source.unused_verdicts)
        output.note(f"decisions file: verdicts not used (nothing asked for them): {unused}")
    return report(driven, sd, output, state_dir=flags.state_dir)


def _refuse_unused_reviews(
    source: DecisionSource, thread_id: str, waiting: Sequence[PendingLike] = ()
) -> None:
    """A decisions file whose review answers all went unused did not do what it says.

    Typically another process answered first and the thread had no review left
    (or was done) when this one looked: exiting 0 would tell a script its
    answer (say, a reject) was applied. With reviews still ``waiting``, the
    file answers none of them, and the error names them.
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
    """
    if not isinstance(driven, Driven):
        driven = Driven(driven)
    result = driven.result
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


def _running_services(sd: StateDir) -> ServiceEndpoints | None:
    """The demo services already running for ``sd`` (its ``endpoints.json``), if they answer.

    As ``effectgate worker`` does: one world, one set of servers, so a fault
    or a metric set on ``effectgate services`` is what the command's calls
    meet. A damaged or stale file is no error here: the command starts its
    own servers, which write the file again.
    """
    from effectgate.demo.services import published_endpoints, serving

    try:
        found = published_endpoints(sd.services)
    except ConfigError:
        return None
    return found if found is not None and serving(sd.services, found) else None


def _prepare_demo(error_rate: float | None, output: Output) -> Callable[[DemoServices], None]:
    def prepare(services: DemoServices) -> None:
        from effectgate.demo.services import read_error_rate

        # "Fresh" means no rate was ever stored, not "no service files yet": a
        # first demo killed between starting the services and storing the
        # rate, or an earlier `effectgate services`, must still get 0.12.
        if error_rate is not None or read_error_rate(services.data_dir, "orders") is None:
            from effectgate.demo.services import DEMO_ERROR_RATE

            rate = DEMO_ERROR_RATE if error_rate is None else error_rate
            services.set_error_rate("orders", rate)
            output.progress(f"ticket service: orders error rate set to {rate}")

    return prepare


def run_demo(
    flags: RunFlags, output: Output, *, thread_id: str | None, error_rate: float | None
) -> int:
    """Run the incident demo on the local ticket service and mail sink.

    Returns:
        The exit code.

    Raises:
        ConfigError, DecisionError: bad flags or decisions; nothing written.
        ThreadBusyError: another process runs the thread.
    """
    from effectgate._app import StateDir

    source = _source(flags, output)
    _check_crash_tools(check_failpoint(flags.crash_at), flags.state_dir, services=True)
    model = _model(DEMO_MODEL, {})
    if error_rate is not None and not 0.0 <= error_rate <= 1.0:
        raise ConfigError(f"--error-rate must be a fraction in [0, 1], got {error_rate}")
    sd = StateDir.open(flags.state_dir, store=flags.store)
    thread = thread_id or new_thread_id("demo")
    metadata = {"kind": "demo", "model": DEMO_MODEL, "services": True}
    plan = _Plan(
        thread_id=thread,
        model=model,
        services=True,
        begin=lambda agent: agent.start(DEMO_TASK, thread_id=thread, metadata=metadata),
        prepare=_prepare_demo(error_rate, output),
    )
    return _execute(sd, flags, plan, source, output)


def run_task(
    flags: RunFlags,
    output: Output,
    *,
    task: str,
    model_spec: str,
    model_options: Mapping[str, Any],
    with_services: bool,
    thread_id: str | None,
) -> int:
    """Start a new thread on ``task`` with any model.

    ``model_options`` (``base_url``, ``api_key``, ``max_retries``) build the
    model; all but ``api_key`` are stored in the thread's metadata.

    Returns:
        The exit code.
    """
    from effectgate._app import StateDir

    source = _source(flags, output)
    crash = check_failpoint(flags.crash_at)
    _check_crash_tools(crash, flags.state_dir, services=with_services)
    model = _model(model_spec, model_options)
    _check_script_tools(model, flags.state_dir, services=with_services)
    sd = StateDir.open(flags.state_dir, store=flags.store)
    thread = thread_id or new_thread_id("run")
    stored = {k: v for k, v in model_options.items() if k != "api_key" and v is not None}
    metadata = {
        "kind": "run",
        "model": stored_model_spec(model_spec),
        "services": with_services,
        **stored,
    }
    plan = _Plan(
        thread_id=thread,
        model=model,
        services=with_services,
        begin=lambda agent: agent.start(task, thread_id=thread, metadata=metadata),
    )
    return _execute(sd, flags, plan, source, output)
