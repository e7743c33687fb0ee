"""Shared helpers for the conformance experiments.

The experiments perform one write, creating a ticket, under injected faults.
These helpers build that experiment on effectgate's public API: a scripted
model that proposes ``create_ticket`` once, agents and dispatchers wired to
the demo ticket service, and small entry points (``*_main``) that tests run in
a *new Python process* so that a crash is a real process death (``os._exit``
through a failpoint), never an exception.

Subprocess entry points are run as
``python -c "from tests.conformance._experiments import X; X()" ARGS`` from the
repository root (see ``py_cmd``); they import only the public API.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from tests.answers._bind import bound

from effectgate.dispatch import Dispatcher, EffectCall
from effectgate.ledger import Approval, Budget, Ledger, OpenRequest, Operation, SqliteLedger
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec, ticket_tools

REPO = Path(__file__).resolve().parents[2]
ALERT = "orders-error-rate"
TITLE = "orders: error rate above 5%"
BODY = "The order service's error rate over the last 5 minutes is 0.12 (threshold 0.05)."
TASK = "Check the order service's error rate and handle any incident."
TICKET_OP = f"ticket:{ALERT}"
CLIENT_TIMEOUT_S = 1.0
"""The ticket tool's read timeout in in-process tests (seconds)."""
HOLD_S = 1.5
"""How long a faulted server holds a committed request before dropping it (seconds)."""


# --------------------------------------------------------------------------- models


def ticket_script(*, title: str = TITLE, alert_id: str | None = ALERT) -> dict[str, Any]:
    """A two-turn script: propose one ``create_ticket``, then report the ticket id."""
    args: dict[str, Any] = {"title": title, "body": BODY, "severity": "high"}
    if alert_id is not None:
        args["alert_id"] = alert_id
    return {
        "name": "conformance-ticket",
        "turns": [
            {"say": "Opening a ticket.", "tool_calls": [{"name": "create_ticket", "args": args}]},
            {"say": "Ticket TICKET-{{ result.create_ticket.ticket_id }} is open."},
        ],
    }


def script_model(tmp_path: Path, script: Mapping[str, Any], name: str = "ticket") -> str:
    """Write ``script`` as JSON under ``tmp_path``; return the ``scripted:<path>`` model spec."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    return f"scripted:{path}"


# ---------------------------------------------------------------------------- tools


def create_ticket_spec(url: str, *, version: str = "1") -> ToolSpec:
    """The built-in ``create_ticket`` with a short client timeout, at ``version``."""
    return next(s for s in ticket_specs(url, version=version) if s.name == "create_ticket")


def ticket_specs(url: str, *, version: str = "1") -> list[ToolSpec]:
    """``get_error_rate`` and ``create_ticket`` (at ``version``) with a short client timeout."""
    return [
        dataclasses.replace(s, version=version) if s.name == "create_ticket" else s
        for s in ticket_tools(url, timeout_s=CLIENT_TIMEOUT_S)
    ]


class EntryArgs(BaseModel):
    """Arguments of the non-idempotent external ledger's ``ext_append``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    entry: str


def external_ledger_tool(db: Path) -> ToolSpec:
    """An UNSAFE tool over an external ledger with no idempotency protocol.

    Each call appends one row to ``db``; the system offers no key and no lookup,
    so a repeat always adds another row.
    """

    def append(args: EntryArgs, ctx: ToolContext) -> ToolResult:
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn, conn:
            conn.execute("CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, entry TEXT)")
            row = conn.execute("INSERT INTO entries (entry) VALUES (?)", (args.entry,)).lastrowid
        return ToolResult(value={"row_id": row}, reference=f"ROW-{row}")

    return ToolSpec(
        name="ext_append",
        description="Append an entry to the external ledger (no idempotency key).",
        args_schema=EntryArgs,
        func=append,
        kind=EffectKind.UNSAFE,
    )


