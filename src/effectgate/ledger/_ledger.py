"""The ``Ledger`` facade: the operation protocol (docs/architecture.md) over a ``LedgerStore``.

The facade owns every rule (intent checks, budgets, the transition table,
events); the store only persists and compares. Each public write is one
store transaction, so one commit: the happy path of a side effect costs two
durable commits (``claim`` before it, ``record_result`` after it).

The class is assembled from mixins to keep modules small: ``_threads``
(thread records, leases), ``_attempts`` (claim, results, transitions,
recovery, receipt reuse) and this module (opening, review, reads, metrics).
"""

from __future__ import annotations

import builtins
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from effectgate._clock import Clock, SystemClock
from effectgate._intent import intent_hash as compute_intent_hash
from effectgate._recent import Recent
from effectgate.errors import (
    ApprovalMismatchError,
    IntentConflictError,
    LedgerCorruptError,
)
from effectgate.ledger._attempts import AttemptsMixin, verified
from effectgate.ledger._model import (
    Approval,
    Budget,
    DamagedOperation,
    Event,
    EventKind,
    Lease,
    LedgerMetrics,
    OpenRequest,
    Operation,
    OperationTombstone,
    OpState,
)
from effectgate.ledger._sqlite import SqliteLedgerStore
from effectgate.ledger._store import (
    Change,
    Expect,
    LedgerStore,
    StoreTransaction,
    WriteOnce,
)

__all__ = ["Ledger", "SqliteLedger"]

_S = OpState


def _check_request(req: OpenRequest) -> Budget:
    expected = compute_intent_hash(req.tool, req.tool_version, req.args)
    if expected != req.intent_hash:
        raise ValueError(
            f"operation {req.operation_id!r}: intent_hash {req.intent_hash[:12]}… is not the "
            f"hash of tool, tool_version and args ({expected[:12]}…)"
        )
    budget = req.budget or Budget()
    if budget.max_attempts < 1:
        raise ValueError(f"operation {req.operation_id!r}: max_attempts must be >= 1")
    return budget


def _approval_target(state: OpState, decision: str) -> OpState | None:
    """The state a review decision moves an operation to; ``None``: keep it."""
    if decision == "reject":
        return _S.REJECTED if state in (_S.PROPOSED, _S.APPROVED) else None
    return _S.APPROVED if state is _S.PROPOSED else None


