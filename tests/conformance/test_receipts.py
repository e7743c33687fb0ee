"""Receipts (per-call results): crashes around the receipt, and receipts that are not ours.

A receipt is written once per call (temp file, fsync, atomic replace) and its
identity is checked when it is read back. In effectgate the receipt lives in
the ledger row, and the artefacts are the external system's rows and the
workspace's bytes; each test kills a real process at one point around the
receipt and checks both.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.conformance._experiments import (
    ALERT,
    BODY,
    TICKET_OP,
    TITLE,
    approve,
    create_ticket_spec,
    dispatch_args,
    effect_call,
    read_op,
    read_transitions,
    run_py,
    script_model,
    ticket_script,
)
from tests.conftest import run_worker

from effectgate import StateDir, open_agent
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall, Verdict
from effectgate.errors import LedgerCorruptError
from effectgate.graph import RunStatus
from effectgate.ledger import OpState, Receipt, SqliteLedger
from effectgate.testing import Failpoint
from effectgate.tools import file_tools

S = OpState
NOTE = "incidents/orders-error-rate.md"
NOTE_TEXT = "# Incident: orders error rate above 5%\n\n- Ticket: TICKET-1\n"


@pytest.mark.crash
@pytest.mark.parametrize(
    ("lookups", "exit_code", "source"),
    [("ok", 0, "reconcile"), ("unavailable", 3, "human")],
    ids=["query-path", "human-path"],
)
def test_crash_between_tool_done_and_receipt_written(
    services: DemoServices,
    state_dir: StateDir,
    tmp_path: Path,
    lookups: str,
    exit_code: int,
    source: str,
) -> None:
    """The tool finished, the receipt was never written -> query, else a human."""
    model = script_model(tmp_path, ticket_script())
    spec = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket"
    assert run_worker(state_dir, "t1", model=model, failpoint=spec).returncode == ExitCode.KILLED
    crashed = read_op(state_dir.ledger)
    assert (crashed.state, crashed.attempt, crashed.receipt) == (S.IN_FLIGHT, 1, None)
    (ticket,) = services.tickets()

    services.set_fault("tickets", "normal", lookups=lookups)
    resumed = run_worker(state_dir, "t1", model=model)
    assert resumed.returncode == exit_code, resumed.stderr[-2000:]
    if lookups == "unavailable":
        # Nobody can ask the service: a human checks it and records the evidence.
        parked = read_op(state_dir.ledger)
        assert (parked.state, parked.attempt) == (S.NEEDS_RECONCILIATION, 1)
        verdict = Verdict(verdict="succeeded", reference=f"TICKET-{ticket['ticket_id']}")
        with open_agent(state_dir, model=model, endpoints=services.endpoints) as agent:
            assert agent.resume("t1", verdicts={TICKET_OP: verdict}).status is RunStatus.DONE
    op = read_op(state_dir.ledger)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 1)
    assert op.receipt is not None and op.receipt.source == source
    assert op.receipt.reference == f"TICKET-{ticket['ticket_id']}"
    assert (S.IN_FLIGHT, S.UNKNOWN, 1) in read_transitions(state_dir.ledger)
    assert services.tickets() == [ticket]
    assert services.stats("tickets")["create_requests"] == 1  # never sent twice


def _visible_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.crash
def test_crash_between_temp_receipt_and_atomic_replace(tmp_path: Path) -> None:
    """Killed after the temp file, before the rename -> completes, one artefact."""
    workspace, path = tmp_path / "workspace", tmp_path / "ledger.sqlite3"
    workspace.mkdir()
    raw = {"path": NOTE, "content": NOTE_TEXT}
    args = dispatch_args(path, "write_file", workspace, raw)
    crashed = run_py("dispatch_main", *args, "--die-before-replace")
    assert crashed.returncode == ExitCode.KILLED, crashed.stderr[-2000:]
    assert _visible_files(workspace) == {}  # the temp file exists, the target does not
    temps = list(workspace.rglob(".effectgate-*.tmp"))
    assert [t.read_bytes() for t in temps] == [NOTE_TEXT.encode()]
    left = read_op(path, effect_call(file_tools(workspace)[2], raw).operation_id)
    assert (left.state, left.attempt) == (S.IN_FLIGHT, 1)

    resumed = run_py("dispatch_main", *args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["status"] == DispatchStatus.SUCCEEDED
    assert _visible_files(workspace) == {NOTE: NOTE_TEXT.encode()}
    # No second artefact: the retry removed the dead attempt's temp file too.
    assert list(workspace.rglob(".effectgate-*.tmp")) == []
    op = read_op(path, left.operation_id)
    assert (op.state, op.attempt) == (S.SUCCEEDED, 2)  # idempotent: same bytes again
    assert op.receipt is not None and op.receipt.reference is not None
    assert op.receipt.reference == "sha256:" + hashlib.sha256(NOTE_TEXT.encode()).hexdigest()


def _two_settled_tickets(services: DemoServices, path: Path) -> tuple[EffectCall, EffectCall]:
    spec = create_ticket_spec(services.endpoints.ticket_url)
    calls = []
    with SqliteLedger(path) as ledger:
        dispatcher = Dispatcher(ledger, {spec.name: spec}, worker="w")
        for alert in (ALERT, f"{ALERT}-2"):
            call = effect_call(spec, {"title": TITLE, "body": BODY, "alert_id": alert})
            approve(ledger, spec, call)
            assert dispatcher.dispatch(call).status is DispatchStatus.SUCCEEDED
            calls.append(call)
    return calls[0], calls[1]


def test_receipt_with_another_identity_is_refused_when_recorded(
    services: DemoServices, tmp_path: Path
) -> None:
    """A receipt naming another operation or intent cannot be recorded."""
    spec = create_ticket_spec(services.endpoints.ticket_url)
    call = effect_call(spec, {"title": TITLE, "body": BODY, "alert_id": ALERT})
    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        op = approve(ledger, spec, call)
        op = ledger.claim(op.operation_id, attempt=1, worker="w")
        now = datetime.now(UTC)
        foreign = Receipt(
            operation_id="ticket:other",
            intent_hash=op.intent_hash,
            attempt=1,
            result={"ticket_id": 9},
            recorded_at=now,
        )
        with pytest.raises(ValueError, match="receipt is for operation"):
            ledger.record_result(op.operation_id, attempt=1, state=S.SUCCEEDED, receipt=foreign)
        other_intent = Receipt(
            operation_id=op.operation_id,
            intent_hash="0" * 64,
            attempt=1,
            result={"ticket_id": 9},
            recorded_at=now,
        )
        with pytest.raises(LedgerCorruptError):
            ledger.record_result(
                op.operation_id, attempt=1, state=S.SUCCEEDED, receipt=other_intent
            )
        after = ledger.get(op.operation_id)
    assert after is not None and (after.state, after.attempt, after.receipt) == (
        S.IN_FLIGHT,
        1,
        None,
    )
    assert services.tickets() == []  # the forged receipts stand for no ticket at all


def test_stored_receipt_of_another_operation_is_refused_on_read(
    services: DemoServices, tmp_path: Path
) -> None:
    """A stored receipt swapped in from another operation is never handed out."""
    path = tmp_path / "ledger.sqlite3"
    first, second = _two_settled_tickets(services, path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "UPDATE operations SET receipt_json = "
            "(SELECT receipt_json FROM operations WHERE operation_id = ?) "
            "WHERE operation_id = ?",
            (second.operation_id, first.operation_id),
        )
    spec = create_ticket_spec(services.endpoints.ticket_url)
    with SqliteLedger(path) as ledger:
        with pytest.raises(LedgerCorruptError, match="receipt belongs to operation"):
            ledger.get(first.operation_id)
        with pytest.raises(LedgerCorruptError):
            Dispatcher(ledger, {spec.name: spec}, worker="w2").dispatch(first)
    # Refusing is all it did: no tool call, no new ticket.
    assert len(services.tickets()) == 2
    assert services.stats("tickets")["create_requests"] == 2
