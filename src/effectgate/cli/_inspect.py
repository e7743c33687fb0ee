"""Read-only commands, plus ``reconcile`` and ``services``.

``pending``, ``threads`` and ``ledger ...`` never create a state directory or
a ledger: on a directory without one they report nothing. ``reconcile``
writes one human verdict through ``Dispatcher.apply_verdict``; the thread
continues with a later ``effectgate resume``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from rich.markup import escape

from effectgate._failpoints import Failpoint
from effectgate.cli._exit import ExitCode
from effectgate.cli._output import Output, command_hint
from effectgate.cli._render import (
    event_json,
    events_table,
    interrupt_json,
    jsonable,
    metrics_table,
    operation_json,
    operations_table,
    print_line,
    print_listing,
    print_operation,
    print_table,
    terminal_safe,
    thread_json,
    threads_table,
)
from effectgate.cli._runs import inspection_agent
from effectgate.errors import (
    CheckpointCorruptError,
    ConfigError,
    DecisionError,
    LedgerCorruptError,
)

if TYPE_CHECKING:
    from effectgate._app import StateDir
    from effectgate.demo import ServiceEndpoints
    from effectgate.graph import RunResult
    from effectgate.ledger import DamagedOperation, DamagedThread, Ledger, Operation, ThreadRecord
    from effectgate.tools import ToolSpec

__all__ = [
    "failpoint_names",
    "ledger_events",
    "ledger_list",
    "ledger_show",
    "ledger_stats",
    "pending",
    "reconcile",
    "serve_services",
    "threads",
]

_VERDICT = "NEEDS_RECONCILIATION"
_OPEN_STATES = ("IN_FLIGHT", "UNKNOWN", _VERDICT)
"""Operation states ``pending`` lists: under way or left by a crash, or waiting for a verdict."""


def _existing(path: Path) -> StateDir:
    from effectgate._app import StateDir

    return StateDir.open(path, create=False)


@contextlib.contextmanager
def ledger_if_any(sd: StateDir) -> Iterator[Ledger | None]:
    """The state's ledger (SQLite file or PostgreSQL store), or ``None`` if it has none yet."""
    if not sd.has_ledger():
        yield None
        return
    ledger = sd.open_ledger()
    try:
        yield ledger
    finally:
        ledger.close()


def failpoint_names() -> list[str]:
    """Return every seam name, in declaration order."""
    return [point.value for point in Failpoint]


def thread_records(ledger: Ledger | None, unreadable: dict[str, str]) -> list[ThreadRecord]:
    """The ledger's threads, without the records of their follow-up turns.

    A record that fails to decode is left out and put in ``unreadable``
    (thread id -> table and what is wrong), as ``_statuses`` does.
    """
    from effectgate.graph._agent import is_turn_record, record_thread

    damaged: list[DamagedThread] = []
    records = ledger.list_threads(damaged=damaged) if ledger is not None else []
    for d in damaged:
        # a follow-up turn's record is its thread's: the thread is named
        unreadable.setdefault(record_thread(d.thread_id), f"table {d.table}: {d.reason}")
    return [r for r in records if not is_turn_record(r.thread_id)]


def _statuses(
    sd: StateDir, records: list[ThreadRecord], unreadable: dict[str, str]
) -> list[tuple[ThreadRecord, RunResult]]:
    """Each thread's status, read by an agent with that thread's tools (``--agent``) if known.

    A thread whose ledger rows fail validation is left out and put in
    ``unreadable`` (thread id -> why): one damaged row hides one thread, not
    the listing.
    """
    from effectgate.cli._loader import inspection_agent_for, thread_agent

    def status_of(agent: Any, thread_id: str) -> RunResult | None:
        try:
            return agent.status(thread_id)  # type: ignore[no-any-return]
        except (LedgerCorruptError, CheckpointCorruptError) as exc:
            unreadable[thread_id] = str(exc)
            return None

    out = []
    plain = [r for r in records if thread_agent(sd, r.thread_id, r.metadata) is None]
    if plain:
        with inspection_agent(sd) as agent:
            for r in plain:
                if (found := status_of(agent, r.thread_id)) is not None:
                    out.append((r, found))
    for record in records:
        if record in plain:
            continue
        with inspection_agent_for(sd, record.thread_id) as (agent, note):
            status = status_of(agent, record.thread_id)
        if status is None:
            continue
        if note is not None:
            status = replace(status, error=f"{note}; {status.error or ''}".rstrip("; "))
        out.append((record, status))
    order = {r.thread_id: i for i, r in enumerate(records)}
    return sorted(out, key=lambda row: order[row[0].thread_id])


