"""The ``effectgate`` command line (typer): every command and its help text.

The options several commands share are declared once in ``cli/_options.py``.
Command bodies are thin: they build an ``Output``, call the implementation in
``_runs`` / ``_resume`` / ``_inspect`` inside ``handled`` (which maps errors to exit codes
through the one table in ``_exit``), and exit with the code it returns.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
import typer.core

from effectgate.cli import _inspect, _lease, _loader, _recovery
from effectgate.cli._exit import EXIT_CODE_HELP
from effectgate.cli._options import (
    DEFAULT_STATE,
    FLAG,
    AgentOpt,
    ApiKeyOpt,
    ApproveOpt,
    BaseUrlOpt,
    CrashOpt,
    DecisionsOpt,
    JsonOpt,
    OnlyThreadOpt,
    ReviewerOpt,
    StateDirOpt,
    StoreOpt,
    ThreadOpt,
    failpoint_hint,
    id_flag,
    id_flags,
    reviewer_name,
    run_flags,
)
from effectgate.cli._output import (
    CLICK_ERRORS,
    Output,
    handled,
)
from effectgate.cli._resume import run_resume
from effectgate.cli._runs import new_thread_id, run_demo, run_task
from effectgate.cli._signals import Mode
from effectgate.errors import ConfigError

__all__ = ["app"]


_HELP = (
    "effectgate: a LangGraph agent whose side effects are safe to replay.\n\n"
    "Every side-effecting tool call stops for review and goes through a durable "
    "operation ledger, so a crash, a resume or a replay never repeats a write."
)


def _flag_type(self: typer.core.TyperOption, ctx: typer.Context) -> str | None:
    """Help's type column for an option: nothing for an on/off flag.

    typer 0.29 prints ``<bool>`` beside every flag, its own ``--help``
    included, which reads as if the flag took a value; a flag's own
    ``metavar`` (``FLAG``) cannot reach the help option typer adds itself.
    """
    if self.is_flag and not self.count:
        return None
    shown: str | None = _typer_option_type(self, ctx)
    return shown


# Older typer (the lowest supported, 0.15) has no such hook and prints no
# ``<bool>`` either, so there is nothing to patch there.
_typer_option_type: Any = getattr(typer.core.TyperOption, "display_type_rich", None)
if _typer_option_type is not None:
    typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign,assignment]


class _Utf8Group(typer.core.TyperGroup):
    """The command group: refuses any command-line word (or variable it reads) that is not UTF-8.

    The shell may pass bytes that decode to no characters; Python keeps them
    as lone surrogates (``surrogateescape``), which cannot be stored in the
    ledger, compared as a name, or printed. Checked here, once for every
    option and argument of every command, before any of them is used: a
    usage error (exit 2) naming the word, instead of a ``UnicodeEncodeError``
    traceback from wherever it first met an encoder.
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """Refuse a non-UTF-8 word in ``args``, then parse as usual.

        Raises:
            click.UsageError: a word, or an ``EFFECTGATE_*`` / ``OPENAI_*``
                environment variable, holds lone surrogates (typer's own click).
        """
        for word in args:
            try:
                word.encode("utf-8")
            except UnicodeEncodeError:
                raise CLICK_ERRORS.UsageError(
                    f"{word!a}: not valid UTF-8 text (the bytes shown as \\udcXX); "
                    "effectgate takes only UTF-8 on its command line",
                    ctx,
                ) from None
        for name, value in os.environ.items():
            if not name.startswith(_READ_VARIABLES):
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise CLICK_ERRORS.UsageError(
                    # the value is not shown: it may be a secret (OPENAI_API_KEY)
                    f"environment variable {name}: not valid UTF-8 text; "
                    "set it to UTF-8 or unset it",
                    ctx,
                ) from None
        return list(super().parse_args(ctx, args))


_READ_VARIABLES = ("EFFECTGATE_", "OPENAI_")
"""Prefixes of the environment variables effectgate reads (options, the model's endpoint)."""