class Ledger(AttemptsMixin):
    """The durable record of every external action (docs/architecture.md).

    Thread-safe: several Python threads may share one ``Ledger``; several
    processes may open the same store. Every write commits before the call
    returns (durably, except ``record_review``; see there).

    Args:
        store: the backend, e.g. ``SqliteLedgerStore``; the ledger closes it.
        clock: where "now" comes from; ``SystemClock()`` by default.
        rng: the random source for backoff jitter; a fresh ``random.Random()`` by default.
    """

    def __init__(
        self,
        store: LedgerStore,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()
        """The clock every timestamp is read from."""
        self._rng = rng or random.Random()
        self._checked: Recent[str, Operation] = Recent(20_000)
        """The last ``Operation`` object of each id that passed ``verified`` (see ``list``)."""
        self._given_up: Recent[str, Lease] = Recent(1_000)

    @property
    def store(self) -> LedgerStore:
        """The backend this ledger writes to."""
        return self._store

    def close(self) -> None:
        """Close the store; idempotent."""
        self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ opening

    def open(
        self,
        *,
        operation_id: str,
        thread_id: str,
        tool_call_id: str,
        tool: str,
        tool_version: str,
        args: Mapping[str, Any],
        intent_hash: str,
        budget: Budget | None = None,
    ) -> Operation:
        """Create an operation in PROPOSED, or get the existing one with the same intent.

        Atomic create-or-get, committed durably before return. Re-opening an
        operation never changes it: its budget is the one it was created with
        (budgets survive restarts and new flags).

        Args:
            operation_id: the idempotency key.
            thread_id: the LangGraph thread proposing the call.
            tool_call_id: the model's id of the call.
            tool: the tool's name.
            tool_version: the tool's declared version.
            args: the tool schema's normalized arguments, JSON-compatible.
            intent_hash: ``effectgate._intent.intent_hash(tool, tool_version, args)``.
            budget: limits for a new operation (``None``: ``Budget()``); ignored if it exists.

        Returns:
            The stored operation (new, or unchanged if it existed).

        Raises:
            ValueError: ``intent_hash`` does not match ``tool``/``tool_version``/``args``.
            IntentConflictError: the operation exists with a different intent
                hash, or was compacted to a tombstone that binds it to one
                (``OperationTombstone.binds_other_intent``).
            LedgerCorruptError: the existing row fails validation.
        """
        req = OpenRequest(
            operation_id=operation_id,
            thread_id=thread_id,
            tool_call_id=tool_call_id,
            tool=tool,
            tool_version=tool_version,
            args=args,
            intent_hash=intent_hash,
            budget=budget,
        )
        with self._store.transaction() as tx:
            return self._open_in(tx, req, self._now())

    def _open_in(self, tx: StoreTransaction, req: OpenRequest, now: datetime) -> Operation:
        budget = _check_request(req)
        draft = Operation(
            operation_id=req.operation_id,
            thread_id=req.thread_id,
            tool_call_id=req.tool_call_id,
            tool=req.tool,
            tool_version=req.tool_version,
            args=dict(req.args),
            intent_hash=req.intent_hash,
            state=_S.PROPOSED,
            budget=budget,
            created_at=now,
            updated_at=now,
        )
        op, created = tx.create_or_get(draft)
        op = verified(op)
        earlier = tx.get_operation_tombstone(op.operation_id) if created else None
        if earlier is not None and earlier.binds_other_intent(req.intent_hash):
            # A compacted id keeps its binding: rolled back, nothing is created.
            raise IntentConflictError(
                operation_id=op.operation_id,
                stored_hash=earlier.intent_hash,
                new_hash=req.intent_hash,
            )
        if not created:
            if op.intent_hash != req.intent_hash:
                raise IntentConflictError(
                    operation_id=op.operation_id,
                    stored_hash=op.intent_hash,
                    new_hash=req.intent_hash,
                )
            return op
        detail: dict[str, Any] = {
            "thread_id": req.thread_id,
            "tool_call_id": req.tool_call_id,
            "tool": req.tool,
        }
        if earlier is not None:  # the id was used before, and compacted by retention
            detail["compacted_earlier"] = earlier.summary()
        self._event(tx, op, EventKind.CREATED, now, detail, dst=_S.PROPOSED)
        return op

    def record_review(
        self, opens: Sequence[OpenRequest], approvals: Sequence[Approval]
    ) -> builtins.list[Operation]:
        """Record one review (every call of one AI message) in a single transaction.

        Creates or gets each operation (as ``open``), appends each approval,
        and moves PROPOSED to APPROVED (``approve``/``edit``) or PROPOSED/APPROVED
        to REJECTED (``reject``). An operation already past review keeps its
        state; the approval row and an event are still appended. All or nothing.
        Re-running the same review (a resume after a crash) changes nothing:
        an identical approval row is not appended twice.

        Args:
            opens: the calls under review, one ``OpenRequest`` each.
            approvals: the decisions, each naming its operation; applied in order.

        Returns:
            The operations of ``opens`` in order after the review, followed by
            any other operation an approval named.

        Raises:
            ApprovalMismatchError: an approval's intent hash is not its operation's,
                or a different approval holds the same key.
            IntentConflictError, ValueError: as ``open``.
            KeyError: an approval names an operation that does not exist.

        Note:
            This commit uses ``synchronous=NORMAL``. That is safe: nothing
            acts on an approval until ``claim`` commits with FULL, and the
            WAL is append-only, so that fsync makes these earlier frames
            durable too. A crash before it loses at most the review, which
            the checkpoint then also lacks, so the human is asked again.
        """
        now = self._now()
        result: dict[str, Operation] = {}
        with self._store.transaction(durable=False) as tx:
            for req in opens:
                result[req.operation_id] = self._open_in(tx, req, now)
            for approval in approvals:
                op = result.get(approval.operation_id) or self._require(tx, approval.operation_id)
                result[op.operation_id] = self._apply_approval(tx, op, approval, now)
        return builtins.list(result.values())

    def _apply_approval(
        self, tx: StoreTransaction, op: Operation, approval: Approval, now: datetime
    ) -> Operation:
        if approval.intent_hash != op.intent_hash:
            raise ApprovalMismatchError(
                f"the {approval.decision} decision is for intent {approval.intent_hash[:12]}…, "
                f"the operation's intent is {op.intent_hash[:12]}…",
                operation_id=op.operation_id,
            )
        written = tx.put_approval(approval)
        if written is WriteOnce.CONFLICT:
            raise ApprovalMismatchError(
                "a different approval with the same reviewer, time, decision and intent "
                "is already recorded",
                operation_id=op.operation_id,
            )
        if written is WriteOnce.EXISTS:
            return op
        detail = {"decision": approval.decision, "reviewer": approval.reviewer}
        dst = _approval_target(op.state, approval.decision)
        if dst is None:
            detail["state"] = op.state.value
            self._event(tx, op, EventKind.APPROVAL, now, detail)
            return op
        return self._cas(
            tx,
            op.operation_id,
            Expect(states=frozenset({op.state})),
            Change(state=dst, updated_at=now),
            detail,
        )

    # -------------------------------------------------------------- reads

    def get(self, operation_id: str) -> Operation | None:
        """Return one operation, validated on load, or ``None`` if unknown.

        Raises:
            LedgerCorruptError: the row fails validation (state, JSON, times,
                attempt, or an intent hash that does not match its arguments).
        """
        with self._store.read(single=True) as r:
            op = r.get_operation(operation_id)
        return None if op is None else self._verified_once(op)

    def list(
        self,
        *,
        thread_id: str | None = None,
        states: Iterable[OpState] | None = None,
        tool: str | None = None,
        intent_hash: str | None = None,
        damaged: builtins.list[DamagedOperation] | None = None,
    ) -> builtins.list[Operation]:
        """Return the operations matching every given filter, validated on load.

        Args:
            thread_id: only this thread's operations.
            states: only operations in one of these states.
            tool: only this tool's operations.
            intent_hash: only operations with this intent (any thread), e.g.
                to flag a possible duplicate of an earlier action; indexed.
            damaged: when given, a row that fails validation does not fail
                the listing: it is appended here (``DamagedOperation``) and
                the readable rows are returned. A damaged row is reported
                whatever ``states`` and ``tool`` ask, since what it stores
                cannot be trusted; ``thread_id`` and ``intent_hash`` still
                select it. ``None``: such a row raises.

        Returns:
            Operations ordered by ``created_at``, then ``operation_id``.

        Raises:
            LedgerCorruptError: a matching row fails validation (and
                ``damaged`` is ``None``).
        """
        try:
            with self._store.read(single=True) as r:
                ops = r.list_operations(
                    thread_id=thread_id, states=states, tool=tool, intent_hash=intent_hash
                )
            return [self._verified_once(op) for op in ops]
        except LedgerCorruptError:
            if damaged is None:
                raise
        # The slow path, only past a damaged row: each row read on its own.
        with self._store.read(single=True) as r:
            refs = r.operation_refs(thread_id=thread_id, intent_hash=intent_hash)
        wanted = None if states is None else frozenset(OpState(s) for s in states)
        return [
            op
            for op in self._each_readable(refs, damaged)
            if (wanted is None or op.state in wanted) and (tool is None or op.tool == tool)
        ]

    def _each_readable(
        self, refs: Iterable[tuple[str, str]], damaged: builtins.list[DamagedOperation]
    ) -> builtins.list[Operation]:
        """Read each ``(operation_id, thread_id)`` alone; one that fails goes to ``damaged``."""
        out = []
        for operation_id, thread_id in refs:
            try:
                op = self.get(operation_id)
            except LedgerCorruptError as exc:
                why = str(exc)
                damaged.append(
                    DamagedOperation(operation_id=operation_id, thread_id=thread_id, reason=why)
                )
                continue
            if op is not None:  # deleted by retention meanwhile
                out.append(op)
        return out

    def _verified_once(self, op: Operation) -> Operation:
        # A store may hand back the very object it decoded before for a row
        # that did not change (SqliteLedgerStore does); that object was
        # verified then and is frozen. Any other object is verified now.
        if self._checked.get(op.operation_id) is op:
            return op
        verified(op)
        self._checked[op.operation_id] = op
        return op

    def operation_tombstone(self, operation_id: str) -> OperationTombstone | None:
        """Return what retention left of a compacted operation id, or ``None``."""
        with self._store.read(single=True) as r:
            return r.get_operation_tombstone(operation_id)

    def operation_tombstones(self, *, intent_hash: str) -> builtins.list[OperationTombstone]:
        """Return the tombstones of compacted operations of one intent, oldest finish first."""
        with self._store.read(single=True) as r:
            return r.list_operation_tombstones(intent_hash=intent_hash)

    def intent_neighbours(
        self,
        operation_id: str,
        intent_hash: str,
        *,
        damaged: builtins.list[DamagedOperation] | None = None,
    ) -> tuple[builtins.list[Operation], builtins.list[OperationTombstone]]:
        """Return the operations and tombstones under ``operation_id`` or of ``intent_hash``.

        One reading for what a review needs to know about one call: whether
        its id is taken (by an operation, or by a compacted one's tombstone)
        and what else was done with the same intent (``list(intent_hash=)``,
        ``operation_tombstones(intent_hash=)``). Operations validated on load,
        ordered by ``created_at`` then id; tombstones by finish, then id. On
        PostgreSQL both statements travel in one round trip.

        Args:
            operation_id: the id the call would take.
            intent_hash: the call's intent.
            damaged: as for ``list``: a row that fails validation is appended
                here instead of raising (a review then warns about it).

        Raises:
            LedgerCorruptError: a matching operation row fails validation
                (and ``damaged`` is ``None``).
        """
        try:
            with self._store.read(single=True) as r:
                ops, tombstones = r.intent_neighbours(operation_id, intent_hash)
            return [self._verified_once(op) for op in ops], tombstones
        except LedgerCorruptError:
            if damaged is None:
                raise
        with self._store.read() as r:
            refs = r.operation_refs(operation_id=operation_id, intent_hash=intent_hash)
            same = r.list_operation_tombstones(intent_hash=intent_hash)
            tombs = {t.operation_id: t for t in same}
            own = r.get_operation_tombstone(operation_id)
        if own is not None:
            tombs[own.operation_id] = own
        ordered = sorted(tombs.values(), key=lambda t: (t.finished_at, t.operation_id))
        return self._each_readable(refs, damaged), ordered

    def approvals(self, operation_id: str) -> builtins.list[Approval]:
        """Return an operation's approvals in the order they were recorded."""
        with self._store.read(single=True) as r:
            return r.approvals(operation_id)

    def latest_approval(self, operation_id: str) -> Approval | None:
        """Return the most recently recorded approval of an operation, or ``None``."""
        found = self.approvals(operation_id)
        return found[-1] if found else None

    def events(
        self, *, operation_id: str | None = None, thread_id: str | None = None
    ) -> builtins.list[Event]:
        """Return the audit events matching the filters, in ``seq`` (append) order."""
        with self._store.read(single=True) as r:
            return r.events(operation_id=operation_id, thread_id=thread_id)

    def note(self, operation_id: str, detail: Mapping[str, Any]) -> None:
        """Append a fact about an operation that changes no state, durably.

        Raises:
            KeyError: there is no such operation.
        """
        with self._store.transaction() as tx:
            op = self._require(tx, operation_id)
            self._event(tx, op, EventKind.NOTE, self._now(), dict(detail))

    def metrics(self) -> LedgerMetrics:
        """Compute health figures from the ledger alone (one read snapshot)."""
        now = self.clock.now()
        with self._store.read() as r:
            counts = r.count_operations()
            reused = r.count_events(EventKind.RESULT_REUSED)
            oldest = r.oldest_updated_at(_S.NEEDS_RECONCILIATION)
        by_state = {s.value: 0 for s in OpState}
        for c in counts:
            by_state[c.state.value] += c.count
        succeeded = sum(c.count for c in counts if c.state is _S.SUCCEEDED)
        first = sum(c.count for c in counts if c.state is _S.SUCCEEDED and c.attempt == 1)
        started = sum(c.count for c in counts if c.attempt >= 1)
        attempts = sum(c.count * c.attempt for c in counts if c.attempt >= 1)
        return LedgerMetrics(
            by_state=by_state,
            operations=sum(by_state.values()),
            first_attempt_success_rate=first / succeeded if succeeded else None,
            mean_attempts=attempts / started if started else None,
            results_reused=reused,
            open_unknowns=by_state[_S.UNKNOWN] + by_state[_S.NEEDS_RECONCILIATION],
            oldest_reconciliation_age_s=None if oldest is None else (now - oldest).total_seconds(),
        )


class SqliteLedger(Ledger):
    """A ``Ledger`` over one SQLite file (``SqliteLedgerStore``).

    Args:
        path: the ledger file, e.g. ``state/ledger.sqlite3``.
        clock: where "now" comes from; ``SystemClock()`` by default.
        migrate: bring an older schema up to date (else refuse it).
        busy_timeout: lock wait before ``LedgerBusyError``; ``timedelta`` or float seconds.
        rng: the random source for backoff jitter.

    Raises:
        ConfigError, LedgerCorruptError, SchemaVersionError, LedgerBusyError:
            as ``SqliteLedgerStore``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        migrate: bool = True,
        busy_timeout: timedelta | float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        self.path = Path(path)
        """The ledger file."""
        store = SqliteLedgerStore(self.path, migrate=migrate, busy_timeout=busy_timeout)
        super().__init__(store, clock=clock, rng=rng)
