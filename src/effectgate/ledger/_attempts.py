"""The attempt half of ``Ledger``: claim, record, transition, recover, reuse.

Every state change here is one durable transaction holding a compare-and-set
and its event; the "result reused" audit event alone skips its own fsync.
Claims and results are fenced by the attempt number.
"""

from __future__ import annotations

import builtins
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from effectgate._clock import to_seconds
from effectgate._intent import intent_hash as compute_intent_hash
from effectgate._process import owner_is_gone
from effectgate.errors import ClaimLostError, LedgerCorruptError, OperationBusyError
from effectgate.ledger._backoff import full_jitter_delay
from effectgate.ledger._model import (
    MAX_RECOVERIES,
    EventKind,
    Operation,
    OpState,
    Receipt,
    check_transition,
)
from effectgate.ledger._store import Change, Expect, NewEvent, StoreReader, StoreTransaction
from effectgate.ledger._threads import ThreadsMixin

__all__ = ["AttemptsMixin", "verified"]

_S = OpState
_CLAIMABLE = frozenset({_S.APPROVED, _S.RETRY_WAIT})
_RESULT_STATES = frozenset({_S.SUCCEEDED, _S.FAILED, _S.RETRY_WAIT, _S.UNKNOWN})
_RECOVERED = {"reason": "found IN_FLIGHT on recovery"}
_BEFORE_ANY_ATTEMPT = frozenset({_S.PROPOSED, _S.APPROVED, _S.REJECTED})
"""States an operation only holds before its first attempt: attempt 0."""
_AFTER_AN_ATTEMPT = frozenset(
    {_S.IN_FLIGHT, _S.SUCCEEDED, _S.RETRY_WAIT, _S.UNKNOWN, _S.NEEDS_RECONCILIATION}
)
"""States an operation only reaches through a claim: attempt >= 1."""


def _damage(op: Operation) -> str | None:
    """What makes a decoded row impossible under the transition table, or ``None``.

    Each column may be valid on its own while the row as a whole could never
    have been written by the protocol (an edited or half-restored file): a
    SUCCEEDED row without a receipt, a receipt on an APPROVED row (which
    would be dispatched again), an attempt count that no claim produced.
    """
    state, attempt, receipt = op.state, op.attempt, op.receipt
    if state is _S.SUCCEEDED and receipt is None:
        return "state SUCCEEDED without a receipt"
    if receipt is not None and state is not _S.SUCCEEDED:
        return f"state {state.value} carries a receipt; only SUCCEEDED does"
    if op.recoveries > MAX_RECOVERIES:
        return f"recoveries {op.recoveries} exceed the most ever given back ({MAX_RECOVERIES})"
    if op.recoveries > attempt:
        return f"{op.recoveries} attempts given back, but only {attempt} were ever started"
    if attempt > op.attempts_allowed:
        return (
            f"attempt {attempt} exceeds the budget's max_attempts {op.budget.max_attempts}"
            f" + {op.recoveries} recoveries"
        )
    if state in _BEFORE_ANY_ATTEMPT and attempt != 0:
        return f"state {state.value} at attempt {attempt}: it is only held before any attempt"
    if state in _AFTER_AN_ATTEMPT and attempt == 0:
        return f"state {state.value} at attempt 0: it is only reached through a claimed attempt"
    if receipt is not None and receipt.attempt > attempt:
        return f"receipt of attempt {receipt.attempt}, but only {attempt} attempt(s) started"
    if state is _S.IN_FLIGHT and not op.claimed_by:
        return "state IN_FLIGHT without the worker that claimed it"
    return None


