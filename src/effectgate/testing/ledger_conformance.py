"""The ledger conformance suite: what every ``LedgerStore`` must do behind a ``Ledger``.

Subclass ``LedgerConformance`` as ``Test<Store>`` in a test module and
implement ``make_store`` (langgraph's published checkpointer conformance
suite is the model; ``tests/conformance/test_sqlite_store.py`` is an example).
``make_store(name)`` must return a store over *the same* storage each time it
is called with the same ``name`` (that is how the suite reopens after a
"restart"), and over fresh, empty storage for a new name. Every test asserts
on state read back through a new store where it matters, never on mocks.

The suite's base and makers are ``testing/_ledger_fixtures.py``; its threads,
leases and recovery tests ``testing/_lease_conformance.py``: both come with
``LedgerConformance``.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from effectgate import errors
from effectgate.ledger import (
    Budget,
    DamagedOperation,
    EventKind,
    Expect,
    Operation,
    OpState,
    Receipt,
)
from effectgate.ledger._store import Change, WriteOnce
from effectgate.testing._lease_conformance import LeaseConformance
from effectgate.testing._ledger_fixtures import (
    dead_worker_id,
    make_approval,
    make_receipt,
    make_request,
    note_event,
    open_fields,
)

__all__ = [
    "LedgerConformance",
    "dead_worker_id",
    "make_approval",
    "make_receipt",
    "make_request",
]

_S = OpState


class LedgerConformance(LeaseConformance):
    """Behaviour every store must give a ``Ledger``; subclass and implement ``make_store``."""

    # ----------------------------------------------------------- opening

    def test_open_creates_proposed_with_budget(self) -> None:
        """A new operation is PROPOSED, attempt 0, with the budget it was opened with."""
        deadline = self.clock.now() + timedelta(hours=1)
        req = make_request(budget=Budget(max_attempts=5, deadline_at=deadline))
        op = self.ledger().open(**open_fields(req))
        assert (op.state, op.attempt, op.budget.max_attempts) == (_S.PROPOSED, 0, 5)
        assert op.budget.deadline_at == deadline
        assert self.ledger().get(req.operation_id) == op

    def test_open_existing_same_intent_returns_it_unchanged(self) -> None:
        """Re-opening with the same intent returns the stored row; a new budget is ignored."""
        ledger = self.ledger()
        first = self.approved(ledger, make_request(budget=Budget(max_attempts=2)))
        again = ledger.open(**open_fields(make_request(budget=Budget(max_attempts=9))))
        assert again == first
        assert (again.state, again.budget.max_attempts) == (_S.APPROVED, 2)

    def test_open_other_intent_conflicts_and_keeps_row(self) -> None:
        """Same operation id with other arguments raises IntentConflictError with both hashes."""
        ledger = self.ledger()
        op = ledger.open(**open_fields(make_request()))
        other = make_request(args={"path": "notes.txt", "content": "different"})
        with pytest.raises(errors.IntentConflictError) as info:
            ledger.open(**open_fields(other))
        assert (info.value.stored_hash, info.value.new_hash) == (op.intent_hash, other.intent_hash)
        assert ledger.get(op.operation_id) == op

    def test_open_refuses_a_hash_that_does_not_match_args(self) -> None:
        """An intent hash that is not the hash of the arguments is refused before writing."""
        ledger = self.ledger()
        bad = dataclasses.replace(make_request(), intent_hash="0" * 64)
        with pytest.raises(ValueError, match="intent_hash"):
            ledger.open(**open_fields(bad))
        assert ledger.get(bad.operation_id) is None
        assert ledger.events() == []

    # ------------------------------------------------------------ review

    def test_review_approves_and_rerun_changes_nothing(self) -> None:
        """Recording the same review twice leaves one approval row and the same events."""
        ledger = self.ledger()
        reqs = [make_request("t1:a"), make_request("t1:b")]
        approvals = [make_approval(r, self.clock) for r in reqs]
        ops = ledger.record_review(reqs, approvals)
        events = ledger.events()
        assert [o.state for o in ops] == [_S.APPROVED, _S.APPROVED]
        assert ledger.record_review(reqs, approvals) == ops
        assert ledger.events() == events
        assert ledger.approvals("t1:a") == [approvals[0]]

    def test_review_reject_from_proposed_and_from_approved(self) -> None:
        """A reject moves PROPOSED or APPROVED to REJECTED."""
        ledger = self.ledger()
        req_a, req_b = make_request("t1:a"), make_request("t1:b")
        ledger.record_review([req_a, req_b], [make_approval(req_b, self.clock)])
        rejects = [make_approval(r, self.clock, decision="reject") for r in (req_a, req_b)]
        ops = ledger.record_review([], rejects)
        assert [o.state for o in ops] == [_S.REJECTED, _S.REJECTED]

    def test_review_after_dispatch_keeps_state_and_appends(self) -> None:
        """An approval for an operation already IN_FLIGHT keeps the state but is recorded."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        self.clock.advance(1)
        (after,) = ledger.record_review([], [make_approval(op, self.clock, decision="reject")])
        assert after.state is _S.IN_FLIGHT
        assert [a.decision for a in ledger.approvals(op.operation_id)] == ["approve", "reject"]
        assert ledger.events(operation_id=op.operation_id)[-1].kind is EventKind.APPROVAL

    def test_review_is_all_or_nothing(self) -> None:
        """One bad approval rolls back the whole review; an unknown operation is a KeyError."""
        ledger = self.ledger()
        good, bad = make_request("t1:a"), make_request("t1:b")
        wrong = dataclasses.replace(make_approval(bad, self.clock), intent_hash="f" * 64)
        with pytest.raises(errors.ApprovalMismatchError):
            ledger.record_review([good, bad], [make_approval(good, self.clock), wrong])
        with pytest.raises(KeyError):
            ledger.record_review([good], [make_approval(make_request("t9:x"), self.clock)])
        assert ledger.list() == []
        assert ledger.events() == []

    def test_review_conflicting_approval_with_same_key(self) -> None:
        """A different approval under the same key is refused rather than overwritten."""
        ledger = self.ledger()
        req = make_request()
        first = make_approval(req, self.clock, message="ok")
        ledger.record_review([req], [first])
        with pytest.raises(errors.ApprovalMismatchError):
            ledger.record_review([], [dataclasses.replace(first, message="changed")])
        assert ledger.approvals(req.operation_id) == [first]

    def test_withdraw_approval_returns_to_proposed(self) -> None:
        """Withdrawing sends APPROVED back to PROPOSED; the latest approval stays readable."""
        ledger = self.ledger()
        op = self.approved(ledger)
        back = ledger.withdraw_approval(op.operation_id, reason="expired")
        assert back.state is _S.PROPOSED
        latest = ledger.latest_approval(op.operation_id)
        assert latest is not None and latest.decision == "approve"
        assert ledger.events(operation_id=op.operation_id)[-1].detail == {"reason": "expired"}

    # ------------------------------------------------------------- claim

    def test_claim_moves_to_in_flight(self) -> None:
        """Claiming attempt 1 of an APPROVED operation makes it IN_FLIGHT, attempt 1."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        assert (op.state, op.attempt, op.claimed_by) == (_S.IN_FLIGHT, 1, "w1")
        stored = self.ledger().get(op.operation_id)
        assert stored is not None and stored.state is _S.IN_FLIGHT

    @pytest.mark.parametrize("attempt", [1, 2])
    def test_second_claim_loses(self, attempt: int) -> None:
        """A claim of an attempt already claimed, or not next, raises ClaimLostError."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        with pytest.raises(errors.ClaimLostError) as info:
            ledger.claim(op.operation_id, attempt=attempt, worker="w2")
        assert (info.value.current_attempt, info.value.current_state) == (1, "IN_FLIGHT")
        assert ledger.get(op.operation_id) == op

    def test_claim_beyond_budget(self) -> None:
        """Claiming past max_attempts raises ValueError and changes nothing."""
        ledger = self.ledger()
        op = self.in_flight(ledger, make_request(budget=Budget(max_attempts=1)))
        op = ledger.record_result(op.operation_id, attempt=1, state=_S.RETRY_WAIT)
        with pytest.raises(ValueError, match="budget exhausted"):
            ledger.claim(op.operation_id, attempt=2, worker="w1")
        assert ledger.get(op.operation_id) == op

    def test_claim_needs_approval_and_an_operation(self) -> None:
        """A PROPOSED operation cannot be claimed; an unknown one raises KeyError."""
        ledger = self.ledger()
        op = ledger.open(**open_fields(make_request()))
        with pytest.raises(errors.ClaimLostError):
            ledger.claim(op.operation_id, attempt=1, worker="w1")
        with pytest.raises(KeyError):
            ledger.claim("nope", attempt=1, worker="w1")

    # ----------------------------------------------------------- damaged rows

    def test_a_listing_goes_on_past_a_damaged_row_when_asked(self) -> None:
        """``list(damaged=...)`` returns the readable rows and names the damaged one."""
        ledger = self.ledger()
        kept = ledger.open(**open_fields(make_request("t1:c1")))
        broken = ledger.open(**open_fields(make_request("t1:c2")))
        other = ledger.open(**open_fields(make_request("t2:c1", thread_id="t2")))
        self.damage_arguments("main", broken.operation_id)
        with pytest.raises(errors.LedgerCorruptError):
            ledger.list(thread_id="t1")
        damaged: list[DamagedOperation] = []
        assert ledger.list(thread_id="t1", damaged=damaged) == [kept]
        assert [(d.operation_id, d.thread_id) for d in damaged] == [("t1:c2", "t1")]
        assert "intent hash" in damaged[0].reason
        everything: list[DamagedOperation] = []
        proposed = ledger.list(states=[_S.PROPOSED], tool="write_file", damaged=everything)
        assert proposed == [kept, other]
        assert [d.operation_id for d in everything] == ["t1:c2"]
        assert ledger.list(thread_id="t2", damaged=[]) == [other]

    def test_intent_neighbours_go_on_past_a_damaged_row_when_asked(self) -> None:
        """A damaged operation of the same intent is named, not raised, with ``damaged``."""
        ledger = self.ledger()
        same = {"path": "notes.txt", "content": "same"}
        first = ledger.open(**open_fields(make_request("t1:c1", args=same)))
        second = ledger.open(**open_fields(make_request("t2:c1", thread_id="t2", args=same)))
        self.damage_arguments("main", first.operation_id)
        with pytest.raises(errors.LedgerCorruptError):
            ledger.intent_neighbours("t3:c1", second.intent_hash)
        damaged: list[DamagedOperation] = []
        ops, tombs = ledger.intent_neighbours("t3:c1", second.intent_hash, damaged=damaged)
        assert (ops, tombs) == ([second], [])
        assert [(d.operation_id, d.thread_id) for d in damaged] == [("t1:c1", "t1")]

    # ----------------------------------------------------------- results

    def test_success_stores_receipt_and_reuse_is_counted(self) -> None:
        """SUCCEEDED keeps the receipt; handing it out again is verified and counted."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        receipt = make_receipt(op, self.clock)
        done = ledger.record_result(op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=receipt)
        assert (done.state, done.receipt, done.claimed_by) == (_S.SUCCEEDED, receipt, None)
        assert ledger.verified_receipt(done) == receipt
        assert ledger.verified_receipt(done, by_thread="another-thread") == receipt
        assert ledger.metrics().results_reused == 2
        events = ledger.events(operation_id=op.operation_id)
        reused = [e for e in events if e.kind is EventKind.RESULT_REUSED]
        assert [e.detail.get("thread_id") for e in reused] == [None, "another-thread"]

    def test_the_same_result_recorded_again_is_the_recorded_one(self) -> None:
        """A repeat of this attempt's own record (its commit's ack lost) returns it; nothing else.

        Found by the PostgreSQL fault campaign: after a cut during the
        result's commit, the worker recorded it again and exited 1 on a
        ClaimLostError naming its own SUCCEEDED. Any other result for that
        attempt (another receipt, another state) is still refused.
        """
        ledger = self.ledger()
        op = self.in_flight(ledger)
        receipt = make_receipt(op, self.clock)
        done = ledger.record_result(op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=receipt)
        events = len(ledger.events(operation_id=op.operation_id))
        again = ledger.record_result(
            op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=receipt
        )
        assert again == done
        assert len(ledger.events(operation_id=op.operation_id)) == events
        other = make_receipt(op, self.clock, result={"other": True})
        with pytest.raises(errors.ClaimLostError):
            ledger.record_result(op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=other)
        with pytest.raises(errors.ClaimLostError):
            ledger.record_result(op.operation_id, attempt=1, state=_S.UNKNOWN, error="timeout")
        assert ledger.get(op.operation_id) == done

    def test_stale_attempt_result_is_refused(self) -> None:
        """A late record_result of attempt 1 after attempt 2 was claimed is refused."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        ledger.record_result(op.operation_id, attempt=1, state=_S.RETRY_WAIT, error="503")
        second = ledger.claim(op.operation_id, attempt=2, worker="w2")
        with pytest.raises(errors.ClaimLostError) as info:
            ledger.record_result(
                op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=make_receipt(op, self.clock)
            )
        assert (info.value.attempt, info.value.current_attempt) == (1, 2)
        assert ledger.get(op.operation_id) == second

    def test_result_receipt_rules(self) -> None:
        """Only SUCCEEDED takes a receipt, only this operation's; a foreign intent is corrupt."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        receipt = make_receipt(op, self.clock)
        cases: list[tuple[OpState, Receipt | None, type[Exception]]] = [
            (_S.SUCCEEDED, None, ValueError),
            (_S.FAILED, receipt, ValueError),
            (_S.SUCCEEDED, dataclasses.replace(receipt, operation_id="x"), ValueError),
            (
                _S.SUCCEEDED,
                dataclasses.replace(receipt, intent_hash="e" * 64),
                errors.LedgerCorruptError,
            ),
            (_S.PROPOSED, None, ValueError),
        ]
        for state, bad, error in cases:
            with pytest.raises(error):
                ledger.record_result(op.operation_id, attempt=1, state=state, receipt=bad)
        assert ledger.get(op.operation_id) == op

    def test_retry_wait_keeps_next_attempt_at_and_error(self) -> None:
        """RETRY_WAIT stores when the next attempt may start and the last error."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        at = self.clock.now() + timedelta(seconds=7)
        ledger.record_result(
            op.operation_id, attempt=1, state=_S.RETRY_WAIT, error="429", next_attempt_at=at
        )
        stored = self.ledger().get(op.operation_id)
        assert stored is not None
        assert (stored.state, stored.next_attempt_at, stored.error) == (_S.RETRY_WAIT, at, "429")

    # ------------------------------------------------------- transitions

    def test_illegal_transition_changes_nothing(self) -> None:
        """A pair outside TRANSITIONS raises IllegalTransitionError naming both states."""
        ledger = self.ledger()
        op = ledger.open(**open_fields(make_request()))
        with pytest.raises(errors.IllegalTransitionError) as info:
            ledger.transition(op.operation_id, src=_S.PROPOSED, dst=_S.SUCCEEDED)
        assert (info.value.src, info.value.dst) == ("PROPOSED", "SUCCEEDED")
        assert ledger.get(op.operation_id) == op

    def test_transition_from_a_stale_state_loses(self) -> None:
        """A transition whose src no longer holds raises ClaimLostError."""
        ledger = self.ledger()
        op = self.approved(ledger)
        with pytest.raises(errors.ClaimLostError):
            ledger.transition(op.operation_id, src=_S.RETRY_WAIT, dst=_S.FAILED)
        with pytest.raises(ValueError, match="claim"):
            ledger.transition(op.operation_id, src=_S.APPROVED, dst=_S.IN_FLIGHT)
        assert ledger.get(op.operation_id) == op

    def test_unknown_reconciled_to_succeeded(self) -> None:
        """UNKNOWN settles to SUCCEEDED with a reconciled receipt; the attempt is kept."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        op = ledger.record_result(op.operation_id, attempt=1, state=_S.UNKNOWN, error="timeout")
        receipt = dataclasses.replace(make_receipt(op, self.clock), source="reconcile")
        done = ledger.transition(op.operation_id, src=_S.UNKNOWN, dst=_S.SUCCEEDED, receipt=receipt)
        assert (done.state, done.attempt, done.receipt) == (_S.SUCCEEDED, 1, receipt)

    # ---------------------------------------------------------- recovery

    def test_recover_in_flight_marks_unknown_durably(self) -> None:
        """IN_FLIGHT found on recovery becomes UNKNOWN with its attempt kept, per thread."""
        ledger = self.ledger()
        mine = self.in_flight(ledger, make_request("t1:a", thread_id="t1"))
        other = self.in_flight(ledger, make_request("t2:a", thread_id="t2"))
        recovered = self.ledger().recover_in_flight(thread_id="t1")
        assert [(o.operation_id, o.state, o.attempt) for o in recovered] == [
            (mine.operation_id, _S.UNKNOWN, 1)
        ]
        reopened = self.ledger()
        assert reopened.get(other.operation_id) == other
        event = reopened.events(operation_id=mine.operation_id)[-1]
        assert (event.src, event.dst) == (_S.IN_FLIGHT, _S.UNKNOWN)
        assert event.detail == {"reason": "found IN_FLIGHT on recovery"}

    def test_budget_and_deadline_survive_reopen(self) -> None:
        """Budget and deadline come back after a restart; a new max_attempts is ignored."""
        deadline = self.clock.now() + timedelta(minutes=5)
        req = make_request(budget=Budget(max_attempts=2, deadline_at=deadline))
        op = self.in_flight(self.ledger(), req)
        ledger = self.ledger()
        ledger.recover_in_flight()
        again = ledger.open(**open_fields(dataclasses.replace(req, budget=Budget(max_attempts=50))))
        assert (again.attempt, again.budget.max_attempts) == (1, 2)
        assert again.budget.deadline_at == deadline
        assert again.operation_id == op.operation_id

    def test_verified_receipt_refuses_tampered_operation(self) -> None:
        """A receipt is not handed out for arguments that do not match the intent hash."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        done = ledger.record_result(
            op.operation_id, attempt=1, state=_S.SUCCEEDED, receipt=make_receipt(op, self.clock)
        )
        tampered = dataclasses.replace(done, args={"path": "/etc/passwd", "content": ""})
        with pytest.raises(errors.LedgerCorruptError):
            ledger.verified_receipt(tampered)
        assert ledger.metrics().results_reused == 0

    # ------------------------------------------------- events and metrics

    def test_events_are_ordered_and_filtered(self) -> None:
        """Events come back in append order; thread and operation filters apply."""
        ledger = self.ledger()
        self.in_flight(ledger, make_request("t1:a", thread_id="t1"))
        self.approved(ledger, make_request("t2:a", thread_id="t2"))
        ledger.note("t2:a", {"seen": True})
        seqs = [e.seq for e in ledger.events()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) == 6
        t1 = [(e.src, e.dst) for e in ledger.events(thread_id="t1")]
        assert t1 == [(None, _S.PROPOSED), (_S.PROPOSED, _S.APPROVED), (_S.APPROVED, _S.IN_FLIGHT)]
        last = ledger.events(operation_id="t2:a")[-1]
        assert (last.kind, last.src, last.dst) == (EventKind.NOTE, None, None)
        assert last.detail == {"seen": True}

    def test_metrics(self) -> None:
        """Counts, first-attempt success rate, mean attempts and reconciliation age."""
        ledger = self.ledger()
        a = self.in_flight(ledger, make_request("t1:a"))
        ledger.record_result(
            "t1:a", attempt=1, state=_S.SUCCEEDED, receipt=make_receipt(a, self.clock)
        )
        b = self.in_flight(ledger, make_request("t1:b"))
        ledger.record_result("t1:b", attempt=1, state=_S.UNKNOWN)
        ledger.transition(b.operation_id, src=_S.UNKNOWN, dst=_S.NEEDS_RECONCILIATION)
        ledger.open(**open_fields(make_request("t1:c")))
        self.clock.advance(30)
        m = ledger.metrics()
        assert (m.operations, m.by_state["SUCCEEDED"], m.by_state["PROPOSED"]) == (3, 1, 1)
        assert (m.first_attempt_success_rate, m.mean_attempts, m.open_unknowns) == (1.0, 1.0, 1)
        assert m.oldest_reconciliation_age_s == 30.0

    # -------------------------------------------------- store primitives

    def test_intent_neighbours_reads_the_id_and_the_intent(self) -> None:
        """Operations and tombstones under the id or of the intent, each list in listing order."""
        ledger = self.ledger()
        same = {"path": "a.txt", "content": "x"}
        first = make_request("t1:c1", args=same)
        ledger.record_review([first], [make_approval(first, self.clock, decision="reject")])
        self.clock.advance(1)
        second = make_request("t1:c2", args=same)
        other = make_request("t1:c3", args={"path": "b.txt", "content": "y"})
        ledger.open(**open_fields(second))
        self.clock.advance(1)
        ledger.open(**open_fields(other))

        def ids(ops: list[Operation]) -> list[str]:
            return [op.operation_id for op in ops]

        ops, tombs = ledger.intent_neighbours("t1:c3", first.intent_hash)
        assert (ids(ops), tombs) == (["t1:c1", "t1:c2", "t1:c3"], [])
        assert ops == [*ledger.list(intent_hash=first.intent_hash), ledger.get("t1:c3")]
        assert ids(ledger.intent_neighbours("t9:none", other.intent_hash)[0]) == ["t1:c3"]
        assert ledger.intent_neighbours("t9:none", "0" * 64) == ([], [])
        self.clock.advance(60)
        with ledger.store.transaction() as tx:
            now = self.clock.now()
            assert tx.compact_operations(finished_before=now, now=now) == 1  # the rejected one
        ops, tombs = ledger.intent_neighbours("t9:none", first.intent_hash)
        assert ids(ops) == ["t1:c2"]
        assert tombs == ledger.operation_tombstones(intent_hash=first.intent_hash)
        assert [t.operation_id for t in tombs] == ["t1:c1"]
        ops, tombs = ledger.intent_neighbours("t1:c1", other.intent_hash)
        assert (ids(ops), [t.operation_id for t in tombs]) == (["t1:c3"], ["t1:c1"])

    def test_store_compare_and_set_mismatch_writes_nothing(self) -> None:
        """A compare-and-set that does not match returns None and writes nothing."""
        ledger = self.ledger()
        op = ledger.open(**open_fields(make_request()))
        change = Change(state=_S.APPROVED, updated_at=self.clock.now())
        with ledger.store.transaction() as tx:
            assert tx.compare_and_set(op.operation_id, Expect(states=frozenset()), change) is None
            miss = Expect(states=frozenset({_S.PROPOSED}), attempt=3)
            assert tx.compare_and_set(op.operation_id, miss, change) is None
        assert ledger.get(op.operation_id) == op

    def test_store_transaction_rolls_back_on_error(self) -> None:
        """An exception inside a transaction discards its writes."""
        ledger = self.ledger()
        op = ledger.open(**open_fields(make_request()))
        with pytest.raises(RuntimeError), ledger.store.transaction() as tx:
            tx.append_event(note_event(op, self.clock))
            assert tx.put_approval(make_approval(op, self.clock)) is WriteOnce.INSERTED
            raise RuntimeError("boom")
        assert len(ledger.events()) == 1
        assert ledger.approvals(op.operation_id) == []