def external_rows(db: Path) -> list[str]:
    """Read the external ledger's own rows (the oracle for ``ext_append``)."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        return [r[0] for r in conn.execute("SELECT entry FROM entries ORDER BY id")]


# --------------------------------------------------------------------- agent in-process


@contextlib.contextmanager
def ticket_agent(
    state_root: Path,
    url: str,
    *,
    script: Mapping[str, Any] | None = None,
    policy: Any = None,
    clock: Any = None,
    version: str = "1",
) -> Iterator[Any]:
    """An ``Agent`` over ``state_root``'s ledger and checkpoints with the ticket tools.

    Ledger backoff jitter is seeded (``random.Random(0)``) so waits are reproducible.
    """
    from effectgate.graph import Agent, StepDurableSaver
    from effectgate.models import ScriptedChatModel

    ledger = SqliteLedger(state_root / "ledger.sqlite3", clock=clock, rng=random.Random(0))
    conn = sqlite3.connect(state_root / "checkpoints.sqlite3", check_same_thread=False)
    try:
        yield Agent(
            ScriptedChatModel.from_script(dict(script or ticket_script())),
            ticket_specs(url, version=version),
            ledger=ledger,
            checkpointer=StepDurableSaver(conn),
            policy=policy,
            clock=clock,
        )
    finally:
        conn.close()
        ledger.close()


def decisions(result: Any, kind: str = "approve") -> dict[str, Any]:
    """A review answer giving ``kind`` to every call of the pending review interrupt."""
    (pending,) = result.interrupts
    n = len(pending.value["action_requests"])
    return {"decisions": [{"type": kind} for _ in range(n)], "reviewer": "conformance-test"}


def run_approving(agent: Any, thread: str, task: str = TASK) -> Any:
    """Start ``thread`` and approve every review until it stops for something else."""
    from effectgate.graph import RunStatus

    result = agent.start(task, thread_id=thread)
    while result.status is RunStatus.WAITING_REVIEW:
        result = agent.resume(thread, decisions=bound(agent, thread, decisions(result)))
    return result


# ----------------------------------------------------------------------- ledger views


def transitions(ledger: Ledger, operation_id: str) -> list[tuple[str | None, str | None, int]]:
    """The operation's state changes as ``(src, dst, attempt)``, in order."""
    return [
        (e.src and e.src.value, e.dst and e.dst.value, e.attempt)
        for e in ledger.events(operation_id=operation_id)
        if e.dst is not None
    ]


def read_op(ledger_path: Path, operation_id: str = TICKET_OP) -> Operation:
    """Read one operation from the ledger file (a fresh connection, as another process would)."""
    with SqliteLedger(ledger_path) as ledger:
        op = ledger.get(operation_id)
    assert op is not None, f"no operation {operation_id!r} in {ledger_path}"
    return op


def read_transitions(ledger_path: Path, operation_id: str = TICKET_OP) -> list[tuple[Any, ...]]:
    """``transitions`` read from the ledger file."""
    with SqliteLedger(ledger_path) as ledger:
        return transitions(ledger, operation_id)


def tickets_for(tickets: Sequence[Mapping[str, Any]], alert_id: str) -> list[Mapping[str, Any]]:
    """The tickets of one alert, from the ticket service's own rows."""
    return [t for t in tickets if t["alert_id"] == alert_id]


# --------------------------------------------------------------------- dispatcher level


def effect_call(
    spec: ToolSpec, raw_args: Mapping[str, Any], *, thread: str = "t1", call_id: str = "call-1"
) -> EffectCall:
    """The reviewed call the effect node would hand to ``Dispatcher.dispatch``."""
    args = spec.normalize(raw_args)
    return EffectCall(
        thread_id=thread,
        tool_call_id=call_id,
        tool=spec.name,
        args=spec.args_dict(args),
        operation_id=spec.operation_id_for(args, thread_id=thread, tool_call_id=call_id),
        intent_hash=spec.intent_hash(args),
    )


def approve(
    ledger: Ledger,
    spec: ToolSpec,
    call: EffectCall,
    *,
    budget: Budget | None = None,
    expires_at: Any = None,
) -> Operation:
    """Record the review of ``call`` with an approval, as the review node does."""
    now = ledger.clock.now()
    (op,) = ledger.record_review(
        [
            OpenRequest(
                operation_id=call.operation_id,
                thread_id=call.thread_id,
                tool_call_id=call.tool_call_id,
                tool=spec.name,
                tool_version=spec.version,
                args=call.args,
                intent_hash=call.intent_hash,
                budget=budget,
            )
        ],
        [
            Approval(
                operation_id=call.operation_id,
                thread_id=call.thread_id,
                tool_call_id=call.tool_call_id,
                decision="approve",
                intent_hash=call.intent_hash,
                reviewer="conformance-test",
                decided_at=now,
                expires_at=expires_at,
            )
        ],
    )
    return op