def verified(op: Operation) -> Operation:
    """Re-check a loaded row: its intent hash, its receipt's identity, its state's consistency.

    Args:
        op: an operation as a store decoded it.

    Returns:
        ``op`` itself.

    Raises:
        LedgerCorruptError: the intent hash does not match the stored tool and
            arguments, the receipt belongs to another operation, or the row
            is impossible under the transition table (see ``_damage``). The
            message names the operation and says what is wrong; nothing is
            dispatched from such a row.
    """
    oid = op.operation_id
    if op.intent_checked:
        expected = op.intent_hash  # the decoder hashed the stored text itself
    else:
        try:
            expected = compute_intent_hash(op.tool, op.tool_version, op.args)
        except (ValueError, TypeError) as exc:
            raise LedgerCorruptError(
                f"stored arguments cannot be hashed ({exc})", operation_id=oid
            ) from exc
    if expected != op.intent_hash:
        raise LedgerCorruptError(
            f"stored intent hash {op.intent_hash[:12]}… does not match the stored tool and "
            f"arguments, which hash to {expected[:12]}…",
            operation_id=oid,
        )
    receipt = op.receipt
    if receipt is not None and (receipt.operation_id, receipt.intent_hash) != (oid, expected):
        raise LedgerCorruptError(
            f"stored receipt belongs to operation {receipt.operation_id!r} with intent "
            f"{receipt.intent_hash[:12]}…, not to this operation",
            operation_id=oid,
        )
    damage = _damage(op)
    if damage is not None:
        raise LedgerCorruptError(f"damaged row: {damage}", operation_id=oid)
    return op


def _detail(
    detail: Mapping[str, Any] | None,
    *,
    error: str | None = None,
    next_attempt_at: datetime | None = None,
    receipt: Receipt | None = None,
) -> dict[str, Any]:
    out = dict(detail or {})
    if error is not None:
        out.setdefault("error", error)
    if next_attempt_at is not None:
        out.setdefault("next_attempt_at", next_attempt_at.isoformat())
    if receipt is not None:
        out.setdefault("receipt_source", receipt.source)
        if receipt.reference is not None:
            out.setdefault("reference", receipt.reference)
    return out


def _check_receipt(operation_id: str, state: OpState, receipt: Receipt | None) -> None:
    if state is _S.SUCCEEDED and receipt is None:
        raise ValueError(f"operation {operation_id!r}: SUCCEEDED needs a receipt")
    if receipt is None:
        return
    if state is not _S.SUCCEEDED:
        raise ValueError(f"operation {operation_id!r}: only SUCCEEDED carries a receipt")
    if receipt.operation_id != operation_id:
        raise ValueError(
            f"operation {operation_id!r}: receipt is for operation {receipt.operation_id!r}"
        )


