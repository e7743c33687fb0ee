"""The one rule recovery follows: only an attempt nobody can still be running is taken over.

An attempt's worker ran it for a thread (the claim's ``thread_id``). It is
abandoned when that worker is proven gone, when nobody holds that thread's
lease any more, or when the caller holds it (it took the thread over). It is
live while its worker holds the lease, or while a third runner does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall
from effectgate.errors import ClaimLostError, OperationBusyError
from effectgate.graph import new_worker_id
from effectgate.ledger import EventKind, Ledger, Operation, OpState, PostgresLedger, SqliteLedger
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_receipt, make_request
from effectgate.tools import EffectKind, Lookup, ToolResult, ToolSpec

OP = "ticket:db-down"  # a business key: opened by thread A, needed by thread B
ALIVE = new_worker_id()  # this test process: alive, never proven gone


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Ledger, FakeClock]]:
    """The same rule on each store (tests annotate it as SqliteLedger, the first of them)."""
    clock = FakeClock()
    opened: Ledger
    if request.param == "postgres":
        opened = PostgresLedger(request.getfixturevalue("postgres_url"), clock=clock, pool_size=2)
    else:
        opened = SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock)
    with opened as ledger:
        req = make_request(OP, thread_id="A")
        ledger.record_review([req], [make_approval(req, clock)])
        yield ledger, clock


def _claimed_by_b(ledger: SqliteLedger) -> Operation:
    """Thread B's runner (worker ALIVE, holding B's lease) claims attempt 1 of A's operation."""
    ledger.acquire_lease("B", ALIVE, 30)
    return ledger.claim(OP, attempt=1, worker=ALIVE, thread_id="B")


def test_a_live_attempt_of_another_thread_is_left_alone(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, _ = ledger
    op = _claimed_by_b(led)
    led.acquire_lease("A", "runner-of-A", 30)
    assert led.recover_in_flight(thread_id="A", worker="runner-of-A") == []
    assert led.recover_in_flight() == []
    holder = led.attempt_holder(op, worker="runner-of-A")
    assert holder is not None and "in flight in thread 'B'" in holder
    with pytest.raises(OperationBusyError, match="in flight in thread 'B'"):
        led.recover_attempt(OP, attempt=1, worker="runner-of-A", reason="test")
    after = led.get(OP)
    assert after is not None and (after.state, after.attempt) == (OpState.IN_FLIGHT, 1)


def test_an_attempt_whose_thread_lease_expired_is_recovered(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, clock = ledger
    _claimed_by_b(led)
    clock.advance(31)  # B's runner stopped renewing (stopped, suspended, cut off)
    (recovered,) = led.recover_in_flight(thread_id="A", worker="runner-of-A")
    assert (recovered.state, recovered.attempt) == (OpState.UNKNOWN, 1)


def test_an_attempt_of_a_thread_the_caller_took_over_is_recovered(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, clock = ledger
    led.acquire_lease("A", ALIVE, 30)
    led.claim(OP, attempt=1, worker=ALIVE)  # A's own runner, claim for its own thread
    clock.advance(31)
    led.acquire_lease("A", "new-runner-of-A", 30)  # took A over: ALIVE is fenced off
    assert led.recover_in_flight(thread_id="A", worker="new-runner-of-A")[0].state is (
        OpState.UNKNOWN
    )


def test_a_third_runner_holding_the_thread_settles_it_itself(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, clock = ledger
    _claimed_by_b(led)
    clock.advance(31)
    led.acquire_lease("B", "new-runner-of-B", 30)  # B taken over by another runner
    assert led.recover_in_flight(thread_id="A", worker="runner-of-A") == []
    (mine,) = led.recover_in_flight(thread_id="A", worker="new-runner-of-B")
    assert mine.state is OpState.UNKNOWN


def test_the_callers_own_attempts_are_left_to_the_caller(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, _ = ledger
    led.acquire_lease("A", ALIVE, 30)
    led.claim(OP, attempt=1, worker=ALIVE)
    assert led.recover_in_flight(thread_id="A", worker=ALIVE) == []
    done = led.recover_attempt(OP, attempt=1, worker=ALIVE, reason="call returned")
    assert done.state is OpState.UNKNOWN
    with pytest.raises(ClaimLostError):  # fenced on the attempt: never applied twice
        led.recover_attempt(OP, attempt=1, worker=ALIVE, reason="again")


def test_a_fenced_off_late_result_is_kept_as_evidence(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, clock = ledger
    op = led.claim(OP, attempt=1, worker="w-stopped")
    led.recover_in_flight()  # no lease anywhere: taken as abandoned
    receipt = make_receipt(op, clock, result={"ticket_id": 7})
    with pytest.raises(ClaimLostError):
        led.record_result(OP, attempt=1, state=OpState.SUCCEEDED, receipt=receipt)
    after = led.get(OP)
    assert after is not None and after.state is OpState.UNKNOWN and after.receipt is None
    late = led.events(operation_id=OP)[-1]
    assert late.kind is EventKind.NOTE
    assert late.detail["late_result"] == "SUCCEEDED"
    assert (late.detail["fenced_attempt"], late.detail["result"]) == (1, {"ticket_id": 7})
    assert late.detail["reference"] == receipt.reference


class _FileArgs(BaseModel):
    path: str
    content: str


def test_the_late_result_reaches_the_human_who_reconciles(
    ledger: tuple[SqliteLedger, FakeClock],
) -> None:
    led, clock = ledger
    op = led.claim(OP, attempt=1, worker="w-stopped")
    led.recover_in_flight()
    receipt = make_receipt(op, clock, result={"ticket_id": 7})
    with pytest.raises(ClaimLostError):
        led.record_result(OP, attempt=1, state=OpState.SUCCEEDED, receipt=receipt)
    spec = ToolSpec(
        name="write_file",
        description="Write a file.",
        args_schema=_FileArgs,
        func=lambda args, ctx: ToolResult(value=None),
        kind=EffectKind.RECONCILABLE,
        reconciler=lambda args, ctx: Lookup.unavailable("the service is down"),
    )
    call = EffectCall(
        thread_id="A", tool_call_id=op.tool_call_id, tool="write_file", args=dict(op.args),
        operation_id=OP, intent_hash=op.intent_hash,
    )  # fmt: skip
    outcome = Dispatcher(led, {"write_file": spec}, worker="w2", clock=clock).dispatch(call)
    assert outcome.status is DispatchStatus.NEEDS_RECONCILIATION
    (late,) = outcome.evidence["late_results"]
    assert (late["late_result"], late["attempt"], late["result"]) == (
        "SUCCEEDED",
        1,
        {"ticket_id": 7},
    )