app = typer.Typer(
    cls=_Utf8Group,
    name="effectgate",
    help=_HELP,
    epilog=EXIT_CODE_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


def _print_version(value: bool) -> None:
    """``--version``: print ``effectgate X.Y.Z`` (the installed distribution's) and exit 0."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("effectgate")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "unknown (not installed)"
        typer.echo(f"effectgate {found}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            metavar="",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """The options every command shares come after the command's name."""


ledger_app = typer.Typer(help="Inspect the operation ledger.", no_args_is_help=True)
app.add_typer(ledger_app, name="ledger")
lease_app = typer.Typer(help="Thread leases (one live runner per thread).", no_args_is_help=True)
app.add_typer(lease_app, name="lease")


@app.command(epilog=EXIT_CODE_HELP)
def demo(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    store: StoreOpt = None,
    approve: ApproveOpt = None,
    decisions: DecisionsOpt = None,
    thread: ThreadOpt = None,
    json_out: JsonOpt = False,
    crash_at: CrashOpt = None,
    error_rate: Annotated[
        float | None,
        typer.Option(
            "--error-rate",
            help="Orders error rate the ticket service reports (default 0.12 on the first run; "
            "later runs keep the services' stored value).",
        ),
    ] = None,
    reviewer: ReviewerOpt = None,
) -> None:
    """Run the incident demo against a local ticket service and mail sink.

    The scripted model reads the order service's error rate; above 5% it opens a
    ticket, mails the on-call engineer with the ticket number and writes an incident
    note. Each write stops for review, runs once, and is summarised with receipts,
    the ledger and the external systems' own counts.
    """
    output = Output(json_mode=json_out)
    thread = thread or new_thread_id("demo")
    failpoint_hint(state_dir, thread)
    with (
        handled(output, thread_id=thread, state_dir=state_dir, mode=Mode.GRACEFUL),
        _recovery.explained(output, state_dir),
    ):
        code = run_demo(
            run_flags(state_dir, approve, decisions, reviewer, crash_at, store=store),
            output,
            thread_id=thread,
            error_rate=error_rate,
        )
    raise typer.Exit(code)


@app.command(epilog=EXIT_CODE_HELP)
def run(
    *,
    task: Annotated[
        str,
        typer.Argument(
            help="The request for the agent; on an existing --thread, a follow-up.",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="'scripted:<name or path.yaml|json>' or 'openai:<model>' (a new thread needs "
            "it unless --agent gives one; a follow-up uses the thread's).",
        ),
    ] = None,
    agent: AgentOpt = None,
    supersede: Annotated[
        bool,
        typer.Option(
            "--supersede",
            help="A follow-up while a review waits: answer its calls that never started as "
            "superseded (never one that may have started) instead of refusing.",
        ),
    ] = False,
    request_id: Annotated[
        str | None,
        typer.Option(
            "--request-id",
            help="Your id for this follow-up: repeating the command with it continues the "
            "turn it recorded instead of adding the message again.",
        ),
    ] = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    store: StoreOpt = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    max_retries: Annotated[
        int | None,
        typer.Option(
            "--max-retries",
            min=0,
            help="Retries of one failed model request (default 2); never a tool retry.",
        ),
    ] = None,
    with_services: Annotated[
        bool,
        typer.Option(
            "--with-services",
            metavar=FLAG,
            help="Start the demo ticket service and mail sink for the tools.",
        ),
    ] = False,
    thread: ThreadOpt = None,
    approve: ApproveOpt = None,
    decisions: DecisionsOpt = None,
    json_out: JsonOpt = False,
    crash_at: CrashOpt = None,
    reviewer: ReviewerOpt = None,
) -> None:
    """Start a thread on TASK (any model; built-in tools, or yours with --agent).

    With --thread naming an existing thread, TASK is a follow-up message on it
    (the same text as the thread's task resumes it instead).
    """
    output = Output(json_mode=json_out)
    options = {"base_url": base_url, "api_key": api_key, "max_retries": max_retries}
    flags = run_flags(state_dir, approve, decisions, reviewer, crash_at, store=store)
    given = thread
    thread = thread or new_thread_id("run")
    failpoint_hint(state_dir, thread)
    with (
        handled(output, thread_id=thread, state_dir=state_dir, mode=Mode.GRACEFUL),
        _recovery.explained(output, state_dir),
    ):
        if given is not None and _loader.recorded_task(state_dir, given) is not None:
            code = _loader.run_followup(
                flags,
                output,
                thread_id=thread,
                message=task,
                supersede=supersede,
                request_id=request_id,
                agent_spec=agent,
                model_spec=model,
                model_options=options,
                with_services=with_services,
            )
        elif agent is not None:
            code = _loader.run_start_with_agent(
                flags,
                output,
                task=task,
                agent_spec=agent,
                model_spec=model,
                model_options=options,
                thread_id=thread,
            )
        elif model is None:
            raise ConfigError("a new thread needs --model SPEC (or --agent MODULE:FACTORY)")
        else:
            code = run_task(
                flags,
                output,
                task=task,
                model_spec=model,
                model_options=options,
                with_services=with_services,
                thread_id=thread,
            )
    raise typer.Exit(code)


@app.command(epilog=EXIT_CODE_HELP)
def resume(
    *,
    thread: Annotated[
        str, typer.Option("--thread", callback=id_flag, help="The thread to continue.")
    ],
    state_dir: StateDirOpt = DEFAULT_STATE,
    store: StoreOpt = None,
    approve: ApproveOpt = None,
    decisions: DecisionsOpt = None,
    json_out: JsonOpt = False,
    crash_at: CrashOpt = None,
    reviewer: ReviewerOpt = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Use this model spec instead of the one the thread was started with "
            "(this resume only; it is not stored).",
        ),
    ] = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    with_services: Annotated[
        bool,
        typer.Option(
            "--with-services",
            metavar=FLAG,
            help="Start the demo ticket service and mail sink even if the thread's record "
            "does not say so (a thread started through the library).",
        ),
    ] = False,
    agent: AgentOpt = None,
) -> None:
    """Continue a thread where it stopped (after review, a crash, Ctrl-C), repeating nothing.

    The agent is rebuilt from the thread's metadata (model spec, demo services).
    A finished thread is only reported.
    """
    output = Output(json_mode=json_out)
    failpoint_hint(state_dir, thread)
    with (
        handled(output, thread_id=thread, state_dir=state_dir, mode=Mode.GRACEFUL),
        _recovery.explained(output, state_dir),
    ):
        if store is not None:
            _loader.join_store(state_dir, store)
        _loader.check_recorded(state_dir, thread)
        code = run_resume(
            run_flags(state_dir, approve, decisions, reviewer, crash_at, store=store),
            output,
            thread_id=thread,
            agent_spec=agent,
            model_spec=model,
            model_options={"base_url": base_url, "api_key": api_key},
            with_services=with_services,
        )
    raise typer.Exit(code)