class AttemptsMixin(ThreadsMixin):
    """Dispatch-side operations of ``Ledger``."""

    _rng: random.Random

    def claim(
        self, operation_id: str, *, attempt: int, worker: str, thread_id: str | None = None
    ) -> Operation:
        """Claim attempt ``attempt`` by compare-and-set, committed durably before return.

        Succeeds only if the operation is APPROVED or RETRY_WAIT with
        ``attempt - 1`` attempts used; it becomes IN_FLIGHT with ``attempt``
        used and ``claimed_by = worker``. Of N concurrent claimers (threads
        or processes) exactly one wins. Call the tool only after this returns
        (IN_FLIGHT is fsync'd before the side effect starts).

        Args:
            operation_id: the operation.
            attempt: the attempt to start, 1-based; the fencing token of this attempt.
            worker: who runs it, kept in ``claimed_by`` and the event.
            thread_id: the thread whose run makes the attempt, when it is not the
                operation's own (a business-keyed operation shared by threads);
                kept in the event. Recovery reads that thread's lease to tell a
                live attempt from an abandoned one (``recover_in_flight``).

        Returns:
            The operation, IN_FLIGHT.

        Raises:
            ClaimLostError: another worker claimed first, or the state or attempt moved.
            ValueError: ``attempt`` exceeds ``Operation.attempts_allowed`` ("budget exhausted").
            KeyError: there is no such operation.

        Note:
            Fencing tokens: Kleppmann, *How to do distributed locking*, 2016.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        now = self._now()
        expect = Expect(states=_CLAIMABLE, attempt=attempt - 1, attempts_allowed_at_least=attempt)
        change = Change(state=_S.IN_FLIGHT, updated_at=now, attempt=attempt, claimed_by=worker)
        with self._store.transaction() as tx:
            done = tx.compare_and_set(operation_id, expect, change)
            if done is None:
                raise self._claim_refusal(tx, operation_id, attempt)
            src, op = done
            op = verified(op)
            facts = {"worker": worker}
            if thread_id is not None and thread_id != op.thread_id:
                facts["thread_id"] = thread_id
            self._event(tx, op, EventKind.TRANSITION, now, facts, src=src, dst=_S.IN_FLIGHT)
        return op

    def _claim_refusal(self, tx: StoreReader, operation_id: str, attempt: int) -> Exception:
        cur = self._require(tx, operation_id)
        if cur.state in _CLAIMABLE and cur.attempt == attempt - 1:
            return ValueError(
                f"operation {operation_id!r}: budget exhausted: attempt {attempt} exceeds "
                f"max_attempts {cur.budget.max_attempts} + {cur.recoveries} recoveries"
            )
        return ClaimLostError(
            operation_id=operation_id,
            attempt=attempt,
            current_attempt=cur.attempt,
            current_state=cur.state.value,
        )

    def record_result(
        self,
        operation_id: str,
        *,
        attempt: int,
        state: OpState,
        receipt: Receipt | None = None,
        error: str | None = None,
        next_attempt_at: datetime | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Record how attempt ``attempt`` ended, committed durably before return.

        Fenced: accepted only while the operation is IN_FLIGHT with exactly
        this attempt, so a stale attempt's late answer is refused. The refused
        answer is not thrown away: a ``note`` event with ``late_result`` (the
        state it reported), ``fenced_attempt``, its error and its result is
        committed, as evidence for whoever reconciles the operation.

        Args:
            operation_id: the operation.
            attempt: the attempt that ran (the fencing token ``claim`` returned).
            state: SUCCEEDED, FAILED (known not applied), RETRY_WAIT (known not
                applied, retry later) or UNKNOWN (may have applied).
            receipt: required for SUCCEEDED and only allowed there.
            error: text for people; kept as the operation's last error.
            next_attempt_at: aware time before which no new attempt starts.
            detail: extra JSON-compatible facts for the event.

        Returns:
            The operation in ``state``.

        Raises:
            ClaimLostError: the operation is not IN_FLIGHT with this attempt
                (the late answer is kept as a ``note`` event).
            ValueError: ``state`` is not an outcome, or the receipt is missing,
                misplaced or for another operation.
            LedgerCorruptError: the receipt's intent hash is not the operation's.
            KeyError: there is no such operation.
        """
        if state not in _RESULT_STATES:
            raise ValueError(f"{state} is not an attempt outcome ({', '.join(_RESULT_STATES)})")
        _check_receipt(operation_id, state, receipt)
        now = self._now()
        expect = Expect(
            states=frozenset({_S.IN_FLIGHT}),
            attempt=attempt,
            intent_hash=None if receipt is None else receipt.intent_hash,
        )
        change = Change(
            state=state,
            updated_at=now,
            receipt=receipt,
            error=error,
            next_attempt_at=next_attempt_at,
        )
        facts = _detail(detail, error=error, next_attempt_at=next_attempt_at, receipt=receipt)
        lost: ClaimLostError | None = None
        with self._store.transaction() as tx:
            try:
                return self._cas(tx, operation_id, expect, change, facts, attempt=attempt)
            except ClaimLostError as exc:
                cur = self._require(tx, operation_id)
                if _already_recorded(cur, attempt, state, receipt, error):
                    # This very result, committed by an earlier try whose
                    # commit acknowledgement was lost (a cut connection, a
                    # server restart): the outcome is known, not contested.
                    # Found by the PostgreSQL fault campaign: the worker
                    # exited 1 on a ClaimLostError naming its own SUCCEEDED.
                    return cur
                # Fenced off: the attempt may still have acted. Its answer is
                # evidence for whoever settles the operation, never its state.
                lost = exc
                late = {**facts, "late_result": state.value, "fenced_attempt": attempt}
                if receipt is not None:
                    late["result"] = receipt.result
                self._event(tx, cur, EventKind.NOTE, now, late)
        assert lost is not None
        raise lost

    def transition(
        self,
        operation_id: str,
        *,
        src: OpState,
        dst: OpState,
        receipt: Receipt | None = None,
        error: str | None = None,
        next_attempt_at: datetime | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Move an operation from ``src`` to ``dst`` by compare-and-set, durably.

        For every change that is not a claim or an attempt's own result:
        reconciliation (UNKNOWN -> SUCCEEDED), parking (UNKNOWN ->
        NEEDS_RECONCILIATION), a human verdict, a spent budget
        (RETRY_WAIT/APPROVED -> FAILED). The attempt count is kept.

        Args:
            operation_id: the operation.
            src: the state the caller saw; the change applies only if it still holds.
            dst: the new state; never IN_FLIGHT (use ``claim``).
            receipt: required when ``dst`` is SUCCEEDED, refused otherwise.
            error: text for people; kept as the operation's last error.
            next_attempt_at: aware time before which no new attempt starts (``None`` clears).
            detail: extra JSON-compatible facts for the event.

        Returns:
            The operation in ``dst``.

        Raises:
            IllegalTransitionError: ``src -> dst`` is not in ``TRANSITIONS``.
            ClaimLostError: the operation is no longer in ``src``.
            ValueError: ``dst`` is IN_FLIGHT, or the receipt is missing or misplaced.
            LedgerCorruptError: the receipt's intent hash is not the operation's.
            KeyError: there is no such operation.
        """
        check_transition(operation_id, src, dst)
        if dst is _S.IN_FLIGHT:
            raise ValueError("an attempt starts only through claim(), which fences it")
        _check_receipt(operation_id, dst, receipt)
        now = self._now()
        expect = Expect(
            states=frozenset({src}), intent_hash=None if receipt is None else receipt.intent_hash
        )
        change = Change(
            state=dst, updated_at=now, receipt=receipt, error=error, next_attempt_at=next_attempt_at
        )
        facts = _detail(detail, error=error, next_attempt_at=next_attempt_at, receipt=receipt)
        with self._store.transaction() as tx:
            return self._cas(tx, operation_id, expect, change, facts)

    def withdraw_approval(self, operation_id: str, *, reason: str) -> Operation:
        """Send an APPROVED operation back to PROPOSED, e.g. because its approval expired.

        Raises:
            ClaimLostError: the operation is no longer APPROVED.
            KeyError: there is no such operation.
        """
        return self.transition(
            operation_id, src=_S.APPROVED, dst=_S.PROPOSED, detail={"reason": reason}
        )

    def recover_in_flight(
        self, *, thread_id: str | None = None, worker: str | None = None
    ) -> builtins.list[Operation]:
        """Turn every abandoned IN_FLIGHT attempt (of one thread, or all) into UNKNOWN.

        Call it on start-up, while holding the thread's lease. An attempt
        found IN_FLIGHT is recovered only when its worker can no longer be
        running it (``attempt_holder`` returns ``None``): its outcome is then
        unknown, never "not done", and the attempt count is kept.
        A live attempt (another thread's runner mid-request on a shared,
        business-keyed operation) is left alone: its worker records its own
        result, and whoever needs the operation waits for it. Attempts
        ``worker`` claimed itself are left to the caller, which alone knows
        whether its own calls returned. One durable transaction; it reads
        only IN_FLIGHT rows (a partial index), so its cost does not grow with
        the ledger.

        Args:
            thread_id: only this thread's operations; ``None`` for all.
            worker: the caller's worker id (the holder of ``thread_id``'s
                lease), or ``None`` for a caller that is no worker.

        Returns:
            The recovered operations, now UNKNOWN; live attempts are not in it.
        """
        # Read first: nearly always nothing is IN_FLIGHT, and an empty write
        # transaction would still cost a durable commit on every resume.
        with self._store.read(single=True) as r:
            if not r.list_operations(thread_id=thread_id, states=[_S.IN_FLIGHT]):
                return []
        now = self._now()
        recovered: builtins.list[Operation] = []
        with self._store.transaction() as tx:
            for found in tx.list_operations(thread_id=thread_id, states=[_S.IN_FLIGHT]):
                op = verified(found)
                if op.claimed_by == worker and worker is not None:
                    continue
                if self._holder(tx, op, worker, now) is not None:
                    continue
                expect = Expect(states=frozenset({_S.IN_FLIGHT}), attempt=op.attempt)
                change, detail = _abandoned(op, now, dict(_RECOVERED))
                recovered.append(self._cas(tx, op.operation_id, expect, change, detail))
        return recovered

    def attempt_holder(self, op: Operation, *, worker: str | None = None) -> str | None:
        """Say who may still be running ``op``'s IN_FLIGHT attempt, or ``None`` if nobody can.

        The one rule recovery follows (``recover_in_flight``, ``recover_attempt``).
        The attempt's worker ``W`` ran it for thread ``T`` (the claim's
        ``thread_id``, else the operation's). It is abandoned when ``W`` is
        proven gone (``effectgate._process.owner_is_gone``), or ``T``'s lease
        is absent or expired (no live runner holds ``T``), or ``worker`` (the
        caller) holds ``T``'s lease now: it took ``T`` over from ``W``, which
        fencing has cut off. While ``W`` holds ``T``'s lease, or a third
        runner does (whose own start-up recovery settles the attempt), the
        attempt is live. A worker that is only silent (stopped, suspended)
        is not gone: once its lease expired its attempt is taken as
        abandoned, but its outcome stays unknown (see ``_process``).

        Args:
            op: the operation, IN_FLIGHT.
            worker: the caller's worker id, or ``None``.

        Returns:
            A sentence naming the live holder, or ``None`` when the attempt is
            abandoned (or ``op`` is no longer IN_FLIGHT).
        """
        with self._store.read() as r:
            cur = r.get_operation(op.operation_id)
            if cur is None or cur.state is not _S.IN_FLIGHT or cur.attempt != op.attempt:
                return None
            return self._holder(r, verified(cur), worker, self._now())

    def _holder(
        self, r: StoreReader, op: Operation, worker: str | None, now: datetime
    ) -> str | None:
        claimer = op.claimed_by
        if not claimer or owner_is_gone(claimer):
            return None
        thread = _claim_thread(r, op)
        lease = r.get_lease(thread)
        if lease is None or lease.expires_at <= now:
            return None
        if lease.owner == claimer:
            return (
                f"operation {op.operation_id!r} ({op.tool}) is in flight in thread {thread!r} "
                f"under worker {claimer}, which holds that thread and may still be running"
            )
        if worker is not None and lease.owner == worker:
            return None
        return (
            f"operation {op.operation_id!r} ({op.tool}) is in flight in thread {thread!r} "
            f"under worker {claimer}, which may still be running; thread {thread!r} is now "
            f"held by {lease.owner}, whose recovery settles it"
        )

    def recover_attempt(
        self, operation_id: str, *, attempt: int, worker: str, reason: str
    ) -> Operation:
        """Turn one abandoned IN_FLIGHT attempt into UNKNOWN, or refuse a live one.

        For a dispatcher that meets an IN_FLIGHT operation it needs. The check
        (``attempt_holder``) and the compare-and-set on the attempt are one
        transaction, so a claim or a result landing in between is never
        overwritten. An attempt ``worker`` claimed itself counts as over: the
        caller must pass only attempts whose call has returned (or never
        started) in its own process.

        Args:
            operation_id: the operation.
            attempt: the IN_FLIGHT attempt the caller saw (the fencing token).
            worker: the caller's worker id.
            reason: why, for the event.

        Returns:
            The operation, now UNKNOWN.

        Raises:
            OperationBusyError: the attempt is live (its message says where).
            ClaimLostError: the operation is no longer IN_FLIGHT with ``attempt``.
            KeyError: there is no such operation.
        """
        now = self._now()
        with self._store.transaction() as tx:
            op = self._require(tx, operation_id)
            if op.state is _S.IN_FLIGHT and op.attempt == attempt and op.claimed_by != worker:
                holder = self._holder(tx, op, worker, now)
                if holder is not None:
                    raise OperationBusyError(
                        f"{holder}: wait for it, then resume this thread",
                        operation_id=operation_id,
                    )
            expect = Expect(states=frozenset({_S.IN_FLIGHT}), attempt=attempt)
            change, detail = _abandoned(op, now, {"reason": reason})
            return self._cas(tx, operation_id, expect, change, detail, attempt=attempt)

    def verified_receipt(self, op: Operation, *, by_thread: str | None = None) -> Receipt:
        """Hand out an operation's stored receipt after re-checking its identity.

        The intent hash is recomputed from ``op.tool``, ``op.tool_version``
        and ``op.args`` and compared with ``op.intent_hash`` and the receipt's
        (a stored result is returned only after this check). A
        ``result_reused`` event is appended (counted in ``metrics``).

        Args:
            op: the operation, as read.
            by_thread: the thread the receipt is handed to, recorded in the
                event's ``thread_id`` (with a shared idempotency key it may be
                another thread than ``op.thread_id``); ``None`` records none.

        Returns:
            The receipt.

        Raises:
            ValueError: the operation has no receipt.
            LedgerCorruptError: any identity does not match.
        """
        if op.receipt is None:
            raise ValueError(f"operation {op.operation_id!r} has no receipt ({op.state})")
        receipt = verified(op).receipt
        assert receipt is not None
        # An audit fact, not a protocol one: a power cut losing it loses a
        # metric count, never an effect; so it spends no fsync of its own.
        with self._store.transaction(durable=False) as tx:
            detail: dict[str, Any] = {
                "receipt_attempt": receipt.attempt,
                "receipt_source": receipt.source,
            }
            if by_thread is not None:
                detail["thread_id"] = by_thread
            self._event(tx, op, EventKind.RESULT_REUSED, self._now(), detail)
        return receipt

    def next_attempt_at(
        self, op: Operation, *, retry_after: timedelta | float | None = None
    ) -> datetime | None:
        """Pick when the next attempt may start, or ``None`` if none may.

        Full jitter: ``now + uniform(0, min(cap, base * 2**(n-1)))`` for
        ``n = op.attempt``, but never earlier than ``retry_after`` from now.

        Args:
            op: the operation after ``n >= 1`` attempts.
            retry_after: the server's hint (HTTP ``Retry-After``), ``timedelta``
                or float seconds.

        Returns:
            An aware time, or ``None`` when no attempts are left or the time
            would fall after the budget's deadline.

        Raises:
            ValueError: ``op.attempt < 1``.
        """
        budget = op.budget
        if op.attempt >= op.attempts_allowed:
            return None
        delay_s = full_jitter_delay(
            op.attempt, base_s=budget.backoff_base_s, cap_s=budget.backoff_cap_s, rng=self._rng
        )
        if retry_after is not None:
            delay_s = max(delay_s, to_seconds(retry_after))
        at = self.clock.now() + timedelta(seconds=delay_s)
        if budget.deadline_at is not None and at > budget.deadline_at:
            return None
        return at

    # ----------------------------------------------------------- helpers

    def _cas(
        self,
        tx: StoreTransaction,
        operation_id: str,
        expect: Expect,
        change: Change,
        detail: dict[str, Any],
        *,
        attempt: int | None = None,
    ) -> Operation:
        """Compare-and-set plus its event; raise the precise refusal if nothing matched."""
        done = tx.compare_and_set(operation_id, expect, change)
        if done is None:
            cur = self._require(tx, operation_id)
            wanted = expect.intent_hash
            if cur.state in expect.states and wanted is not None and wanted != cur.intent_hash:
                raise LedgerCorruptError(
                    f"receipt intent {wanted[:12]}… is not the operation's {cur.intent_hash[:12]}…",
                    operation_id=operation_id,
                )
            raise ClaimLostError(
                operation_id=operation_id,
                attempt=cur.attempt if attempt is None else attempt,
                current_attempt=cur.attempt,
                current_state=cur.state.value,
            )
        src, op = done
        op = verified(op)
        at = change.updated_at
        self._event(tx, op, EventKind.TRANSITION, at, detail, src=src, dst=change.state)
        return op

    @staticmethod
    def _event(
        tx: StoreTransaction,
        op: Operation,
        kind: EventKind,
        at: datetime,
        detail: dict[str, Any],
        *,
        src: OpState | None = None,
        dst: OpState | None = None,
    ) -> None:
        tx.append_event(
            NewEvent(
                operation_id=op.operation_id,
                kind=kind,
                src=src,
                dst=dst,
                attempt=op.attempt,
                at=at,
                detail=detail,
            )
        )

    @staticmethod
    def _require(r: StoreReader, operation_id: str) -> Operation:
        op = r.get_operation(operation_id)
        if op is None:
            raise KeyError(f"no operation {operation_id!r} in the ledger")
        return verified(op)


def _abandoned(
    op: Operation, now: datetime, detail: dict[str, Any]
) -> tuple[Change, dict[str, Any]]:
    """The IN_FLIGHT -> UNKNOWN change of an abandoned attempt, and its event's detail.

    An attempt whose worker is proven gone (``owner_is_gone``: killed,
    crashed, out of memory) ended with its process, not with the tool: it is
    given back (``Operation.recoveries`` + 1, named in the event as
    ``attempt_given_back``) while fewer than ``MAX_RECOVERIES`` were. An
    attempt abandoned any other way (its lease lapsed while its worker may
    live; this worker's own call whose result was not recorded) is charged.
    """
    if op.recoveries < MAX_RECOVERIES and owner_is_gone(op.claimed_by):
        detail = {**detail, "attempt_given_back": True, "recoveries": op.recoveries + 1}
        return Change(state=_S.UNKNOWN, updated_at=now, recoveries=op.recoveries + 1), detail
    return Change(state=_S.UNKNOWN, updated_at=now), detail


def _claim_thread(r: StoreReader, op: Operation) -> str:
    """The thread whose run claimed ``op``'s current attempt (see ``claim``)."""
    for event in reversed(r.events(operation_id=op.operation_id)):
        if event.dst is _S.IN_FLIGHT and event.attempt == op.attempt:
            named = event.detail.get("thread_id")
            return named if isinstance(named, str) else op.thread_id
    return op.thread_id


def _already_recorded(
    cur: Operation, attempt: int, state: OpState, receipt: Receipt | None, error: str | None
) -> bool:
    """Whether ``cur`` already holds exactly this attempt's result (a repeated record).

    Same attempt, same state, the same error text and a receipt with the same
    identity, source, reference and result (its ``recorded_at`` aside: the
    repeat made a new one). A result another path recorded for that attempt
    (a reconciler's lookup, a person) differs in its receipt's source.
    """
    if cur.state is not state or cur.attempt != attempt or cur.error != error:
        return False
    if receipt is None or cur.receipt is None:
        return receipt is None and cur.receipt is None
    mine, theirs = receipt, cur.receipt
    return (
        mine.operation_id,
        mine.intent_hash,
        mine.attempt,
        mine.source,
        mine.reference,
        mine.result,
    ) == (
        theirs.operation_id,
        theirs.intent_hash,
        theirs.attempt,
        theirs.source,
        theirs.reference,
        theirs.result,
    )
