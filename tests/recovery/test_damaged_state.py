"""A damaged ledger is reported, never acted on; a lease nobody will give up can be broken.

Rows are edited behind the ledger's back (another tool, a half-restored
backup): each damage is reported as ``LedgerCorruptError`` naming the
operation and what is wrong, and nothing is dispatched from such a row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel

from effectgate import StateDir
from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall
from effectgate.errors import LedgerCorruptError, ThreadBusyError
from effectgate.ledger import Approval, Lease, OpenRequest, OpState, SqliteLedger
from effectgate.testing import FakeClock
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec
from tests.cli.conftest import eg

OP = "t1:c1"
FOREIGN = "build-host-7:4242:0123abcd:boot/4026531836"
"""A worker id from another host: never provably gone from here."""
NEVER_MS = 2**63 - 1


class Args(BaseModel):
    name: str


class Service:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def create(self, args: Args, ctx: ToolContext) -> ToolResult:
        self.calls.append(ctx.operation_id)
        return ToolResult(value={"name": args.name}, reference=f"R-{len(self.calls)}")

    def lookup(self, args: Args, ctx: ToolContext) -> Lookup:
        return Lookup.not_found("nothing")


def _spec(service: Service) -> ToolSpec:
    return ToolSpec(
        name="create_thing",
        description="Create a thing.",
        args_schema=Args,
        func=service.create,
        kind=EffectKind.KEYED,
        reconciler=service.lookup,
    )


def _tamper(path: Path, statement: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute(statement)
    conn.close()


@pytest.fixture
def done(tmp_path: Path) -> Iterator[tuple[Path, EffectCall, Service]]:
    """A ledger file holding one SUCCEEDED operation, created through dispatch."""
    path = StateDir.open(tmp_path / "state").ledger
    clock = FakeClock()
    service = Service()
    spec = _spec(service)
    args = spec.args_dict(spec.normalize({"name": "alpha"}, tool_call_id="c1"))
    ihash = spec.intent_hash(spec.normalize(args, tool_call_id="c1"))
    req = OpenRequest(
        operation_id=OP,
        thread_id="t1",
        tool_call_id="c1",
        tool=spec.name,
        tool_version=spec.version,
        args=args,
        intent_hash=ihash,
    )
    approval = Approval(
        operation_id=OP,
        thread_id="t1",
        tool_call_id="c1",
        decision="approve",
        intent_hash=ihash,
        reviewer="alice",
        decided_at=clock.now(),
    )
    call = EffectCall(
        thread_id="t1", tool_call_id="c1", tool=spec.name, args=args, operation_id=OP,
        intent_hash=ihash,
    )  # fmt: skip
    with SqliteLedger(path, clock=clock) as ledger:
        ledger.record_thread("t1", {"task": "create alpha"})
        ledger.record_review([req], [approval])
        outcome = Dispatcher(ledger, {spec.name: spec}, worker="w1", clock=clock).dispatch(call)
    assert outcome.status is DispatchStatus.SUCCEEDED and service.calls == [OP]
    service.calls.clear()
    yield path, call, service


DAMAGE = {
    "succeeded without a receipt": (
        f"UPDATE operations SET receipt_json = NULL WHERE operation_id = '{OP}'",
        "state SUCCEEDED without a receipt",
    ),
    "approved with a receipt at attempt 0": (
        f"UPDATE operations SET state = 'APPROVED', attempt = 0 WHERE operation_id = '{OP}'",
        "state APPROVED carries a receipt",
    ),
    "approved at attempt 1": (
        "UPDATE operations SET state = 'APPROVED', receipt_json = NULL "
        f"WHERE operation_id = '{OP}'",
        "state APPROVED at attempt 1",
    ),
    "in flight at attempt 0": (
        "UPDATE operations SET state = 'IN_FLIGHT', attempt = 0, receipt_json = NULL, "
        f"claimed_by = 'w1' WHERE operation_id = '{OP}'",
        "state IN_FLIGHT at attempt 0",
    ),
    "attempt past the budget": (
        f"UPDATE operations SET attempt = 9 WHERE operation_id = '{OP}'",
        "attempt 9 exceeds the budget's max_attempts 3",
    ),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_row_is_reported_and_nothing_is_dispatched(
    done: tuple[Path, EffectCall, Service], kind: str
) -> None:
    path, call, service = done
    statement, message = DAMAGE[kind]
    _tamper(path, statement)
    with SqliteLedger(path) as ledger:
        with pytest.raises(LedgerCorruptError, match=f"damaged row: {message}") as info:
            ledger.get(OP)
        assert info.value.operation_id == OP
        dispatcher = Dispatcher(ledger, {"create_thing": _spec(service)}, worker="w2")
        with pytest.raises(LedgerCorruptError, match=message):
            dispatcher.dispatch(call)
        with pytest.raises(LedgerCorruptError, match=message):
            ledger.list(thread_id="t1")
    assert service.calls == []


def test_the_cli_names_the_damage_in_one_line(done: tuple[Path, EffectCall, Service]) -> None:
    path, _, _ = done
    _tamper(path, DAMAGE["succeeded without a receipt"][0])
    ran = eg("ledger", "show", OP, "--state-dir", str(path.parent))
    assert ran.code == 1, ran.stderr
    assert (
        "LedgerCorruptError: operation 't1:c1': damaged row: state SUCCEEDED without a receipt"
        in (" ".join(ran.stderr.split()))
    )
    assert "Traceback" not in ran.stderr


def test_an_unknown_state_is_not_dropped_from_duplicate_checks(
    done: tuple[Path, EffectCall, Service],
) -> None:
    path, call, _ = done
    _tamper(path, f"UPDATE operations SET state = 'SUCCEEDED ' WHERE operation_id = '{OP}'")
    wanted = [OpState.SUCCEEDED, OpState.APPROVED, OpState.IN_FLIGHT, OpState.UNKNOWN]
    with (
        SqliteLedger(path) as ledger,
        pytest.raises(LedgerCorruptError, match="unknown state 'SUCCEEDED '"),
    ):
        ledger.list(intent_hash=call.intent_hash, states=wanted)


def _held(path: Path, expires_at_ms: int) -> None:
    """Thread t1's lease, held by a runner on another host until ``expires_at_ms``."""
    with SqliteLedger(path) as ledger:
        ledger.acquire_lease("t1", FOREIGN, 60)
    _tamper(path, f"UPDATE thread_leases SET expires_at_ms = {expires_at_ms}")