@app.command()
def pending(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    thread: OnlyThreadOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show everything awaiting review or reconciliation (and answers the graph refused)."""
    output = Output(json_mode=json_out)
    with handled(output, thread_id=thread):
        code = _inspect.pending(state_dir, output, thread_id=thread)
    raise typer.Exit(code)


@app.command()
def threads(state_dir: StateDirOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """List threads with their status."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.threads(state_dir, output)
    raise typer.Exit(code)


@app.command(epilog=EXIT_CODE_HELP)
def prune(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    keep_last: Annotated[
        int | None,
        typer.Option(help="Keep this many latest checkpoints per thread (and what they need)."),
    ] = None,
    finished_older_than: Annotated[
        str | None,
        typer.Option(help="Delete finished threads idle longer than this (30d, 12h, ...)."),
    ] = None,
    thread: Annotated[
        list[str] | None,
        typer.Option(
            "--thread",
            callback=id_flags,
            help="Delete this thread (repeatable; added to the other selectors, a union).",
        ),
    ] = None,
    operations_after: Annotated[
        str, typer.Option(help="Compact terminal operations older than this ('none': never).")
    ] = "30d",
    tombstones_after: Annotated[
        str, typer.Option(help="Remove operation tombstones older than this ('none': never).")
    ] = "90d",
    vacuum: Annotated[str, typer.Option(help="full, incremental or none.")] = "full",
    vacuum_wait: Annotated[
        str,
        typer.Option(help="How long the VACUUM waits for a lock; past it, skipped (exit 75)."),
    ] = "30s",
    reason: Annotated[str | None, typer.Option(help="Why (kept on each thread tombstone).")] = None,
    reviewer: ReviewerOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would go.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Remove old checkpoints, finished threads and old ledger rows, then VACUUM."""
    from effectgate.cli._prune import run_prune

    output = Output(json_mode=json_out)
    with handled(output):
        code = run_prune(
            state_dir,
            output,
            keep_last=keep_last,
            finished_older_than=finished_older_than,
            threads=list(thread or []),
            operations_after=operations_after,
            tombstones_after=tombstones_after,
            vacuum=vacuum,  # type: ignore[arg-type]  # checked by PrunePolicy.check
            vacuum_wait=vacuum_wait,
            deleted_by=reviewer_name(reviewer),
            reason=reason,
            dry_run=dry_run,
        )
    raise typer.Exit(code)


@app.command()
def reconcile(
    *,
    operation: Annotated[str, typer.Argument(help="The operation id.")],
    succeeded: Annotated[
        str | None,
        typer.Option(
            "--succeeded",
            metavar="REF",
            help="It happened: the reference you checked (ticket id, Message-ID...).",
        ),
    ] = None,
    failed: Annotated[
        bool, typer.Option("--failed", metavar=FLAG, help="It did not take effect.")
    ] = False,
    unchecked: Annotated[
        bool,
        typer.Option(
            "--unchecked",
            metavar=FLAG,
            help="With --failed: record it although the tool's lookup cannot confirm it "
            "(the model may then do it again, and its next proposal carries no duplicate "
            "warning).",
        ),
    ] = False,
    evidence: Annotated[str, typer.Option("--evidence", help="What you checked.")] = "",
    reviewer: ReviewerOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Settle an operation in NEEDS_RECONCILIATION with a human verdict.

    A later 'effectgate resume --thread ID' lets the thread continue.
    """
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.reconcile(
            state_dir,
            output,
            operation_id=operation,
            succeeded=succeeded,
            failed=failed,
            unchecked=unchecked,
            evidence=evidence,
            reviewer=reviewer_name(reviewer),
        )
    raise typer.Exit(code)


@app.command()
def services(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    error_rate: Annotated[
        float | None,
        typer.Option("--error-rate", help="Set the orders error rate the ticket service reports."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the demo ticket service and mail sink in the foreground until Ctrl-C."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.serve_services(state_dir, output, error_rate=error_rate)
    raise typer.Exit(code)


@app.command()
def failpoints(state_dir: StateDirOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """List every failpoint seam name, one per line (for --crash-at); reads no state."""
    del state_dir  # accepted like every command's, so scripts can pass it everywhere
    output = Output(json_mode=json_out)
    if json_out:
        output.emit_json({"failpoints": _inspect.failpoint_names()})
        return
    for name in _inspect.failpoint_names():
        typer.echo(name)


@ledger_app.command("list")
def ledger_list(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    thread: OnlyThreadOpt = None,
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Only this tool.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """List operations: id, tool, state, attempt, reference."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.ledger_list(state_dir, output, thread_id=thread, state=state, tool=tool)
    raise typer.Exit(code)


@ledger_app.command("show")
def ledger_show(
    *,
    operation: Annotated[str, typer.Argument(help="The operation id.")],
    state_dir: StateDirOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Show one operation with its receipt, approvals and events."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.ledger_show(state_dir, output, operation_id=operation)
    raise typer.Exit(code)


@ledger_app.command("stats")
def ledger_stats(state_dir: StateDirOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """Show health figures: states, first-attempt success, reuse, open unknowns."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.ledger_stats(state_dir, output)
    raise typer.Exit(code)


@ledger_app.command("events")
def ledger_events(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    thread: OnlyThreadOpt = None,
    operation: Annotated[
        str | None, typer.Option("--op", callback=id_flag, help="Only this operation.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show the audit trail of state transitions, in order."""
    output = Output(json_mode=json_out)
    with handled(output):
        code = _inspect.ledger_events(state_dir, output, thread_id=thread, operation_id=operation)
    raise typer.Exit(code)


@app.command(epilog=EXIT_CODE_HELP)
def worker(
    *,
    state_dir: StateDirOpt = DEFAULT_STATE,
    store: StoreOpt = None,
    processes: Annotated[
        int, typer.Option("--processes", help="Worker processes to run here (1 to 64).")
    ] = 1,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="The model spec of the threads this worker runs: a thread started with "
            "'run --model X' is left for a worker with --model X; a thread started through "
            "the library runs with this one.",
        ),
    ] = "scripted:incident",
    approve: ApproveOpt = None,
    until_idle: Annotated[
        bool,
        typer.Option(
            "--until-idle",
            help="Exit once every thread is done or waits for a person (default: keep polling).",
        ),
    ] = False,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            min=0.5,
            max=86400.0,
            help="Seconds a dead worker's threads stay held (renewed live).",
        ),
    ] = 30.0,
    agent: AgentOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Take threads that are ready to run (new, unfinished; reviews with --approve), leased.

    Run it on one or many machines against the same --store: each thread runs
    in one worker at a time; a dead worker's threads are taken over after its
    lease expires (at once on the same host), repeating no effect. One line
    per run on stdout (a JSON object with --json). With --agent, only the
    threads started with that recipe; without it, only the built-in tools'.
    """
    from effectgate.cli._workers import worker_main

    output = Output(json_mode=json_out)
    # A stop at any moment of start-up ends the worker with its summary and
    # exit 5, as a stop between runs does; a second signal aborts at once.
    with handled(output, state_dir=state_dir, mode=Mode.GRACEFUL, reads_stop=True):
        code = worker_main(
            state_dir,
            store=store,
            processes=processes,
            model=model,
            approve=approve.value if approve else None,
            until_idle=until_idle,
            lease_ttl_s=lease_ttl,
            json_out=json_out,
            agent_spec=agent,
        )
    raise typer.Exit(code)


@lease_app.command("break", epilog=EXIT_CODE_HELP)
def lease_break(
    *,
    thread: Annotated[str, typer.Option("--thread", callback=id_flag, help="The thread.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (required; kept in the ledger's audit trail).")
    ],
    by: Annotated[
        str | None, typer.Option("--by", help="Who breaks it (default: your user name).")
    ] = None,
    state_dir: StateDirOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Break a thread's lease that its holder will not give up; audited.

    For a holder on another host or in another container, or a damaged
    expiry (year 9999). Who, when and why are kept in the ledger.
    """
    output = Output(json_mode=json_out)
    with handled(output, thread_id=thread):
        code = _lease.lease_break(
            state_dir, output, thread_id=thread, reason=reason, by=reviewer_name(by)
        )
    raise typer.Exit(code)