# ------------------------------------------------------------------------- processes


def py_cmd(entry: str, *args: str) -> list[str]:
    """The command line running ``_experiments.<entry>()`` in a new interpreter."""
    code = f"import sys; from tests.conformance._experiments import {entry}; sys.exit({entry}())"
    return [sys.executable, "-c", code, *args]


def run_py(
    entry: str, *args: str, failpoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``_experiments.<entry>()`` in a new interpreter and wait for it (60 s at most)."""
    return subprocess.run(
        py_cmd(entry, *args),
        cwd=REPO,
        env=py_env(failpoint),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def runner_args(state_dir: Any, thread: str, model: str) -> list[str]:
    """The arguments of ``runner_main`` for one thread of a state directory."""
    return ["--state-dir", str(state_dir.root), "--thread", thread, "--model", model]


def dispatch_args(ledger: Path, tool: str, target: Path, args: Mapping[str, Any]) -> list[str]:
    """The arguments of ``dispatch_main``."""
    where = ["--ledger", str(ledger), "--tool", tool, "--target", str(target)]
    return [*where, "--args", json.dumps(dict(args))]


def py_env(failpoint: str | None = None) -> dict[str, str]:
    """Environment for ``py_cmd``: the repository importable, a failpoint or none."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    return env


def runner_main(argv: Sequence[str] | None = None) -> int:
    """Run or resume one thread with a given budget, like the worker; print a JSON summary.

    The worker module has no budget flags; this is the same loop with a
    ``Policy(budget=Budget(max_attempts=N, backoff_base_s=B))``. Exit codes
    follow the worker: 0 done, 3 reconciliation, 4 review, 5 incomplete.
    """
    from effectgate import StateDir, open_agent
    from effectgate.errors import ConfigError
    from effectgate.graph import Policy

    p = argparse.ArgumentParser()
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--thread", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--backoff-base-s", type=float, default=0.05)
    p.add_argument("--keyed-only", action="store_true", help="create_ticket without its lookup")
    a = p.parse_args(argv)
    sd = StateDir.open(a.state_dir)
    url = json.loads((sd.services / "endpoints.json").read_text())["ticket_url"]
    budget = Budget(max_attempts=a.max_attempts, backoff_base_s=a.backoff_base_s)
    policy = Policy(budget=budget)
    tools = ticket_specs(url)
    if a.keyed_only:
        # KEYED without a reconciler: recovery is a replay with the original key.
        tools = [dataclasses.replace(t, reconciler=None) for t in tools]
    with open_agent(sd, model=a.model, tools=tools, policy=policy) as agent:
        try:
            result = agent.start(TASK, thread_id=a.thread)
        except ConfigError:  # the thread exists: continue it, as the worker does
            result = agent.resume(a.thread)
        while result.status.value == "waiting_review":
            result = agent.resume(a.thread, decisions=bound(agent, a.thread, decisions(result)))
        ops = [{"tool": o.tool, "state": o.state, "attempt": o.attempt} for o in result.operations]
        print(json.dumps({"status": result.status, "operations": ops}), flush=True)
    return {"done": 0, "waiting_reconciliation": 3, "waiting_review": 4}.get(result.status.value, 5)


def dispatch_main(argv: Sequence[str] | None = None) -> int:
    """Dispatch one approved call of ``ext_append`` or ``write_file`` in this process.

    ``--die-before-replace`` kills the process (``os._exit(137)``) when
    ``write_file`` has written and fsync'd its temp file but not yet renamed it
    (between the temporary receipt and the atomic replace).
    """
    from effectgate.tools import file_tools

    p = argparse.ArgumentParser()
    p.add_argument("--ledger", type=Path, required=True)
    p.add_argument("--tool", choices=["ext_append", "write_file"], required=True)
    p.add_argument("--target", type=Path, required=True, help="external db or workspace")
    p.add_argument("--args", required=True, help="JSON arguments")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--die-before-replace", action="store_true")
    a = p.parse_args(argv)
    if a.tool == "ext_append":
        spec = external_ledger_tool(a.target)
    else:
        spec = next(s for s in file_tools(a.target) if s.name == "write_file")
    if a.die_before_replace:
        _die_before_replace()
    call = effect_call(spec, json.loads(a.args))
    with SqliteLedger(a.ledger) as ledger:
        if ledger.get(call.operation_id) is None:
            approve(ledger, spec, call, budget=Budget(max_attempts=a.max_attempts))
        outcome = Dispatcher(ledger, {spec.name: spec}, worker=f"proc-{os.getpid()}").dispatch(call)
    op = outcome.operation
    print(json.dumps({"status": outcome.status.value, "attempt": op and op.attempt}), flush=True)
    return 0


