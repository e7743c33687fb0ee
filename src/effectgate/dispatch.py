"""The dispatch protocol: Ledger x ToolSpec -> receipt (docs/architecture.md).

This is where "may it run now, and how do we recover from UNKNOWN?" is
decided. It imports the ledger and the tool contracts, and no LangGraph: the
graph's effect node is a thin adapter that turns an ``Outcome`` into a
``ToolMessage`` or an ``interrupt()``.

One call of ``Dispatcher.dispatch`` drives an operation as far as it can go
without a human::

    op = ledger.get(op_id) or ledger.open(...)      # create-or-get
    intent differs?          -> CONFLICT (never reuse, never run)
    terminal?                -> the verified stored receipt, no call
    IN_FLIGHT (abandoned)    -> UNKNOWN
    IN_FLIGHT (live worker)  -> OperationBusyError (wait, never take it over)
    UNKNOWN                  -> recover by the tool's contract (its effect kind)
    NEEDS_RECONCILIATION     -> NEEDS_RECONCILIATION (the node asks a human)
    approval valid? budget? deadline? next_attempt_at? (else review / wait / fail)
    claim attempt n+1 (compare-and-set, FULL commit)  -> call the tool
    -> SUCCEEDED | FAILED | RETRY_WAIT | UNKNOWN committed before returning
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal

from effectgate import _failpoints
from effectgate._clock import Clock, SystemClock
from effectgate._failpoints import Failpoint
from effectgate._outcome import DispatchStatus, EffectCall, Outcome, settled_outcome
from effectgate._process import owner_is_gone
from effectgate.answers import Verdict, apply_verdict, settle_verdict, validate_verdict
from effectgate.errors import (
    ClaimLostError,
    DecisionError,
    IntentConflictError,
    NotAccepted,
    OutcomeUnknown,
    Rejected,
    ToolCallError,
)
from effectgate.ledger import (
    Budget,
    EventKind,
    LeaseKeeper,
    Ledger,
    Operation,
    OpState,
    Receipt,
)
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec

__all__ = [
    "DispatchStatus",
    "Dispatcher",
    "EffectCall",
    "Outcome",
    "Verdict",
    "validate_verdict",
]

log = logging.getLogger("effectgate.dispatch")


_CALLS: Counter[tuple[str, str, int]] = Counter()
"""(worker, operation id, attempt) of every tool call this process is inside now, counted.