_UNREADABLE_HINT = (
    "the rest is listed; the row was changed outside effectgate (or the storage is "
    "damaged): restore it from a backup, or settle the thread by hand"
)


def _said_damaged(output: Output, rows: Sequence[tuple[str, str | None, str]]) -> int:
    """Print ``(what, thread, why)`` per unreadable thread or row; the exit code (1 if any).

    Text mode only: JSON callers carry the same rows in their own key.
    """
    if not rows:
        return 0
    if not output.json_mode:
        for what, thread, why in rows:
            where = f" (thread {thread})" if thread is not None else ""
            output.out.print(
                f"[bold red]unreadable[/] {escape(terminal_safe(what + where))}: "
                f"{escape(terminal_safe(why))}"
            )
        output.out.print(escape(_UNREADABLE_HINT))
    return int(ExitCode.ERROR)


def _damaged_json(damaged: list[DamagedOperation]) -> list[dict[str, str]]:
    return [
        {"operation_id": d.operation_id, "thread_id": d.thread_id, "reason": d.reason}
        for d in damaged
    ]


def threads(state_dir: Path, output: Output) -> int:
    """List every thread with its status, and why an incomplete one is."""
    sd = _existing(state_dir)
    unreadable: dict[str, str] = {}
    with ledger_if_any(sd) as ledger:
        records = thread_records(ledger, unreadable)
        # Deferred: retention reaches the graph (LangGraph's import, about a second
        # of CPU), which the ledger commands, help and usage errors never need.
        from effectgate.retention import deleted_threads

        gone = deleted_threads(ledger) if ledger is not None else {}
    live = [r for r in records if r.thread_id not in gone]
    statuses = {r.thread_id: st for r, st in (_statuses(sd, live, unreadable) if live else [])}
    if output.json_mode:
        listed = []
        for record in records:
            if record.thread_id in gone:
                entry = thread_json(record, _deleted(gone[record.thread_id]))
            elif record.thread_id in unreadable:
                entry = thread_json(record, "unreadable")
                entry["why"] = unreadable[record.thread_id]
            else:
                status = statuses[record.thread_id]
                entry = thread_json(record, status.status.value)
                if status.status.value == "incomplete":
                    entry["why"] = status.error
            listed.append(entry)
        listed += [
            {"thread_id": t, "status": "unreadable", "why": why}
            for t, why in unreadable.items()
            if t not in {r.thread_id for r in records}
        ]
        output.emit_json({"threads": listed})
    else:
        print_listing(
            output.out,
            threads_table(
                (
                    record,
                    _deleted(gone[record.thread_id])
                    if record.thread_id in gone
                    else "unreadable (below)"
                    if record.thread_id in unreadable
                    else _status_text(
                        statuses[record.thread_id].status.value, statuses[record.thread_id].error
                    ),
                )
                for record in records
            ),
        )
    return _said_damaged(output, [(f"thread {t}", None, why) for t, why in unreadable.items()])


def _deleted(tombstone: Any) -> str:
    at = tombstone.deleted_at.strftime("%Y-%m-%d %H:%M:%S")
    return f"deleted ({at}, by {tombstone.deleted_by}: {tombstone.reason})"


def _status_text(status: str, why: str | None) -> str:
    return f"{status}: {why}" if status == "incomplete" and why else status