def _die_before_replace() -> None:
    real_replace = os.replace

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(src).startswith(".effectgate-"):  # write_file's temp file
            os._exit(137)
        real_replace(src, dst, *args, **kwargs)

    os.replace = replace  # type: ignore[assignment]


def claim_main(argv: Sequence[str] | None = None) -> int:
    """One of N racing processes: wait for the go file, claim attempt 1, run it if won.

    Prints ``{"worker", "won", "error"}``. The winner creates the ticket with
    the operation id as its key and records the receipt, fenced by attempt 1.
    """
    from effectgate.errors import ClaimLostError
    from effectgate.ledger import OpState, Receipt

    p = argparse.ArgumentParser()
    p.add_argument("--ledger", type=Path, required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--sync-dir", type=Path, required=True)
    a = p.parse_args(argv)
    spec = create_ticket_spec(a.url)
    with SqliteLedger(a.ledger) as ledger:
        (a.sync_dir / f"ready-{a.worker}").touch()
        deadline = time.monotonic() + 30
        while not (a.sync_dir / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        try:
            op = ledger.claim(TICKET_OP, attempt=1, worker=a.worker)
        except ClaimLostError as exc:
            print(json.dumps({"worker": a.worker, "won": False, "error": str(exc)}), flush=True)
            return 0
        ctx = ToolContext(
            operation_id=op.operation_id,
            thread_id=op.thread_id,
            tool_call_id=op.tool_call_id,
            attempt=op.attempt,
        )
        result = spec.call(spec.normalize(op.args), ctx)
        receipt = Receipt(
            operation_id=op.operation_id,
            intent_hash=op.intent_hash,
            attempt=op.attempt,
            result=result.value,
            reference=result.reference,
            recorded_at=ledger.clock.now(),
        )
        ledger.record_result(op.operation_id, attempt=1, state=OpState.SUCCEEDED, receipt=receipt)
    print(json.dumps({"worker": a.worker, "won": True, "error": None}), flush=True)
    return 0


def naive_sender_main(argv: Sequence[str] | None = None) -> int:
    """A deliberately naive sender: mark the task done, *then* send it.

    Its outbox is one SQLite table ``tasks(task_id, status)``. With
    ``--die-after-mark`` the process exits (``os._exit(70)``) between the two
    steps; a restarted sender sees no pending task and sends nothing.
    """
    p = argparse.ArgumentParser()
    p.add_argument("--outbox", type=Path, required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--die-after-mark", action="store_true")
    a = p.parse_args(argv)
    spec = create_ticket_spec(a.url)
    sent = 0
    with contextlib.closing(sqlite3.connect(a.outbox, isolation_level=None)) as conn:
        pending = [r[0] for r in conn.execute("SELECT task_id FROM tasks WHERE status='pending'")]
        for task_id in pending:
            conn.execute("UPDATE tasks SET status='done' WHERE task_id=?", (task_id,))
            if a.die_after_mark:
                os._exit(70)
            args = spec.normalize({"title": TITLE, "body": BODY, "alert_id": task_id})
            ctx = ToolContext(
                operation_id=f"naive:{task_id}", thread_id="naive", tool_call_id=task_id, attempt=1
            )
            spec.call(args, ctx)
            sent += 1
    print(json.dumps({"sent": sent}), flush=True)
    return 0


def approve_but_stop_before_effects(agent: Any, thread: str, result: Any) -> None:
    """Answer the pending review with "approve", then stop before any effect node runs.

    The review's decision and approval are recorded and checkpointed, and the
    approved ``Send`` waits in the checkpoint: the moment "after review, before
    dispatch" that a process restart (or a long pause) would leave behind.
    """
    from langgraph.types import Command

    (pending,) = result.interrupts
    effects = [n for n in agent.graph.nodes if n.startswith("effect.")]
    config = {"configurable": {"thread_id": thread}}
    resume: Command[Any] = Command(resume={pending.id: decisions(result)})
    for _ in agent.graph.stream(resume, config, interrupt_before=effects, durability="sync"):
        pass
    assert agent.graph.get_state(config).next, "an effect node should be waiting"