Per process, not per ``Dispatcher``: two dispatchers given one worker id
must still see each other's calls as running. A count, not a set: two runs
of one thread in one process (two ``graph.ainvoke`` at once) both mark the
attempt before their claims, and the loser's unmarking must not unmark the
winner's call, which the loser would then take for one that returned
without its result recorded and repeat.
"""
_CALLS_LOCK = threading.Lock()


WaitHook = Callable[[Operation, float], None]
"""Called before a backoff wait with the operation and the seconds to wait."""


class Dispatcher:
    """Runs reviewed calls through the ledger so no effect is blindly repeated.

    Args:
        ledger: the operation ledger.
        tools: side-effecting tools by name.
        worker: this process's worker id, stored as ``claimed_by``.
        clock: time source; defaults to the system clock.
        on_wait: called before each backoff wait (progress display).
        default_budget: budget for operations the review did not create.
        questions: exception types a tool body raises to ask a person
            something (the graph passes LangGraph's ``GraphInterrupt``,
            raised by ``interrupt()``). A side-effecting tool that asks is
            refused: the attempt ends ``FAILED`` ("stopped before acting"),
            or ``UNKNOWN`` when an earlier attempt may have applied, and no
            retry is spent on it. The answer to a question inside an effect
            step could be consumed by another interrupt of the same step.
        leases: the keeper whose thread leases are this dispatcher's
            heartbeat (``LeaseKeeper.shared`` around each dispatch; the
            graph builders give one). ``None``: the caller holds the lease.

    Note:
        Exactly-once *effects* come from the ledger plus the tool's contract;
        LangGraph re-runs nodes at least once (docs/architecture.md, "The problem").
    """

    def __init__(
        self,
        ledger: Ledger,
        tools: Mapping[str, ToolSpec],
        *,
        worker: str,
        clock: Clock | None = None,
        on_wait: WaitHook | None = None,
        default_budget: Budget | None = None,
        questions: tuple[type[BaseException], ...] = (),
        leases: LeaseKeeper | None = None,
    ) -> None:
        self.ledger = ledger
        self.tools = dict(tools)
        self.worker = worker
        self.clock = clock or SystemClock()
        self.on_wait = on_wait
        self.default_budget = default_budget or Budget()
        self.questions = questions
        self.leases = leases

    # ------------------------------------------------------------------ entry

    def dispatch(self, call: EffectCall) -> Outcome:
        """Drive one reviewed call as far as possible without a human.

        Safe to call again for the same call at any time (after a crash, on
        resume, on replay): it reads the ledger first and never repeats an
        effect the ledger knows started.

        Args:
            call: the reviewed call.

        Returns:
            An ``Outcome``; ``SUCCEEDED`` always carries a verified receipt.

        Raises:
            LedgerError: the ledger failed (busy, corrupt); nothing new committed.
            OperationBusyError: the operation is in flight under another
                worker that may still be running it; nothing was called.
            ClaimLostError: this worker's attempt was fenced off mid-call by a
                worker that took the thread over.
        """
        spec = self.tools.get(call.tool)
        if spec is None:
            return Outcome(
                status=DispatchStatus.FAILED,
                operation=None,
                message=f"tool {call.tool!r} is not available in this agent; not executed",
            )
        try:
            args = spec.normalize(call.args, tool_call_id=call.tool_call_id)
        except ToolCallError as exc:
            return self._invalid_now(call, spec, exc)
        if spec.intent_hash(args) != call.intent_hash:
            detail = {"approved_intent_hash": call.intent_hash}
            detail["current_intent_hash"] = spec.intent_hash(args)
            refused = self._tool_changed(call, "the tool or its version changed", detail)
            if refused is not None:
                return refused
        held = (
            self.leases.shared(call.thread_id, worker=self.worker)
            if self.leases is not None
            else contextlib.nullcontext()
        )
        with held:
            try:
                op = self._open(call, spec, args)
            except IntentConflictError as exc:
                return self._conflict(call, exc)
            return self._drive(call, spec, args, op)

    def _tool_changed(self, call: EffectCall, why: str, detail: dict[str, Any]) -> Outcome | None:
        """Refuse a call approved under another tool version, if it has not started.

        The approval names an intent that no longer exists (a new tool
        version, a tightened schema), and one operation id never changes its intent hash:
        the old approval is refused (the operation ends REJECTED with ``why``,
        never left APPROVED without a path) and the call answered as not
        executed, so the model may propose it again. An operation that
        already started under the old version is driven on as usual
        (``None``): its effect may have happened, and its stored receipt or
        recovery still apply.
        """
        op = self.ledger.get(call.operation_id)
        if op is not None and op.state not in (OpState.PROPOSED, OpState.APPROVED):
            return None
        if op is not None:
            op = self.ledger.transition(
                op.operation_id,
                src=op.state,
                dst=OpState.REJECTED,
                error=f"{why} after approval",
                detail=detail,
            )
        return Outcome(
            status=DispatchStatus.FAILED,
            operation=op,
            message=f"not executed: {why} since the approval; propose the call again",
            evidence=detail,
        )

    def _invalid_now(self, call: EffectCall, spec: ToolSpec, exc: ToolCallError) -> Outcome:
        """Answer a reviewed call whose arguments the current tool no longer accepts.

        The schema was tightened after the review (a limit lowered, a version
        bumped). Not started: the approval is void, the operation ends
        REJECTED with the reason (``_tool_changed``). Started: what the
        ledger knows still holds (a receipt is returned, a live attempt is
        waited for), but nothing is called or looked up with arguments the
        tool refuses: an open outcome goes to a human with the reason.
        """
        why = f"the arguments no longer validate under {spec.name} version {spec.version} ({exc})"
        refused = self._tool_changed(call, why, {"reason": why})
        if refused is not None:
            return refused
        op = self.ledger.get(call.operation_id)
        assert op is not None  # _tool_changed answers for a missing operation
        while True:
            if op.state in (OpState.SUCCEEDED, OpState.FAILED, OpState.REJECTED):
                step = self._step(call, spec, None, op)
            elif op.state is OpState.IN_FLIGHT:
                step = self._in_flight(op, call)
            elif op.state is OpState.RETRY_WAIT:
                # No retry with refused arguments: known not applied ends
                # FAILED, an earlier attempt that may have applied goes to a human.
                maybe = self._maybe_applied(op)
                step = self.ledger.transition(
                    op.operation_id,
                    src=OpState.RETRY_WAIT,
                    dst=OpState.NEEDS_RECONCILIATION if maybe else OpState.FAILED,
                    error=why,
                    detail={"reason": why},
                )
            else:  # UNKNOWN, NEEDS_RECONCILIATION
                return self._park(op, spec, why)
            if isinstance(step, Outcome):
                return step
            op = step

    def _open(self, call: EffectCall, spec: ToolSpec, args: Any) -> Operation:
        op = self.ledger.get(call.operation_id)
        if op is not None:
            if op.intent_hash != call.intent_hash:
                raise IntentConflictError(
                    operation_id=op.operation_id,
                    stored_hash=op.intent_hash,
                    new_hash=call.intent_hash,
                )
            return op
        return self.ledger.open(
            operation_id=call.operation_id,
            thread_id=call.thread_id,
            tool_call_id=call.tool_call_id,
            tool=spec.name,
            tool_version=spec.version,
            args=spec.args_dict(args),
            intent_hash=call.intent_hash,
            budget=self.default_budget,
        )

    def _conflict(self, call: EffectCall, exc: IntentConflictError) -> Outcome:
        return Outcome(
            status=DispatchStatus.CONFLICT,
            operation=self.ledger.get(call.operation_id),
            message=(
                f"not executed: {exc}. The stored operation keeps its own arguments and "
                "result; a genuinely new action needs a new operation id"
            ),
            evidence={"stored_intent_hash": exc.stored_hash, "new_intent_hash": exc.new_hash},
        )

    # ------------------------------------------------------------- main loop

    def _drive(self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation) -> Outcome:
        # Each pass reads one state and commits at most one transition, so a
        # crash anywhere leaves the ledger in a state this loop resumes from.
        while True:
            step = self._step(call, spec, args, op)
            if isinstance(step, Outcome):
                return step
            op = step

    def _step(
        self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation
    ) -> Operation | Outcome:
        state = op.state
        settled = settled_outcome(self.ledger, op, call.thread_id)
        if settled is not None:
            return settled
        if state is OpState.NEEDS_RECONCILIATION:
            return self._recheck_parked(call, spec, args, op)
        if state is OpState.IN_FLIGHT:
            return self._in_flight(op, call)
        if state is OpState.UNKNOWN:
            return self._recover_unknown(call, spec, args, op)
        if state is OpState.PROPOSED:
            return Outcome(
                status=DispatchStatus.NEEDS_REVIEW,
                operation=op,
                message="no approval recorded for this call",
            )
        if state is OpState.APPROVED:
            problem = self._approval_problem(op)
            if problem is not None:
                op = self.ledger.withdraw_approval(op.operation_id, reason=problem)
                return Outcome(status=DispatchStatus.NEEDS_REVIEW, operation=op, message=problem)
        return self._attempt(call, spec, args, op)

    # --------------------------------------------------------------- approval

    def _approval_problem(self, op: Operation) -> str | None:
        approval = self.ledger.latest_approval(op.operation_id)
        if approval is None or approval.decision == "reject":
            return "no approval recorded for this call"
        if approval.intent_hash != op.intent_hash:
            return "the approval was given for other arguments"
        if approval.expires_at is not None and self.clock.now() >= approval.expires_at:
            return f"the approval expired at {approval.expires_at.isoformat()}"
        return None

    # ---------------------------------------------------------------- attempt

    def _attempt(
        self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation
    ) -> Operation | Outcome:
        now = self.clock.now()
        budget = op.budget
        if op.attempt >= op.attempts_allowed or (
            budget.deadline_at is not None and now >= budget.deadline_at
        ):
            why = (
                "attempt budget exhausted"
                if op.attempt >= op.attempts_allowed
                else "deadline passed"
            )
            if op.state is OpState.RETRY_WAIT and self._maybe_applied(op):
                # An earlier attempt may have taken effect: never FAILED (known not applied).
                op = self.ledger.transition(
                    op.operation_id,
                    src=op.state,
                    dst=OpState.NEEDS_RECONCILIATION,
                    error=f"{why} before a retry; an earlier attempt may have applied",
                    detail={"reason": why},
                )
                return self._needs_human(op, spec, op.error or why)
            # From APPROVED, or RETRY_WAIT after known-not-applied attempts.
            return self.ledger.transition(
                op.operation_id,
                src=op.state,
                dst=OpState.FAILED,
                error=f"{why} after {op.attempt} attempt(s); {op.error or 'not applied'}",
                detail={"reason": why},
            )
        if op.state is OpState.RETRY_WAIT and op.next_attempt_at is not None:
            wait_s = (op.next_attempt_at - now).total_seconds()
            if wait_s > 0:
                if self.on_wait is not None:
                    self.on_wait(op, wait_s)
                self.clock.sleep(wait_s)
        key = (self.worker, op.operation_id, op.attempt + 1)
        with _CALLS_LOCK:
            # Marked before the claim commits, so a sibling never sees this
            # attempt IN_FLIGHT under this worker without it being marked.
            _CALLS[key] += 1
        try:
            try:
                op = self.ledger.claim(
                    op.operation_id,
                    attempt=op.attempt + 1,
                    worker=self.worker,
                    thread_id=call.thread_id,
                )
            except ClaimLostError:
                # Another worker claimed it first; re-read and follow its state.
                fresh = self.ledger.get(op.operation_id)
                assert fresh is not None
                return fresh
            _failpoints.hit(Failpoint.AFTER_IN_FLIGHT_COMMIT, tool=spec.name)
            return self._call(call, spec, args, op)
        finally:
            with _CALLS_LOCK:
                _CALLS[key] -= 1
                if _CALLS[key] <= 0:
                    del _CALLS[key]

    def _call(
        self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation
    ) -> Operation | Outcome:
        ctx = self._context(call, op)
        try:
            result = spec.call(args, ctx)
        except self.questions:
            # The body asked a person (LangGraph's ``interrupt()``) and stopped
            # there, before acting (code before ``interrupt()`` runs again on
            # resume, so it must not act). Refused: inside an effect step the
            # answer could be matched to another interrupt of the same step (a
            # reconciliation after a crash, a re-review), since LangGraph matches
            # a task's resume values by position. The call ends here, not run.
            why = (
                f"{spec.name} asked the user with interrupt() inside its body, which "
                "effectgate refuses in a side-effecting tool; it stopped before acting. "
                "Ask before proposing the call (a read tool that asks, or the model's reply)"
            )
            state = OpState.UNKNOWN if self._maybe_applied(op) else OpState.FAILED
            return self._record(op, state, error=why)
        except Rejected as exc:
            # This attempt did not apply; an earlier one may have (then: UNKNOWN).
            if self._maybe_applied(op):
                why = (
                    f"the service refused attempt {op.attempt}, but an earlier one may have applied"
                )
                return self._record(op, OpState.UNKNOWN, error=f"{why}: {exc}")
            return self._record(op, OpState.FAILED, error=f"the service refused the request: {exc}")
        except NotAccepted as exc:
            nxt = self.ledger.next_attempt_at(op, retry_after=exc.retry_after)
            if nxt is None:
                state = OpState.UNKNOWN if self._maybe_applied(op) else OpState.FAILED
                return self._record(
                    op, state, error=f"not accepted, no attempts or time left: {exc}"
                )
            return self._record(
                op, OpState.RETRY_WAIT, error=f"not accepted: {exc}", next_attempt_at=nxt
            )
        except OutcomeUnknown as exc:
            return self._record(op, OpState.UNKNOWN, error=f"outcome unknown: {exc}")
        except Exception as exc:  # noqa: BLE001 - see the comment below
            # A tool outside our contracts (e.g. a plain LangChain tool) raised
            # after it may have acted: the only honest state is UNKNOWN.
            return self._record(
                op, OpState.UNKNOWN, error=f"tool raised {type(exc).__name__}: {exc}"
            )
        _failpoints.hit(Failpoint.AFTER_EXTERNAL_COMMIT, tool=spec.name)
        receipt = self._receipt(op, result, source="dispatch")
        op = self.ledger.record_result(
            op.operation_id, attempt=op.attempt, state=OpState.SUCCEEDED, receipt=receipt
        )
        _failpoints.hit(Failpoint.AFTER_LEDGER_RESULT, tool=spec.name)
        return Outcome(
            status=DispatchStatus.SUCCEEDED, operation=op, receipt=receipt, message="executed"
        )

    def _maybe_applied(self, op: Operation) -> bool:
        """Whether an earlier attempt of ``op`` may have taken effect.

        True when the last recovery from UNKNOWN retried without proof that
        nothing had applied (a same-key or idempotent retry, or a human's
        retry). Only read on failure paths, so the happy path stays at two
        ledger commits and no extra reads.
        """
        for event in reversed(self.ledger.events(operation_id=op.operation_id)):
            if event.dst is OpState.RETRY_WAIT and event.src in (
                OpState.UNKNOWN,
                OpState.NEEDS_RECONCILIATION,
            ):
                return bool(event.detail.get("maybe_applied", True))
        return False

    def _record(
        self, op: Operation, state: OpState, *, error: str, next_attempt_at: datetime | None = None
    ) -> Operation:
        log.info("operation %s attempt %d -> %s: %s", op.operation_id, op.attempt, state, error)
        return self.ledger.record_result(
            op.operation_id,
            attempt=op.attempt,
            state=state,
            error=error,
            next_attempt_at=next_attempt_at,
        )

    def _context(self, call: EffectCall | None, op: Operation) -> ToolContext:
        # The call's thread (a shared keyed operation may be another thread's), else the op's.
        return ToolContext(
            operation_id=op.operation_id,
            thread_id=op.thread_id if call is None else call.thread_id,
            tool_call_id=op.tool_call_id if call is None else call.tool_call_id,
            attempt=op.attempt,
            deadline_at=op.budget.deadline_at,
        )

    def _receipt(
        self, op: Operation, result: ToolResult, source: Literal["dispatch", "reconcile", "human"]
    ) -> Receipt:
        return Receipt(
            operation_id=op.operation_id,
            intent_hash=op.intent_hash,
            attempt=op.attempt,
            result=_jsonable(result.value),
            reference=result.reference,
            source=source,
            recorded_at=self.clock.now(),
        )

    # --------------------------------------------------------------- recovery

    def _in_flight(self, op: Operation, call: EffectCall) -> Operation | Outcome:
        if op.claimed_by == self.worker and self._running(op):
            # A sibling task of this very process is running the attempt; wait for it.
            self.clock.sleep(0.05)
            fresh = self.ledger.get(op.operation_id)
            assert fresh is not None
            return fresh
        # Ours and returned without its result recorded (the ledger was busy
        # right after the external commit), or another worker's that the
        # ledger finds abandoned: the outcome is unknown, never "not done".
        # A live attempt of another worker raises
        # OperationBusyError: nobody can know its outcome yet, and a human
        # verdict now could contradict what that worker records.
        if op.claimed_by == self.worker:
            reason = "this worker's call returned but its result was not recorded"
        else:
            reason = f"found IN_FLIGHT under worker {op.claimed_by}, which no longer runs it"
        try:
            return self.ledger.recover_attempt(
                op.operation_id, attempt=op.attempt, worker=self.worker, reason=reason
            )
        except ClaimLostError:
            # It moved on meanwhile (its worker recorded a result, or another
            # recovery won): follow its state.
            fresh = self.ledger.get(op.operation_id)
            assert fresh is not None
            return fresh

    def _running(self, op: Operation) -> bool:
        """Whether this process is inside the tool call of ``op``'s current attempt."""
        with _CALLS_LOCK:
            return _CALLS[(self.worker, op.operation_id, op.attempt)] > 0

    def _recover_unknown(
        self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation
    ) -> Operation | Outcome:
        # The tool's contract, not the state machine, decides.
        if spec.reconciler is not None:
            lookup = self._lookup(spec, args, call, op)
            if lookup.status == "found" and lookup.result is not None:
                return self._found(op, lookup.result, lookup.detail)
            if lookup.status == "unavailable":
                # Cannot ask -> stop submitting, keep it visible (NEEDS_RECONCILIATION).
                return self._park(op, spec, f"lookup unavailable: {lookup.detail}")
            final = spec.not_found_is_final and self._attempt_ended(op)
            if final or spec.kind is EffectKind.KEYED:
                return self._retry_or_settle(
                    op, spec, f"lookup: not found ({lookup.detail})", known_not_applied=final
                )
            if spec.not_found_is_final:
                return self._park(
                    op,
                    spec,
                    f"lookup: not found ({lookup.detail}), but attempt {op.attempt} was "
                    "started by a worker that is not proven gone (stopped or suspended, "
                    "another host or container): it may still complete",
                )
            return self._park(
                op,
                spec,
                f"lookup: not found, and not-found is not final for {spec.name} ({lookup.detail})",
            )
        if spec.kind in (EffectKind.IDEMPOTENT, EffectKind.KEYED):
            return self._retry_or_settle(
                op, spec, f"{spec.kind.value} tool: a repeat is safe", known_not_applied=False
            )
        return self._park(op, spec, f"{spec.kind.value} tool: a repeat could duplicate the effect")

    def _attempt_ended(self, op: Operation) -> bool:
        """Whether the worker that started ``op``'s last attempt can no longer act on it.

        "Not found is final" (the tool's contract) holds only once the attempt is over:
        a mail client stopped mid-send (SIGSTOP, a suspended VM) still sends
        when it resumes, after its lease expired and this worker took the
        thread; fencing refuses its late ledger write, not its mail. Over
        means this worker ran the attempt (the tool returned or raised here),
        or its worker is proven gone (``effectgate._process.owner_is_gone``).
        The worker is read from the claim's event: the row's ``claimed_by``
        is cleared when the attempt leaves IN_FLIGHT.
        """
        claimer = op.claimed_by
        if claimer is None:
            for event in reversed(self.ledger.events(operation_id=op.operation_id)):
                if event.dst is OpState.IN_FLIGHT and event.attempt == op.attempt:
                    claimer = event.detail.get("worker")
                    break
        if not isinstance(claimer, str):
            return False  # no record of who ran it: it may still be running
        return claimer == self.worker or owner_is_gone(claimer)

    def _recheck_parked(
        self, call: EffectCall, spec: ToolSpec, args: Any, op: Operation
    ) -> Operation | Outcome:
        # Evidence may have arrived since the operation was parked (the lookup
        # service is back): ask again before bothering a human. Only "found"
        # settles it; anything else still needs the human.
        if spec.reconciler is not None:
            lookup = self._lookup(spec, args, call, op)
            if lookup.status == "found" and lookup.result is not None:
                return self._found(op, lookup.result, lookup.detail)
        return self._needs_human(op, spec, "")

    def _found(self, op: Operation, result: ToolResult, detail: str) -> Outcome:
        """Settle an UNKNOWN or parked operation from a lookup that found its effect."""
        receipt = self._receipt(op, result, source="reconcile")
        op = self.ledger.transition(
            op.operation_id,
            src=op.state,
            dst=OpState.SUCCEEDED,
            receipt=receipt,
            detail={"reconcile": detail or "found"},
        )
        return Outcome(
            status=DispatchStatus.SUCCEEDED,
            operation=op,
            receipt=receipt,
            message="reconciled: the earlier attempt had taken effect",
        )

    def _lookup(self, spec: ToolSpec, args: Any, call: EffectCall | None, op: Operation) -> Lookup:
        assert spec.reconciler is not None
        try:
            return spec.reconciler(args, self._context(call, op))
        except Exception as exc:  # noqa: BLE001 - see the comment below
            # A reconciler must answer "unavailable" rather than raise; one that
            # raises cannot tell us anything either.
            return Lookup.unavailable(f"lookup raised {type(exc).__name__}: {exc}")

    def _retry_or_settle(
        self, op: Operation, spec: ToolSpec, why: str, *, known_not_applied: bool
    ) -> Operation | Outcome:
        now = self.clock.now()
        budget = op.budget
        in_time = budget.deadline_at is None or now < budget.deadline_at
        if op.attempt < op.attempts_allowed and in_time:
            return self.ledger.transition(
                op.operation_id,
                src=OpState.UNKNOWN,
                dst=OpState.RETRY_WAIT,
                next_attempt_at=now,
                detail={"recovery": why, "maybe_applied": not known_not_applied},
            )
        if known_not_applied:
            return self.ledger.transition(
                op.operation_id,
                src=OpState.UNKNOWN,
                dst=OpState.FAILED,
                error=f"not applied ({why}); no attempts or time left",
                detail={"recovery": why},
            )
        # An exhausted budget on a maybe-applied write is not FAILED (known not applied).
        return self._park(op, spec, f"{why}, but no attempts or time left")

    def _park(self, op: Operation, spec: ToolSpec | None, why: str) -> Outcome:
        if op.state is OpState.UNKNOWN:
            op = self.ledger.transition(
                op.operation_id,
                src=OpState.UNKNOWN,
                dst=OpState.NEEDS_RECONCILIATION,
                detail={"reason": why},
            )
        return self._needs_human(op, spec, why)

    def _needs_human(self, op: Operation, spec: ToolSpec | None, why: str) -> Outcome:
        evidence = {
            "operation_id": op.operation_id,
            "tool": op.tool,
            "args": dict(op.args),
            "state": op.state.value,
            "attempt": op.attempt,
            "max_attempts": op.budget.max_attempts,
            "recoveries": op.recoveries,
            "last_error": op.error,
            "why": why or (op.error or "outcome unknown"),
            "effect_kind": spec.kind.value if spec is not None else None,
        }
        late = self._late_results(op)
        if late:
            evidence["late_results"] = late
        return Outcome(
            status=DispatchStatus.NEEDS_RECONCILIATION,
            operation=op,
            message=f"outcome unknown; a human must reconcile: {evidence['why']}",
            evidence=evidence,
        )

    def _late_results(self, op: Operation) -> list[dict[str, Any]]:
        """What fenced-off attempts reported after recovery moved on (``record_result``).

        Evidence for the human: a late "succeeded" with its result says the
        effect probably happened, though the ledger could not take it as
        the operation's outcome.
        """
        return [
            {"attempt": e.detail.get("fenced_attempt"), "at": e.at.isoformat(), **e.detail}
            for e in self.ledger.events(operation_id=op.operation_id)
            if e.kind is EventKind.NOTE and "late_result" in e.detail
        ]

    # ------------------------------------------------------- human verdicts

    def apply_verdict(self, operation_id: str, verdict: Verdict) -> Operation:
        """Apply a human's reconciliation verdict; see ``effectgate.answers.apply_verdict``.

        A ``failed`` verdict ("it did not take effect") on a tool with a
        lookup is checked against the lookup first: evidence may have arrived
        since the operation was parked (a stopped worker's mail that landed
        late). Recording "not applied" for an effect the lookup finds would
        invite the model to do it again; so would recording it while the
        lookup cannot answer, which is refused unless the verdict accepts
        that risk (``acknowledge_duplicate_risk: true``).

        Idempotent (``effectgate.answers.settle_verdict``): the same verdict
        again for an attempt it already settled returns the operation as
        recorded; a different one is refused, naming the recorded verdict,
        and the refusal is written to the ledger as a ``note`` event.

        Returns:
            The operation after the verdict (or as recorded, for a repeat).

        Raises:
            DecisionError: a verdict ``validate_verdict`` refuses (unknown
                keys, a reference that is not a non-empty string, ``retry``
                without the acknowledgement), ``retry`` with no attempts
                left, an unknown operation, ``failed`` for an effect the
                lookup now finds, ``failed`` while the lookup cannot answer
                (unless ``acknowledge_duplicate_risk`` is true: recorded
                unchecked), or a verdict that contradicts the one
                recorded (or names an attempt nobody asked about).
        """
        verdict = validate_verdict(verdict)  # a public entry: never trust the caller's shape
        op = self.ledger.get(operation_id)
        if op is not None and settle_verdict(self.ledger, operation_id, verdict) is not None:
            return op  # the same verdict again: the recorded outcome
        if verdict.get("verdict") == "failed":
            self._refuse_if_found(operation_id, unchecked=verdict.get("acknowledge_duplicate_risk"))
        return apply_verdict(self.ledger, operation_id, verdict, now=self.clock.now())

    def _refuse_if_found(self, operation_id: str, *, unchecked: bool | None) -> None:
        op = self.ledger.get(operation_id)
        spec = self.tools.get(op.tool) if op is not None else None
        if op is None or spec is None or spec.reconciler is None:
            return
        try:
            args = spec.normalize(dict(op.args), tool_call_id=op.tool_call_id)
        except ToolCallError:
            return
        lookup = self._lookup(spec, args, None, op)
        if lookup.status == "found":
            raise DecisionError(
                f"verdict 'failed' refused for {operation_id!r}: the lookup now finds the "
                f"effect ({lookup.detail or 'found'}); it took effect, answer 'succeeded'"
            )
        if (
            lookup.status == "not_found"
            and not unchecked
            and not (spec.not_found_is_final and self._attempt_ended(op))
        ):
            # "Not found" is the truth only once the attempt can no longer act:
            # a worker stopped mid-send (SIGSTOP) still sends when it resumes.
            why = (
                f"attempt {op.attempt} was started by a worker that is not proven gone "
                "(stopped or suspended, another host): it may still complete"
                if spec.not_found_is_final
                else f"not-found is not final for {spec.name}"
            )
            raise DecisionError(
                f"verdict 'failed' refused for {operation_id!r}: the lookup does not find "
                f"it now ({lookup.detail or 'not found'}), but {why}; nothing was recorded. "
                "Ask again once that worker is gone or has finished; or give 'failed' with "
                "acknowledge_duplicate_risk: true (effectgate reconcile --failed --unchecked) "
                "to record it unchecked, knowing it may yet take effect"
            )
        if lookup.status == "unavailable" and not unchecked:
            raise DecisionError(
                f"verdict 'failed' refused for {operation_id!r}: the lookup cannot tell now "
                f"whether it took effect ({lookup.detail or 'unavailable'}); nothing was "
                "recorded. Ask again once the lookup answers; answer 'succeeded' with the "
                "reference if it took effect; or give 'failed' with "
                "acknowledge_duplicate_risk: true (effectgate reconcile --failed --unchecked) "
                "to record it unchecked, knowing the model may then do it again"
            )


def _jsonable(value: Any) -> Any:
    """Return ``value`` if it survives JSON, else its JSON round-trip via ``str``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=str))
    return value