def pending(state_dir: Path, output: Output, *, thread_id: str | None) -> int:
    """Show everything awaiting review or reconciliation."""
    sd = _existing(state_dir)
    damaged: list[DamagedOperation] = []
    unreadable: dict[str, str] = {}
    with ledger_if_any(sd) as ledger:
        records = thread_records(ledger, unreadable)
        ops = (
            ledger.list(thread_id=thread_id, states=_states(_OPEN_STATES), damaged=damaged)
            if ledger is not None
            else []
        )
    if thread_id is not None:
        records = [r for r in records if r.thread_id == thread_id]
        unreadable = {t: why for t, why in unreadable.items() if t == thread_id}
        if not records and not unreadable and not ops:
            raise ConfigError(f"unknown thread {thread_id!r} in {sd.root}")
    waiting: list[dict[str, Any]] = []
    for record, status in _statuses(sd, records, unreadable) if records else []:
        if status.interrupts:
            waiting.append(
                {
                    "thread_id": record.thread_id,
                    "status": status.status.value,
                    "interrupts": [interrupt_json(i) for i in status.interrupts],
                }
            )
        elif status.status.value == "incomplete" and status.error and "needs" in status.error:
            # Waiting for something this CLI's tools cannot run (a custom tool):
            # say so instead of "nothing is waiting".
            waiting.append(
                {
                    "thread_id": record.thread_id,
                    "status": status.status.value,
                    "interrupts": [],
                    "unanswerable": status.error,
                }
            )
    # A damaged row may hide an open operation: such a thread is listed as
    # unreadable, with the rows that fail validation.
    shown = {d.thread_id for d in damaged}
    rows: list[tuple[str, str | None, str]] = [
        (f"operation {d.operation_id}", d.thread_id, d.reason) for d in damaged
    ]
    rows += [(f"thread {t}", None, why) for t, why in unreadable.items() if t not in shown]
    if output.json_mode:
        output.emit_json(
            {
                "threads": waiting,
                "operations": [operation_json(o) for o in ops],
                "unreadable_threads": unreadable,
                "damaged": _damaged_json(damaged),
            }
        )
        return int(ExitCode.ERROR) if rows else 0
    if waiting or ops or not rows:
        recorded = {r.thread_id for r in records} | set(unreadable)
        _print_pending(output, waiting, ops, state_dir, recorded=recorded)
    return _said_damaged(output, rows)


def _states(names: tuple[str, ...]) -> list[Any]:
    from effectgate.ledger import OpState

    return [OpState(name) for name in names]


def _print_compacted(output: Output, actions: list[dict[str, Any]]) -> None:
    """One line per call that meets a compacted operation (its own id, or a duplicate's)."""
    for action in actions:
        for key in ("compacted_operation", "possible_duplicate_compacted"):
            flag = action.get(key)
            if isinstance(flag, dict):
                print_line(output.out, f"  [bold yellow]{escape(str(flag.get('message')))}[/]")


def _print_pending(
    output: Output,
    waiting: list[dict[str, Any]],
    ops: list[Operation],
    state_dir: Path,
    *,
    recorded: set[str],
) -> None:
    if not waiting and not ops:
        print_line(output.out, "nothing is waiting for review or reconciliation")
        return
    for entry in waiting:
        if entry.get("unanswerable"):
            print_line(
                output.out,
                f"[yellow]waiting[/] thread {escape(entry['thread_id'])}: "
                f"{escape(entry['unanswerable'])}",
            )
        for item in entry["interrupts"]:
            value = item["value"]
            if item["kind"] == "review":
                calls = ", ".join(
                    f"{a['name']} ({a['operation_id']})" for a in value.get("action_requests", [])
                )
                print_line(
                    output.out,
                    f"[yellow]review[/] thread {escape(entry['thread_id'])}: {escape(calls)}",
                )
                _print_compacted(output, value.get("action_requests", []))
            elif item["kind"] == "question":
                from effectgate.answers import question_text

                asked = terminal_safe(question_text(value.get("question")))
                print_line(
                    output.out,
                    f"[yellow]question[/] thread {escape(entry['thread_id'])}: a tool asks: "
                    f"{escape(asked)} (answer: --decisions FILE with "
                    f'{{"answers": {{"{escape(item["id"])}": ...}}}})',
                )
            else:
                what = (
                    f"{value.get('tool')} ({value.get('operation_id')}), "
                    f"attempt {value.get('attempt')}"
                )
                print_line(
                    output.out,
                    f"[red]reconciliation[/] thread {escape(entry['thread_id'])}: {escape(what)}",
                )
            if item["error"]:
                print_line(
                    output.out, f"  [bold red]previous answer refused:[/] {escape(item['error'])}"
                )
    if ops:
        print_table(output.out, operations_table(ops, title="operations with an unknown outcome"))
        for thread in sorted({op.thread_id for op in ops if op.state.value != _VERDICT}):
            # IN_FLIGHT: under way in a live run, or left by one that died
            # (kill -9) after claiming it; UNKNOWN: the outcome is to be looked up.
            if thread not in recorded:
                # No thread record: a served thread (langgraph dev), which only
                # its server can run; effectgate resume does not know it.
                output.out.print(
                    escape(
                        f"thread {thread}: a call may have been under way when its run "
                        "stopped; it is not a thread effectgate runs (a served one?): run it "
                        "again with no input from the client of the server that runs it, "
                        "which settles the call by its tool's contract and runs nothing twice"
                    )
                )
                continue
            resume = command_hint(state_dir, "resume", "--thread", thread)
            output.out.print(
                escape(
                    f"thread {thread}: a call may have been under way when its run stopped; "
                    f"{resume} settles it by its tool's contract (a lookup by idempotency "
                    "key where the tool has one, a verdict otherwise) and runs nothing twice"
                )
            )
        if any(op.state.value == _VERDICT for op in ops):
            settle = command_hint(state_dir, "reconcile", "OP", "--succeeded", "REF")
            output.out.print(escape(f"settle one with: {settle}  (or --failed)"))


