"""The ledger conformance suite's threads, leases and attempts cut by a death.

``LeaseConformance`` is part of ``LedgerConformance``
(``testing/ledger_conformance.py``), which every store suite subclasses; it
is not meant to be subclassed alone.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from effectgate import errors
from effectgate._clock import FakeClock
from effectgate.ledger import (
    MAX_RECOVERIES,
    Budget,
    Expect,
    Ledger,
    Operation,
    OpState,
)
from effectgate.ledger._store import Change
from effectgate.testing._ledger_fixtures import (
    StoreSuite,
    dead_worker_id,
    make_request,
)

__all__ = ["LeaseConformance"]

_S = OpState


class LeaseConformance(StoreSuite):
    """Thread records, leases, and the recovery of attempts whose worker died or lapsed."""

    # ------------------------------------------------ threads and leases

    def test_thread_record_is_write_once(self) -> None:
        """The first input of a thread is kept; a second record returns it."""
        ledger = self.ledger()
        first = ledger.record_thread("t1", {"goal": "a"}, {"model": "m"})
        assert ledger.record_thread("t1", {"goal": "b"}) == first
        assert self.ledger().list_threads() == [first]

    def test_lease_refused_then_taken_over_with_higher_token(self) -> None:
        """A live lease refuses a second owner; once expired it moves with a higher token."""
        ledger = self.ledger()
        lease = ledger.acquire_lease("t1", "a", timedelta(seconds=10))
        with pytest.raises(errors.ThreadBusyError) as info:
            ledger.acquire_lease("t1", "b", 10)
        assert info.value.owner == "a"
        assert ledger.acquire_lease("t1", "a", 10).token == lease.token
        self.clock.advance(11)
        taken = ledger.acquire_lease("t1", "b", 10)
        assert (taken.owner, taken.token) == ("b", lease.token + 1)
        with pytest.raises(errors.ThreadBusyError):
            ledger.renew_lease(lease, 10)

    def test_lease_release_frees_it(self) -> None:
        """A released lease can be taken at once; releasing a lost lease does nothing."""
        ledger = self.ledger()
        lease = ledger.acquire_lease("t1", "a", 60)
        ledger.release_lease(lease)
        taken = ledger.acquire_lease("t1", "b", 60)
        ledger.release_lease(lease)
        assert ledger.renew_lease(taken, 60).owner == "b"

    def test_a_lease_given_up_is_free_by_a_clock_that_runs_behind(self) -> None:
        """Released or broken by a runner whose clock is ahead, a lease is free by every clock.

        Two runners' clocks disagree a little (two estimates of the database
        server's time); a lease stored as expiring at the releaser's "now"
        looked held to the next runner for that little while.
        """
        ahead = FakeClock(self.clock.now() + timedelta(milliseconds=400))
        releaser = Ledger(self.make_store("main"), clock=ahead)
        self._opened.append(releaser)
        ledger = self.ledger()
        lease = releaser.acquire_lease("t1", "a", 60)
        releaser.release_lease(lease)
        taken = ledger.acquire_lease("t1", "b", 60)
        assert (taken.owner, taken.token) == ("b", lease.token + 1)
        releaser.break_lease("t1", by="carol", reason="b's host is gone")
        assert ledger.acquire_lease("t1", "c", 60).owner == "c"

    def test_lease_broken_by_hand_is_fenced_and_audited(self) -> None:
        """A broken lease is free at once, its old holder fenced off, the act kept as an event."""
        ledger = self.ledger()
        held = ledger.acquire_lease("t1", "far-host", 3600)
        with pytest.raises(ValueError, match="reason"):
            ledger.break_lease("t1", by="carol", reason=" ")
        assert self.ledger().thread_events("t1") == []
        was = ledger.break_lease("t1", by="carol", reason="far-host is gone")
        assert was == held
        (event,) = self.ledger().thread_events("t1")
        assert (event.kind, event.actor, event.at) == ("lease_broken", "carol", self.clock.now())
        assert (event.detail["reason"], event.detail["owner"]) == ("far-host is gone", "far-host")
        with pytest.raises(errors.ThreadBusyError):
            ledger.renew_lease(held, 60)
        assert ledger.acquire_lease("t1", "me", 60).token == held.token + 2
        with pytest.raises(KeyError):
            ledger.break_lease("t2", by="carol", reason="no such lease")

    def test_store_lease_compare_and_set_matches_the_whole_row(self) -> None:
        """compare_and_set_lease writes only over the exact lease expected, and commits it."""
        ledger = self.ledger()
        store = ledger.store
        held = ledger.acquire_lease("t1", "a", 60)
        later = dataclasses.replace(held, expires_at=held.expires_at + timedelta(seconds=30))
        for wrong in (
            dataclasses.replace(held, owner="b"),
            dataclasses.replace(held, token=held.token + 1),
            dataclasses.replace(held, expires_at=held.expires_at - timedelta(milliseconds=1)),
        ):
            assert not store.compare_and_set_lease(later, expected=wrong)
        assert not store.compare_and_set_lease(
            dataclasses.replace(later, thread_id="t2"),
            expected=dataclasses.replace(held, thread_id="t2"),
        )  # no row: nothing inserted
        with self.make_store("main").read() as r:
            assert r.get_lease("t1") == held  # the row was left as it was
        assert store.compare_and_set_lease(later, expected=held)
        with self.make_store("main").read() as r:  # another connection sees it committed
            assert r.get_lease("t1") == later
            assert r.get_lease("t2") is None

    def test_a_lease_retaken_after_release_follows_the_full_rule(self) -> None:
        """Taken again by its last owner: same token; moved on meanwhile: refused or fenced.

        A ledger remembers the lease it gave up and re-takes it by one
        compare-and-set against it; whatever happened to the row in between
        (another runner took it, a person broke it) must give what the full
        rule gives, never the remembered token.
        """
        ledger, other = self.ledger(), self.ledger()
        first = ledger.acquire_lease("t1", "a", 60)
        ledger.release_lease(first)
        again = ledger.acquire_lease("t1", "a", 60)
        assert (again.owner, again.token) == ("a", first.token)
        assert other.acquire_lease("t1", "a", 60) == again  # what the row holds
        ledger.release_lease(again)
        taken = other.acquire_lease("t1", "b", 60)  # b takes it while a remembers it
        assert taken.token == first.token + 1
        with pytest.raises(errors.ThreadBusyError):
            ledger.acquire_lease("t1", "a", 60)
        other.release_lease(taken)
        back = ledger.acquire_lease("t1", "a", 60)
        assert (back.owner, back.token) == ("a", taken.token + 1)
        ledger.release_lease(back)
        other.break_lease("t1", by="carol", reason="test")
        after = ledger.acquire_lease("t1", "a", 60)
        assert (after.owner, after.token) == ("a", back.token + 2)
        with self.make_store("main").read() as r:
            assert r.get_lease("t1") == after

    def test_live_attempt_of_another_thread_survives_recovery(self) -> None:
        """recover_in_flight leaves an attempt whose worker still holds its thread's lease."""
        ledger = self.ledger()
        op = self.approved(ledger, make_request("key:x", thread_id="t1"))
        ledger.acquire_lease("t2", "w2", 30)
        ledger.claim(op.operation_id, attempt=1, worker="w2", thread_id="t2")
        ledger.acquire_lease("t1", "w1", 30)
        assert self.ledger().recover_in_flight(thread_id="t1", worker="w1") == []
        self.clock.advance(31)  # w2 stopped renewing: its attempt is abandoned now
        (recovered,) = self.ledger().recover_in_flight(thread_id="t1", worker="w1")
        assert (recovered.state, recovered.attempt) == (_S.UNKNOWN, 1)

    # ------------------------------------------ attempts cut by a death

    def _die_in(self, ledger: Ledger, op: Operation, *, via_recover_attempt: bool) -> Operation:
        """Claim ``op``'s next attempt as a worker proven gone, then recover it to UNKNOWN."""
        claimed = ledger.claim(op.operation_id, attempt=op.attempt + 1, worker=dead_worker_id())
        if via_recover_attempt:
            return ledger.recover_attempt(
                op.operation_id, attempt=claimed.attempt, worker="w9", reason="worker died"
            )
        (recovered,) = ledger.recover_in_flight(thread_id=op.thread_id, worker="w9")
        return recovered

    @pytest.mark.parametrize("via_recover_attempt", [False, True])
    def test_an_attempt_whose_worker_died_is_given_back(self, via_recover_attempt: bool) -> None:
        """An attempt cut short by its worker's death is not charged to max_attempts.

        With ``max_attempts=1``, a claim by a worker proven gone, recovered to
        UNKNOWN, leaves one attempt still to run (``recoveries`` 1, kept across a
        reopen, named in the event), where it used to exhaust the budget.
        """
        ledger = self.ledger()
        op = self.approved(ledger, make_request(budget=Budget(max_attempts=1)))
        op = self._die_in(ledger, op, via_recover_attempt=via_recover_attempt)
        assert (op.state, op.attempt, op.recoveries, op.attempts_allowed) == (_S.UNKNOWN, 1, 1, 2)
        event = ledger.events(operation_id=op.operation_id)[-1]
        assert (event.dst, event.detail["attempt_given_back"]) == (_S.UNKNOWN, True)
        op = ledger.transition(op.operation_id, src=_S.UNKNOWN, dst=_S.RETRY_WAIT)
        again = ledger.claim(op.operation_id, attempt=2, worker="w1")
        assert (again.state, again.attempt, again.recoveries) == (_S.IN_FLIGHT, 2, 1)
        assert self.ledger().get(op.operation_id) == again

    def test_attempts_given_back_stop_at_max_recoveries(self) -> None:
        """A call that kills its worker every time gets MAX_RECOVERIES attempts back, then none."""
        ledger = self.ledger()
        op = self.approved(ledger, make_request(budget=Budget(max_attempts=1)))
        for n in range(1, MAX_RECOVERIES + 2):
            op = self._die_in(ledger, op, via_recover_attempt=n % 2 == 0)
            assert op.recoveries == min(n, MAX_RECOVERIES)
            if op.attempt < op.attempts_allowed:
                op = ledger.transition(op.operation_id, src=_S.UNKNOWN, dst=_S.RETRY_WAIT)
        assert (op.state, op.attempt, op.attempts_allowed) == (
            _S.UNKNOWN,
            MAX_RECOVERIES + 1,
            MAX_RECOVERIES + 1,
        )
        op = ledger.transition(op.operation_id, src=_S.UNKNOWN, dst=_S.RETRY_WAIT)
        with pytest.raises(ValueError, match="budget exhausted"):
            ledger.claim(op.operation_id, attempt=op.attempt + 1, worker="w1")

    def test_an_attempt_abandoned_by_a_lapsed_lease_is_charged(self) -> None:
        """A worker not proven gone (its lease lapsed: stopped, another host) keeps its charge."""
        ledger = self.ledger()
        op = self.approved(ledger, make_request(budget=Budget(max_attempts=1)))
        ledger.acquire_lease("t1", "w2", 30)
        ledger.claim(op.operation_id, attempt=1, worker="w2")
        self.clock.advance(31)
        (op,) = ledger.recover_in_flight(thread_id="t1", worker="w1")
        assert (op.state, op.recoveries, op.attempts_allowed) == (_S.UNKNOWN, 0, 1)
        assert "attempt_given_back" not in ledger.events(operation_id=op.operation_id)[-1].detail

    def test_store_refuses_recoveries_that_do_not_grow_by_one(self) -> None:
        """The store's guard: ``recoveries`` moves only up, one at a time."""
        ledger = self.ledger()
        op = self.in_flight(ledger)
        expect = Expect(states=frozenset({_S.IN_FLIGHT}), attempt=1)
        jump = Change(state=_S.UNKNOWN, updated_at=self.clock.now(), recoveries=2)
        with pytest.raises(errors.LedgerError), ledger.store.transaction() as tx:
            tx.compare_and_set(op.operation_id, expect, jump)
        assert self.ledger().get(op.operation_id) == op
