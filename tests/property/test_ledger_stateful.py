"""A hypothesis state machine drives a real ledger (SQLite, PostgreSQL) against a dict model."""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from effectgate.errors import (
    ApprovalMismatchError,
    ClaimLostError,
    IllegalTransitionError,
    IntentConflictError,
)
from effectgate.ledger import (
    TERMINAL,
    TRANSITIONS,
    Budget,
    EventKind,
    Ledger,
    OpState,
    SqliteLedger,
)
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_receipt, make_request

S = OpState
OP_NAMES = ["t1:a", "t1:b", "t2:c"]
OP_IDS = st.sampled_from([*OP_NAMES, "t3:new"])
MOSTLY_FALSE = st.sampled_from([False, False, False, True])
CI = settings(max_examples=75, stateful_step_count=25, deadline=None)


@dataclasses.dataclass
class Model:
    """What the ledger should hold for one operation."""

    intent_hash: str
    variant: int
    max_attempts: int
    state: OpState = S.PROPOSED
    attempt: int = 0


def _request(op_id: str, variant: int, max_attempts: int = 3) -> object:
    return make_request(
        op_id,
        thread_id=op_id.split(":", maxsplit=1)[0],
        args={"path": f"{op_id}.txt", "content": f"v{variant}"},
        budget=Budget(max_attempts=max_attempts),
    )