def _check_ids(
    ledger: Ledger | None, sd: StateDir, *, thread_id: str | None, operation_id: str | None
) -> None:
    """Refuse a ``--thread`` or ``--op`` filter naming nothing in the ledger (exit 2)."""
    if operation_id is not None and (ledger is None or ledger.get(operation_id) is None):
        raise ConfigError(f"unknown operation {operation_id!r} in {sd.root}")
    if thread_id is not None and (
        ledger is None
        or (ledger.get_thread(thread_id) is None and not ledger.list(thread_id=thread_id))
    ):
        raise ConfigError(f"unknown thread {thread_id!r} in {sd.root} (see effectgate threads)")


def ledger_list(
    state_dir: Path, output: Output, *, thread_id: str | None, state: str | None, tool: str | None
) -> int:
    """List operations, optionally filtered by thread, state and tool."""
    sd = _existing(state_dir)
    states = None
    if state is not None:
        from effectgate.ledger import OpState

        try:
            states = [OpState(state.upper())]
        except ValueError as exc:
            known = ", ".join(OpState)
            raise ConfigError(f"unknown state {state!r}; states: {known}") from exc
    with ledger_if_any(sd) as ledger:
        _check_ids(ledger, sd, thread_id=thread_id, operation_id=None)
        if tool is not None and (ledger is None or not ledger.list(tool=tool)):
            # Like an unknown --thread: a filter naming nothing is a typo, not an empty answer.
            in_ledger = sorted({op.tool for op in ledger.list()}) if ledger else []
            raise ConfigError(
                f"unknown tool {tool!r} in {sd.root}; tools in this ledger: "
                + (", ".join(in_ledger) or "none")
            )
        damaged: list[DamagedOperation] = []
        ops = (
            ledger.list(thread_id=thread_id, states=states, tool=tool, damaged=damaged)
            if ledger
            else []
        )
    rows = [(f"operation {d.operation_id}", d.thread_id, d.reason) for d in damaged]
    if output.json_mode:
        output.emit_json(
            {"operations": [operation_json(op) for op in ops], "damaged": _damaged_json(damaged)}
        )
        return int(ExitCode.ERROR) if rows else 0
    print_listing(output.out, operations_table(ops))
    return _said_damaged(output, rows)


def ledger_show(state_dir: Path, output: Output, *, operation_id: str) -> int:
    """Show one operation in full, with its approvals and events."""
    sd = _existing(state_dir)
    with ledger_if_any(sd) as ledger:
        op = ledger.get(operation_id) if ledger is not None else None
        if ledger is None or op is None:
            raise ConfigError(f"unknown operation {operation_id!r} in {sd.root}")
        events = ledger.events(operation_id=operation_id)
        approvals = ledger.approvals(operation_id)
    if output.json_mode:
        output.emit_json(
            {
                "operation": operation_json(op),
                "approvals": [jsonable(a) for a in approvals],
                "events": [event_json(e) for e in events],
            }
        )
    else:
        print_operation(output.out, op, events)
    return 0