@pytest.mark.parametrize(
    "expiry_ms",
    [NEVER_MS, int(datetime(9999, 1, 1, tzinfo=UTC).timestamp() * 1000)],
    ids=["2^63-1", "year-9999"],
)
def test_a_lease_nobody_gives_up_is_broken_by_hand_and_audited(
    done: tuple[Path, EffectCall, Service], expiry_ms: int
) -> None:
    path, _, _ = done
    _held(path, expiry_ms)
    with SqliteLedger(path) as ledger, pytest.raises(ThreadBusyError, match=FOREIGN):
        ledger.acquire_lease("t1", "me", 30)
    state = str(path.parent)
    refused = eg("lease", "break", "--thread", "t1", "--state-dir", state)
    assert refused.code == 2 and "--reason" in refused.stderr
    blank = eg("lease", "break", "--thread", "t1", "--reason", " ", "--state-dir", state)
    assert blank.code == 2 and "--reason is empty" in blank.stderr
    with SqliteLedger(path) as ledger:
        assert ledger.thread_events("t1") == []

    ran = eg(
        "lease", "break", "--thread", "t1", "--reason", "build-host-7 was decommissioned",
        "--by", "carol", "--state-dir", state, "--json",
    )  # fmt: skip
    assert ran.code == 0, ran.stderr
    report = ran.json
    assert report["broken"]["owner"] == FOREIGN and report["broken"]["token"] == 1
    assert report["broken"]["was_expired"] is False
    assert (report["by"], report["reason"]) == ("carol", "build-host-7 was decommissioned")

    with SqliteLedger(path) as ledger:
        (event,) = ledger.thread_events("t1")
        assert (event.kind, event.actor) == ("lease_broken", "carol")
        assert event.detail["reason"] == "build-host-7 was decommissioned"
        assert event.detail["owner"] == FOREIGN
        mine = ledger.acquire_lease("t1", "me", 30)  # the thread is free now
        assert mine.token == 3  # 1 (foreign) -> 2 (broken) -> 3 (mine)
        with pytest.raises(ThreadBusyError):  # the old holder is fenced off
            ledger.renew_lease(
                Lease(thread_id="t1", owner=FOREIGN, token=1, expires_at=mine.expires_at), 30
            )


def test_breaking_a_lease_that_does_not_exist_says_so(
    done: tuple[Path, EffectCall, Service],
) -> None:
    state = str(done[0].parent)
    none = eg("lease", "break", "--thread", "t1", "--reason", "stuck", "--state-dir", state)
    assert none.code == 2 and "holds no lease" in none.stderr
    unknown = eg("lease", "break", "--thread", "zz", "--reason", "stuck", "--state-dir", state)
    assert unknown.code == 2 and "unknown thread 'zz'" in unknown.stderr


def test_a_lease_held_for_ever_names_the_command_that_breaks_it(
    done: tuple[Path, EffectCall, Service],
) -> None:
    path, _, _ = done
    _held(path, NEVER_MS)
    with SqliteLedger(path) as ledger, pytest.raises(ThreadBusyError) as info:
        ledger.acquire_lease("t1", "me", 30)
    assert "effectgate lease break --thread t1 --reason TEXT" in str(info.value)


def test_a_lease_token_with_no_successor_is_damage_not_an_overflow(tmp_path: Path) -> None:
    """A token at the largest integer can never be raised: one line naming it (exit 1)."""
    state = StateDir.open(tmp_path / "state")
    with SqliteLedger(state.ledger) as ledger:
        ledger.record_thread("t", {"task": "x"}, {})
        ledger.acquire_lease("t", "w:1", 30.0)
    with sqlite3.connect(state.ledger) as conn:
        conn.execute("UPDATE thread_leases SET token = 9223372036854775807")
    with SqliteLedger(state.ledger) as ledger, pytest.raises(LedgerCorruptError, match="token"):
        ledger.acquire_lease("t", "w:2", 30.0)
    ran = eg("lease", "break", "--thread", "t", "--reason", "r", "--state-dir", str(state.root))
    assert ran.code == 1 and "Traceback" not in ran.stderr and "token" in ran.stderr


def test_breaking_a_lease_already_given_up_says_nobody_held_it(
    done: tuple[Path, EffectCall, Service],
) -> None:
    """It read "held by ... expiring 1970-01-01 ...; it may still be running" (a fresh user)."""
    path, _, _ = done
    with SqliteLedger(path) as ledger:
        ledger.release_lease(ledger.acquire_lease("t1", "me", 30))
    state = str(path.parent)
    ran = eg("lease", "break", "--thread", "t1", "--reason", "tidy", "--state-dir", state)
    assert ran.code == 0, ran.stderr
    assert "already given up by me" in ran.stdout and "may still be running" not in ran.stdout