class LedgerMachine(RuleBasedStateMachine):
    """Open / approve / claim / record / expire / settle / crash-and-reopen."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-stateful-"))
        self.clock = FakeClock()
        self.ledger = self._open_ledger()
        # Never writes: it sees every change through another connection, so
        # its thread listings must notice them by SQLite's data version.
        self.watcher = self._open_ledger()
        self.model: dict[str, Model] = {}

    def _open_ledger(self) -> Ledger:
        """A new ledger over this machine's storage (the same storage every time)."""
        return SqliteLedger(self.dir / "l.sqlite3", clock=self.clock)

    def teardown(self) -> None:
        self.ledger.close()
        self.watcher.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _expect_lost(self, op_id: str, call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except (ClaimLostError, KeyError, ValueError):
            return
        raise AssertionError(f"{op_id}: a refused step succeeded")

    @initialize(
        variants=st.lists(st.integers(0, 1), min_size=3, max_size=3),
        approve=st.lists(st.booleans(), min_size=3, max_size=3),
    )
    def start(self, variants: list[int], approve: list[bool]) -> None:
        # Start from a realistic review so most steps act on live operations.
        reqs = [_request(op_id, v) for op_id, v in zip(OP_NAMES, variants, strict=True)]
        approvals = [
            make_approval(r, self.clock)  # type: ignore[arg-type]
            for r, yes in zip(reqs, approve, strict=True)
            if yes
        ]
        ops = self.ledger.record_review(reqs, approvals)  # type: ignore[arg-type]
        for op, v in zip(ops, variants, strict=True):
            self.model[op.operation_id] = Model(op.intent_hash, v, 3, op.state)
        self.clock.advance(1)

    @rule(op_id=OP_IDS, variant=st.integers(0, 1), max_attempts=st.integers(1, 3))
    def open(self, op_id: str, variant: int, max_attempts: int) -> None:
        req = _request(op_id, variant, max_attempts)
        known = self.model.get(op_id)
        if known is not None and known.variant != variant:
            try:
                self.ledger.open(**vars_of(req))
            except IntentConflictError as exc:
                assert exc.stored_hash == known.intent_hash
                return
            raise AssertionError("a second intent was accepted for one operation")
        op = self.ledger.open(**vars_of(req))
        if known is None:
            self.model[op_id] = Model(op.intent_hash, variant, max_attempts)
        assert op.budget.max_attempts == self.model[op_id].max_attempts

    @precondition(lambda self: self.model)
    @rule(data=st.data(), decision=st.sampled_from(["approve", "edit", "reject"]), bad=MOSTLY_FALSE)
    def review(self, data: st.DataObject, decision: str, bad: bool) -> None:
        op_id = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[op_id]
        approval = make_approval(_request(op_id, m.variant), self.clock, decision=decision)  # type: ignore[arg-type]
        self.clock.advance(1)  # each decision gets its own key
        if bad:
            approval = dataclasses.replace(approval, intent_hash="b" * 64)
            try:
                self.ledger.record_review([], [approval])
            except ApprovalMismatchError:
                return
            raise AssertionError("an approval for other arguments was accepted")
        (op,) = self.ledger.record_review([], [approval])
        if decision == "reject" and m.state in (S.PROPOSED, S.APPROVED):
            m.state = S.REJECTED
        elif decision != "reject" and m.state is S.PROPOSED:
            m.state = S.APPROVED
        assert op.state is m.state

    @rule(data=st.data(), offset=st.sampled_from([0, 0, 0, 0, 1, -1]), anyone=MOSTLY_FALSE)
    def claim(self, data: st.DataObject, offset: int, anyone: bool) -> None:
        # mostly claim an operation that can be claimed, sometimes any operation
        ready = sorted(k for k, m in self.model.items() if m.state in (S.APPROVED, S.RETRY_WAIT))
        op_id = data.draw(st.sampled_from(ready) if ready and not anyone else OP_IDS)
        m = self.model.get(op_id)
        attempt = (m.attempt if m else 0) + 1 + offset
        ok = m is not None and m.state in (S.APPROVED, S.RETRY_WAIT) and offset == 0
        if not ok or m is None or attempt > m.max_attempts:
            self._expect_lost(op_id, lambda: self.ledger.claim(op_id, attempt=attempt, worker="w"))
            return
        op = self.ledger.claim(op_id, attempt=attempt, worker="w")
        m.state, m.attempt = S.IN_FLIGHT, attempt
        event(f"claimed attempt {attempt}")
        assert (op.state, op.attempt) == (m.state, m.attempt)

    @rule(
        data=st.data(),
        outcome=st.sampled_from([S.SUCCEEDED, S.FAILED, S.RETRY_WAIT, S.UNKNOWN]),
        stale=MOSTLY_FALSE,
    )
    def record(self, data: st.DataObject, outcome: OpState, stale: bool) -> None:
        # mostly answer an attempt that is in flight, sometimes any operation
        flying = sorted(k for k, m in self.model.items() if m.state is S.IN_FLIGHT)
        op_id = data.draw(st.sampled_from(flying) if flying and not stale else OP_IDS)
        m = self.model.get(op_id)
        current = self.ledger.get(op_id)
        attempt = (m.attempt if m else 1) - (1 if stale else 0)
        receipt = None
        if outcome is S.SUCCEEDED and current is not None:
            receipt = make_receipt(dataclasses.replace(current, attempt=attempt), self.clock)

        def call() -> object:
            return self.ledger.record_result(op_id, attempt=attempt, state=outcome, receipt=receipt)

        if (
            m is not None
            and not stale
            and current is not None
            and _same_record(current, outcome, attempt, receipt)
        ):
            # The attempt's own result again (its first commit's ack lost):
            # the recorded operation comes back, nothing changes.
            assert call() == current
            event(f"recorded {outcome} again")
            return
        if m is None or m.state is not S.IN_FLIGHT or stale:
            self._expect_lost(op_id, call)
            return
        op = call()
        m.state = outcome
        event(f"recorded {outcome}")
        assert op.state is outcome  # type: ignore[attr-defined]

    @rule(op_id=OP_IDS)
    def expire(self, op_id: str) -> None:
        self.clock.advance(3600)
        m = self.model.get(op_id)
        if m is None or m.state is not S.APPROVED:
            self._expect_lost(op_id, lambda: self.ledger.withdraw_approval(op_id, reason="expired"))
            return
        assert self.ledger.withdraw_approval(op_id, reason="expired").state is S.PROPOSED
        m.state = S.PROPOSED

    @precondition(
        lambda self: any(
            m.state in (S.UNKNOWN, S.NEEDS_RECONCILIATION) for m in self.model.values()
        )
    )
    @rule(data=st.data(), any_dst=MOSTLY_FALSE)
    def settle(self, data: st.DataObject, any_dst: bool) -> None:
        """Reconcile, park or give a human verdict on an operation whose outcome is unknown."""
        open_ = sorted(
            k for k, m in self.model.items() if m.state in (S.UNKNOWN, S.NEEDS_RECONCILIATION)
        )
        op_id = data.draw(st.sampled_from(open_))
        m = self.model[op_id]
        dst = data.draw(st.sampled_from(list(OpState) if any_dst else sorted(TRANSITIONS[m.state])))
        current = self.ledger.get(op_id)
        assert current is not None
        receipt = make_receipt(current, self.clock) if dst is S.SUCCEEDED else None
        if dst not in TRANSITIONS[m.state] or dst is S.IN_FLIGHT:
            try:
                self.ledger.transition(op_id, src=m.state, dst=dst, receipt=receipt)
            except (IllegalTransitionError, ValueError):
                return
            raise AssertionError(f"illegal {m.state} -> {dst} accepted")
        self.ledger.transition(op_id, src=m.state, dst=dst, receipt=receipt)
        event(f"settled {m.state} -> {dst}")
        m.state = dst

    @rule(crash=MOSTLY_FALSE)
    def crash_and_reopen(self, crash: bool) -> None:
        if not crash:  # a bare rule would be drawn far more often than the others
            return
        self.ledger.close()
        self.ledger = self._open_ledger()
        recovered = {op.operation_id for op in self.ledger.recover_in_flight()}
        expected = {k for k, m in self.model.items() if m.state is S.IN_FLIGHT}
        assert recovered == expected
        for k in expected:
            self.model[k].state = S.UNKNOWN
        event(f"recovered {len(expected)} in flight")

    @invariant()
    def thread_listings_match_a_full_read(self) -> None:
        """Per-thread listings (kept current incrementally) equal a filtered full read."""
        everything = self.ledger.list()
        for thread in ("t1", "t2", "t3"):
            expected = [op for op in everything if op.thread_id == thread]
            assert self.ledger.list(thread_id=thread) == expected
            assert self.watcher.list(thread_id=thread) == expected

    @invariant()
    def ledger_matches_model(self) -> None:
        stored = {op.operation_id: op for op in self.ledger.list()}
        assert set(stored) == set(self.model)
        for op_id, m in self.model.items():
            op = stored[op_id]
            assert (op.state, op.attempt, op.intent_hash) == (m.state, m.attempt, m.intent_hash)
            assert op.budget.max_attempts == m.max_attempts
            assert (op.receipt is not None) == (op.state is S.SUCCEEDED)

    @invariant()
    def event_log_laws(self) -> None:
        by_op: dict[str, list[tuple[OpState | None, OpState | None, int, EventKind]]] = {}
        for e in self.ledger.events():
            by_op.setdefault(e.operation_id, []).append((e.src, e.dst, e.attempt, e.kind))
        for op_id, events in by_op.items():
            moves = [
                (s, d, a) for s, d, a, k in events if k in (EventKind.TRANSITION, EventKind.CREATED)
            ]
            # at most one receipt: SUCCEEDED is entered at most once
            assert sum(d is S.SUCCEEDED for _, d, _ in moves) <= 1
            # attempts strictly increase, one at a time, at each claim
            claims = [a for _, d, a in moves if d is S.IN_FLIGHT]
            assert claims == list(range(1, len(claims) + 1)), (op_id, claims)
            # a terminal state is never left
            for i, (_, dst, _) in enumerate(moves):
                if dst in TERMINAL:
                    assert i == len(moves) - 1, (op_id, moves)
            # every move is in the table
            assert all(s is None or d in TRANSITIONS[s] for s, d, _ in moves)


def vars_of(req: object) -> dict[str, object]:
    return {name: getattr(req, name) for name in req.__dataclass_fields__}  # type: ignore[attr-defined]


TestLedgerStateful = LedgerMachine.TestCase
TestLedgerStateful.settings = CI


class PostgresLedgerMachine(LedgerMachine):
    """The same machine on PostgreSQL: one fresh schema per run, reopened as a new pool."""

    dsn = ""

    def _open_ledger(self) -> Ledger:
        from effectgate.ledger import PostgresLedger

        if not hasattr(self, "schema"):
            self.schema = f"p_{secrets.token_hex(6)}"
        return PostgresLedger(self.dsn, schema=self.schema, clock=self.clock, pool_size=1)


@pytest.mark.slow
def test_ledger_stateful_on_postgres(postgres_database: str) -> None:
    """Every rule and invariant of ``LedgerMachine`` against a ``PostgresLedger``.

    Fewer examples than on SQLite: each one creates and migrates a schema (~0.5 s).
    """
    PostgresLedgerMachine.dsn = postgres_database
    run_state_machine_as_test(PostgresLedgerMachine, settings=settings(CI, max_examples=20))


def _same_record(current: Any, outcome: OpState, attempt: int, receipt: Any) -> bool:
    """Whether ``record_result(attempt, outcome, receipt)`` repeats what ``current`` holds."""
    if current.state is not outcome or current.attempt != attempt or current.error is not None:
        return False
    if receipt is None or current.receipt is None:
        return receipt is None and current.receipt is None
    fields = ("operation_id", "intent_hash", "attempt", "source", "reference", "result")
    return all(getattr(receipt, f) == getattr(current.receipt, f) for f in fields)