def ledger_stats(state_dir: Path, output: Output) -> int:
    """Show health figures computed from the ledger."""
    sd = _existing(state_dir)
    with ledger_if_any(sd) as ledger:
        if ledger is None:
            raise ConfigError(f"{sd.root} has no ledger yet")
        metrics = ledger.metrics()
    if output.json_mode:
        output.emit_json({"stats": jsonable(metrics)})
    else:
        output.out.print(metrics_table(metrics))
    return 0


def ledger_events(
    state_dir: Path, output: Output, *, thread_id: str | None, operation_id: str | None
) -> int:
    """Show the audit trail in append order."""
    sd = _existing(state_dir)
    with ledger_if_any(sd) as ledger:
        _check_ids(ledger, sd, thread_id=thread_id, operation_id=operation_id)
        events = (
            ledger.events(operation_id=operation_id, thread_id=thread_id)
            if ledger is not None
            else []
        )
    if output.json_mode:
        output.emit_json({"events": [event_json(e) for e in events]})
    else:
        print_listing(output.out, events_table(events))
    return 0


def reconcile(
    state_dir: Path,
    output: Output,
    *,
    operation_id: str,
    succeeded: str | None,
    failed: bool,
    evidence: str,
    reviewer: str,
    unchecked: bool = False,
) -> int:
    """Apply a human verdict to an operation parked in NEEDS_RECONCILIATION.

    Idempotent: the same verdict again reports the settled state and exits 0.

    Raises:
        ConfigError: not exactly one of ``--succeeded`` / ``--failed``, or
            ``--unchecked`` without ``--failed``.
        DecisionError: unknown operation, or one in another state than the
            verdict asks for, or ``--failed`` refused by the tool's lookup
            (it finds the effect, or cannot answer and ``--unchecked`` was
            not given); nothing is changed.
    """
    from effectgate.dispatch import Dispatcher, validate_verdict

    if (succeeded is None) == (not failed):
        raise ConfigError("give exactly one of --succeeded REF or --failed")
    if unchecked and not failed:
        raise ConfigError("--unchecked goes with --failed only")
    sd = _existing(state_dir)
    with ledger_if_any(sd) as ledger:
        op = ledger.get(operation_id) if ledger is not None else None
        if ledger is None or op is None:
            raise DecisionError(f"unknown operation {operation_id!r} in {sd.root}")
        wanted = "SUCCEEDED" if succeeded is not None else "FAILED"
        if op.state.value != "NEEDS_RECONCILIATION":
            if op.state.value != wanted:
                raise DecisionError(
                    f"operation {operation_id!r} is {op.state.value}, not "
                    "NEEDS_RECONCILIATION; nothing changed"
                )
            stored = op.receipt.reference if op.receipt is not None else None
            if succeeded is not None and stored != succeeded:
                raise DecisionError(
                    f"operation {operation_id!r} is already SUCCEEDED with reference "
                    f"{stored!r}, not {succeeded!r}; nothing changed"
                )
            output.progress(f"operation {operation_id} is already {wanted}")
        else:
            verdict = validate_verdict(
                {
                    "verdict": "succeeded" if succeeded is not None else "failed",
                    "attempt": op.attempt,
                    "evidence": evidence,
                    "reviewer": reviewer,
                    **({"reference": succeeded} if succeeded is not None else {}),
                    **({"acknowledge_duplicate_risk": True} if unchecked else {}),
                }
            )
            worker = f"cli-reconcile:{os.getpid()}"
            with contextlib.ExitStack() as stack:
                tools = (
                    {}
                    if succeeded is not None
                    else _lookup_tools(sd, op.tool, stack, output, thread_id=op.thread_id)
                )
                dispatcher = Dispatcher(ledger, tools, worker=worker)
                op = dispatcher.apply_verdict(operation_id, verdict)
    if output.json_mode:
        output.emit_json({"operation": operation_json(op)})
    else:
        print_table(output.out, operations_table([op], title="reconciled"))
        resume = command_hint(state_dir, "resume", "--thread", op.thread_id)
        output.out.print(escape(f"continue the thread with: {resume}"))
    return 0


_SERVICE_TOOLS: dict[str, Literal["tickets", "mail"]] = {
    "create_ticket": "tickets",
    "send_email": "mail",
}
"""Built-in tools whose lookups ask the demo services, and the service each asks."""


def _services_for_lookup(
    sd: StateDir, tool: str, stack: contextlib.ExitStack[Any]
) -> ServiceEndpoints:
    """The demo services that hold the truth about ``tool``'s effects for ``sd``.

    A "failed" verdict is checked against the service the effect was sent
    to, never against a new, empty one (which would answer "no such ticket"
    for a ticket that exists, and let the thread send it again). In order:
    the services ``EFFECTGATE_SERVICES`` names (as the served graph read
    them), if they answer; the services running for ``sd`` (its
    ``services/endpoints.json``); the demo services started here on ``sd``'s
    own service data, only when that data exists.

    Raises:
        DecisionError: ``EFFECTGATE_SERVICES`` names services that do not
            answer, or no services and no service data are known for ``sd``;
            nothing is recorded.
        ConfigError: ``EFFECTGATE_SERVICES`` is malformed.
    """
    from effectgate.demo.services import (
        SERVICES_ENV,
        DemoServices,
        ServiceEndpoints,
        answering,
        endpoints_from_env,
        running_endpoints,
        service_data_exists,
    )

    given = endpoints_from_env(os.environ.get(SERVICES_ENV))
    if isinstance(given, ServiceEndpoints):
        if answering(given):
            return given
        raise DecisionError(
            f"cannot check {tool}: the services {SERVICES_ENV} names ({given.ticket_url}, "
            f"{given.mail_url}) do not answer; start them and try again; nothing recorded"
        )
    running = running_endpoints(sd.services)
    if running is not None:
        return running
    if service_data_exists(sd.services, _SERVICE_TOOLS[tool]):
        return stack.enter_context(DemoServices(sd.services)).endpoints
    raise DecisionError(
        f"cannot check {tool}: no demo services are known for {sd.root} (none running for "
        f"it, none named in {SERVICES_ENV}, no service data in {sd.services}); set "
        f"{SERVICES_ENV} to the addresses the effect was sent to, or settle with "
        "--succeeded REF if it took effect; nothing recorded"
    )


def _lookup_tools(
    sd: StateDir,
    tool: str,
    stack: contextlib.ExitStack[Any],
    output: Output,
    *,
    thread_id: str | None = None,
) -> dict[str, ToolSpec]:
    """The thread's tools, to check a "failed" verdict against the tool's lookup.

    A thread run with ``--agent`` uses that agent's tools; otherwise the
    built-in ones. The ticket and mail lookups need the demo services: they
    are started for the check (``stack`` stops them). A tool this command does
    not have (a library's own, without ``--agent``) cannot be looked up: the
    verdict is applied unchecked, and a note says so.
    """
    from effectgate._app import default_tools
    from effectgate.cli._loader import agent_of, load_recipe
    from effectgate.graph._build import to_specs

    spec = agent_of(sd, thread_id) if thread_id is not None else None
    if spec is not None:
        found = to_specs(load_recipe(spec, sd).tools)
        if tool in found and found[tool].reconciler is not None:
            return found
    endpoints = _services_for_lookup(sd, tool, stack) if tool in _SERVICE_TOOLS else None
    tools = {t.name: t for t in default_tools(sd.workspace, endpoints)}
    if tool not in tools or tools[tool].reconciler is None:
        output.note(f"{tool} has no lookup here: the verdict is recorded without a check")
    return tools


def serve_services(state_dir: Path, output: Output, *, error_rate: float | None) -> int:
    """Run the demo services in the foreground until Ctrl-C or SIGTERM."""
    from effectgate._app import StateDir
    from effectgate.demo import DemoServices

    sd = StateDir.open(state_dir)
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with DemoServices(sd.services) as services:
            if error_rate is not None:
                services.set_error_rate("orders", error_rate)
            endpoints = services.endpoints
            info = {
                "ticket_url": endpoints.ticket_url,
                "mail_url": endpoints.mail_url,
                "smtp": f"{endpoints.smtp_host}:{endpoints.smtp_port}",
                "data_dir": str(sd.services),
            }
            if output.json_mode:
                output.emit_json(info)
            else:
                for key, value in info.items():
                    output.out.print(escape(f"{key:10} {value}"))
                output.out.print("press Ctrl-C to stop")
            while not stop.wait(0.5):
                pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    output.progress("services stopped")
    return 0
