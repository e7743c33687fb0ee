"""The dispatch protocol against a real SQLite ledger and scripted tools.

The protocol and the tool contracts are described in docs/architecture.md.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from effectgate.dispatch import Dispatcher, DispatchStatus, EffectCall
from effectgate.errors import DecisionError, NotAccepted, OutcomeUnknown, Rejected
from effectgate.graph import new_worker_id
from effectgate.ledger import Approval, Budget, OpenRequest, OpState, SqliteLedger
from effectgate.testing import FakeClock
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec


class Args(BaseModel):
    key: str


@dataclass
class Script:
    """What the fake external system does on each call, and what lookups answer."""

    calls: list[Callable[[], Any]] = field(default_factory=list)
    lookups: list[Lookup] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)

    def call(self, args: Args, ctx: ToolContext) -> ToolResult:
        self.seen.append(ctx.attempt)
        step = self.calls.pop(0)
        return step() if callable(step) else step

    def lookup(self, args: Args, ctx: ToolContext) -> Lookup:
        return self.lookups.pop(0)


def ok(value: str = "done") -> Callable[[], ToolResult]:
    return lambda: ToolResult(value={"v": value}, reference=value)


def raises(exc: Exception) -> Callable[[], Any]:
    def go() -> Any:
        raise exc

    return go


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as led:
        yield led


def make(
    ledger: SqliteLedger,
    clock: FakeClock,
    script: Script,
    *,
    kind: EffectKind,
    reconciler: bool = False,
    final: bool = False,
    budget: Budget | None = None,
    ttl: timedelta | None = None,
) -> tuple[Dispatcher, EffectCall]:
    spec = ToolSpec(
        name="t",
        description="test tool",
        args_schema=Args,
        func=script.call,
        kind=kind,
        reconciler=script.lookup if reconciler else None,
        not_found_is_final=final,
    )
    args = spec.normalize({"key": "k"})
    ihash = spec.intent_hash(args)
    now = clock.now()
    ledger.record_review(
        [
            OpenRequest(
                operation_id="op1",
                thread_id="th",
                tool_call_id="c1",
                tool="t",
                tool_version="1",
                args={"key": "k"},
                intent_hash=ihash,
                budget=budget or Budget(max_attempts=3, backoff_base_s=1.0),
            )
        ],
        [
            Approval(
                operation_id="op1",
                thread_id="th",
                tool_call_id="c1",
                decision="approve",
                intent_hash=ihash,
                reviewer="r",
                decided_at=now,
                expires_at=now + ttl if ttl else None,
            )
        ],
    )
    dispatcher = Dispatcher(ledger, {"t": spec}, worker="w1", clock=clock)
    call = EffectCall(
        thread_id="th",
        tool_call_id="c1",
        tool="t",
        args={"key": "k"},
        operation_id="op1",
        intent_hash=ihash,
    )
    return dispatcher, call


def test_success_then_stored_receipt_reused(ledger: SqliteLedger, clock: FakeClock) -> None:
    """The first dispatch calls once; every later dispatch returns the verified receipt."""
    script = Script(calls=[ok("R1")])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT)
    first = d.dispatch(call)
    again = d.dispatch(call)
    assert (first.status, again.status) == (DispatchStatus.SUCCEEDED, DispatchStatus.SUCCEEDED)
    assert again.reused and again.receipt is not None and again.receipt.reference == "R1"
    assert script.seen == [1]
    assert ledger.metrics().results_reused >= 1


def test_transient_then_success_waits_full_jitter(ledger: SqliteLedger, clock: FakeClock) -> None:
    """NotAccepted -> RETRY_WAIT with a stored next attempt time; the wait happens on the clock."""
    script = Script(calls=[raises(NotAccepted("busy", retry_after=timedelta(seconds=2))), ok()])
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED)
    out = d.dispatch(call)
    assert out.status is DispatchStatus.SUCCEEDED and script.seen == [1, 2]
    assert clock.slept and clock.slept[0] >= 2.0  # Retry-After honoured
    dsts = [e.dst for e in ledger.events(operation_id="op1") if e.dst]
    assert OpState.RETRY_WAIT in dsts


def test_not_accepted_every_time_is_failed_known_not_applied(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """Budget spent on attempts that were all known not applied: FAILED."""
    script = Script(calls=[raises(NotAccepted("503")), raises(NotAccepted("503"))])
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED, budget=Budget(max_attempts=2))
    out = d.dispatch(call)
    assert out.status is DispatchStatus.FAILED and script.seen == [1, 2]


def test_budget_spent_after_maybe_applied_attempt_is_not_failed(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """Attempt 1 unknown, attempt 2 not accepted, no budget left: NEEDS_RECONCILIATION."""
    script = Script(
        calls=[raises(OutcomeUnknown("timeout")), raises(NotAccepted("503"))],
        lookups=[Lookup.not_found("no row yet"), Lookup.not_found("still none")],
    )
    d, call = make(
        ledger, clock, script, kind=EffectKind.KEYED, reconciler=True, budget=Budget(max_attempts=2)
    )
    out = d.dispatch(call)
    assert out.status is DispatchStatus.NEEDS_RECONCILIATION, out
    op = ledger.get("op1")
    assert op is not None and (op.state, op.attempt) == (OpState.NEEDS_RECONCILIATION, 2)


def test_rejected_after_maybe_applied_attempt_is_not_failed(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """An idempotent retry rejected after an unknown first attempt stays unknown for a human."""
    script = Script(calls=[raises(OutcomeUnknown("reset")), raises(Rejected("422"))])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT, budget=Budget(max_attempts=2))
    out = d.dispatch(call)
    assert out.status is DispatchStatus.NEEDS_RECONCILIATION
    assert script.seen == [1, 2]


def test_rejected_first_time_fails_at_once(ledger: SqliteLedger, clock: FakeClock) -> None:
    """A permanent refusal is FAILED with no retry."""
    script = Script(calls=[raises(Rejected("no"))])
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED)
    assert d.dispatch(call).status is DispatchStatus.FAILED and script.seen == [1]


def test_reconcilable_found_keeps_attempt(ledger: SqliteLedger, clock: FakeClock) -> None:
    """Unknown -> lookup finds it -> SUCCEEDED from the lookup, attempts 1."""
    script = Script(calls=[raises(OutcomeUnknown("t/o"))], lookups=[Lookup.found({"id": 7}, "7")])
    d, call = make(
        ledger, clock, script, kind=EffectKind.KEYED, reconciler=True, budget=Budget(max_attempts=1)
    )
    out = d.dispatch(call)
    assert out.status is DispatchStatus.SUCCEEDED and out.receipt is not None
    assert (out.receipt.source, out.receipt.attempt, script.seen) == ("reconcile", 1, [1])


def test_lookup_unavailable_parks(ledger: SqliteLedger, clock: FakeClock) -> None:
    """Lookup unavailable -> NEEDS_RECONCILIATION, no second submission."""
    script = Script(calls=[raises(OutcomeUnknown("t/o"))], lookups=[Lookup.unavailable("503")])
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED, reconciler=True)
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    assert script.seen == [1]


def test_unsafe_unknown_parks(ledger: SqliteLedger, clock: FakeClock) -> None:
    """An unsafe tool's unknown outcome is never retried."""
    script = Script(calls=[raises(OutcomeUnknown("?"))])
    d, call = make(ledger, clock, script, kind=EffectKind.UNSAFE)
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    assert script.seen == [1]


def test_verdicts_bind_to_attempt_and_are_idempotent(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """A verdict for another attempt changes nothing; a retry needs the acknowledgement."""
    script = Script(calls=[raises(OutcomeUnknown("?")), ok("after")])
    d, call = make(ledger, clock, script, kind=EffectKind.UNSAFE)
    d.dispatch(call)
    assert d.apply_verdict("op1", {"verdict": "failed", "attempt": 5}).state is (
        OpState.NEEDS_RECONCILIATION
    )
    op = d.apply_verdict(
        "op1", {"verdict": "retry", "attempt": 1, "acknowledge_duplicate_risk": True}
    )
    assert op.state is OpState.RETRY_WAIT
    assert d.dispatch(call).status is DispatchStatus.SUCCEEDED and script.seen == [1, 2]
    with pytest.raises(DecisionError):
        d.apply_verdict("nope", {"verdict": "failed"})


def test_dead_workers_in_flight_becomes_unknown(ledger: SqliteLedger, clock: FakeClock) -> None:
    """IN_FLIGHT claimed by another (dead) worker of this thread is UNKNOWN, never "not done"."""
    script = Script(calls=[ok()])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT)
    ledger.claim("op1", attempt=1, worker="dead-worker")
    out = d.dispatch(call)
    assert out.status is DispatchStatus.SUCCEEDED and script.seen == [2]
    pairs = [(e.src, e.dst) for e in ledger.events(operation_id="op1")]
    assert (OpState.IN_FLIGHT, OpState.UNKNOWN) in pairs


def test_expired_approval_goes_back_to_review(ledger: SqliteLedger, clock: FakeClock) -> None:
    """An approval past expires_at is withdrawn before any attempt."""
    script = Script(calls=[ok()])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT, ttl=timedelta(minutes=1))
    clock.advance(timedelta(minutes=2))
    out = d.dispatch(call)
    assert out.status is DispatchStatus.NEEDS_REVIEW and "expired" in out.message
    op = ledger.get("op1")
    assert op is not None and op.state is OpState.PROPOSED and script.seen == []


def test_other_intent_is_a_conflict(ledger: SqliteLedger, clock: FakeClock) -> None:
    """Same operation id, other arguments: refused, stored result not reused, nothing called."""
    script = Script(calls=[ok()])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT)
    spec = d.tools["t"]
    other = spec.intent_hash(spec.normalize({"key": "other"}))
    from dataclasses import replace

    out = d.dispatch(replace(call, args={"key": "other"}, intent_hash=other))
    assert out.status is DispatchStatus.CONFLICT and script.seen == []


def test_deadline_passed_while_waiting_after_unknown(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """A retry of a maybe-applied write that cannot start before the deadline is parked."""
    deadline = clock.now() + timedelta(seconds=30)
    script = Script(calls=[raises(OutcomeUnknown("t/o"))])
    d, call = make(
        ledger,
        clock,
        script,
        kind=EffectKind.IDEMPOTENT,
        budget=Budget(max_attempts=3, deadline_at=deadline),
    )
    # first attempt ends UNKNOWN; the recovery retries at once unless time is up
    orig = d._retry_or_settle

    def late(*a: Any, **kw: Any) -> Any:
        result = orig(*a, **kw)
        clock.advance(timedelta(minutes=5))
        return result

    d._retry_or_settle = late  # type: ignore[method-assign]
    out = d.dispatch(call)
    assert out.status is DispatchStatus.NEEDS_RECONCILIATION
    assert script.seen == [1]


def test_parked_operation_is_looked_up_again_on_the_next_dispatch(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """Once the lookup service is back, a parked operation settles without a human."""
    script = Script(
        calls=[raises(OutcomeUnknown("t/o"))],
        lookups=[
            Lookup.unavailable("503"),
            Lookup.unavailable("still 503"),
            Lookup.found({"id": 9}, "9"),
        ],
    )
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED, reconciler=True)
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    out = d.dispatch(call)
    assert out.status is DispatchStatus.SUCCEEDED and out.receipt is not None
    assert out.receipt.source == "reconcile" and script.seen == [1]


def _dead_worker_id() -> str:
    """A worker id of this host and scope whose process has exited."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from effectgate._process import new_worker_id; print(new_worker_id())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return child.stdout.strip()


@pytest.mark.parametrize(
    ("claimer", "expected_state", "attempts"),
    [
        # a worker id of this very process but another agent: alive
        ("live", OpState.NEEDS_RECONCILIATION, []),
        # same host, scope, pid gone: the attempt is over, "not found" is final
        ("dead", OpState.SUCCEEDED, [2]),
        # a pid of this host in another PID namespace / boot: proves nothing
        ("other-scope", OpState.NEEDS_RECONCILIATION, []),
        # an id from before scopes existed: proves nothing
        ("legacy", OpState.NEEDS_RECONCILIATION, []),
    ],
)
def test_not_found_is_final_only_once_the_attempts_worker_is_gone(
    ledger: SqliteLedger,
    clock: FakeClock,
    claimer: str,
    expected_state: OpState,
    attempts: list[int],
) -> None:
    """A reconcilable tool's "not found" is final only if the attempt cannot still complete.

    The attempt was claimed by another worker (a runner that lost the thread's
    lease, e.g. stopped with SIGSTOP past the lease's TTL): if that worker may
    still be running, its send may still land, so a retry could duplicate it.
    """
    dead = _dead_worker_id()
    host, pid, _, scope = dead.split(":", 3)
    worker = {
        "live": new_worker_id(),
        "dead": dead,
        "other-scope": f"{host}:{pid}:abcd1234:{scope.split('/')[0]}/1",
        "legacy": f"{host}:{pid}:abcd1234",
    }[claimer]
    script = Script(calls=[ok("second")], lookups=[Lookup.not_found("no such Message-ID")])
    d, call = make(ledger, clock, script, kind=EffectKind.RECONCILABLE, reconciler=True, final=True)
    ledger.claim("op1", attempt=1, worker=worker)
    out = d.dispatch(call)
    op = ledger.get("op1")
    assert op is not None and op.state is expected_state, out.message
    assert script.seen == attempts
    if expected_state is OpState.NEEDS_RECONCILIATION:
        assert "not proven gone" in out.message


def test_a_failed_verdict_is_refused_when_the_lookup_now_finds_the_effect(
    ledger: SqliteLedger, clock: FakeClock
) -> None:
    """Parked with "not found"; the late effect lands; a human says "failed": refused,
    and the next dispatch settles it from the lookup (no second attempt)."""
    script = Script(
        calls=[raises(OutcomeUnknown("t/o"))],
        lookups=[
            Lookup.unavailable("503"),  # parks it
            Lookup.found({"id": 7}, "7", "late"),  # the verdict's check
            Lookup.found({"id": 7}, "7", "late"),  # the next dispatch's recheck
        ],
    )
    d, call = make(ledger, clock, script, kind=EffectKind.KEYED, reconciler=True)
    assert d.dispatch(call).status is DispatchStatus.NEEDS_RECONCILIATION
    with pytest.raises(DecisionError, match="the lookup now finds the effect"):
        d.apply_verdict("op1", {"verdict": "failed", "attempt": 1})
    op = ledger.get("op1")
    assert op is not None and op.state is OpState.NEEDS_RECONCILIATION
    out = d.dispatch(call)
    assert out.status is DispatchStatus.SUCCEEDED and script.seen == [1]


@pytest.mark.parametrize(
    ("claimer", "expected_state", "attempts"),
    [
        # the last attempt's worker died: the attempt is given back, the call runs
        ("dead", OpState.SUCCEEDED, [2]),
        # a worker not proven gone: its attempt is charged, none is left
        ("other-scope", OpState.NEEDS_RECONCILIATION, []),
    ],
)
def test_the_last_attempt_cut_short_by_a_death_is_given_back(
    ledger: SqliteLedger,
    clock: FakeClock,
    claimer: str,
    expected_state: OpState,
    attempts: list[int],
) -> None:
    """``max_attempts=1`` and its one attempt died with its worker: a death is not a failure.

    Before attempts were given back the reconcilable call ended FAILED ("not
    applied; no attempts or time left") and the model was told so, although
    the tool never got to answer.
    """
    dead = _dead_worker_id()
    host, pid, _, scope = dead.split(":", 3)
    worker = {"dead": dead, "other-scope": f"{host}:{pid}:abcd1234:{scope.split('/')[0]}/1"}
    script = Script(calls=[ok("sent")], lookups=[Lookup.not_found("no such Message-ID")])
    d, call = make(
        ledger,
        clock,
        script,
        kind=EffectKind.RECONCILABLE,
        reconciler=True,
        final=True,
        budget=Budget(max_attempts=1),
    )
    ledger.claim("op1", attempt=1, worker=worker[claimer])
    out = d.dispatch(call)
    op = ledger.get("op1")
    assert op is not None and op.state is expected_state, out.message
    assert script.seen == attempts
    assert op.recoveries == (1 if claimer == "dead" else 0)


def test_two_dispatches_of_one_operation_in_one_process_call_the_tool_once(
    ledger: SqliteLedger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of one thread at once in one process (same worker id): one call, one receipt.

    Both mark the attempt as running before their claims; the loser's
    unmarking unmarked the winner's call, so the loser took it for a call
    that returned without its result and called again (a second mail with
    two ``graph.ainvoke`` at once; a fresh user).
    """
    import threading

    release = threading.Event()

    def slow() -> ToolResult:
        release.wait(10)
        return ToolResult(value={"v": "R1"}, reference="R1")

    script = Script(calls=[slow, ok("R2")])
    d, call = make(ledger, clock, script, kind=EffectKind.IDEMPOTENT)
    both_marked = threading.Barrier(2)
    claim = ledger.claim

    def claim_after_both(*args: Any, **kwargs: Any) -> Any:
        both_marked.wait(10)  # both dispatches marked the attempt, then both claim
        return claim(*args, **kwargs)

    monkeypatch.setattr(ledger, "claim", claim_after_both)
    outcomes: list[Any] = []
    runs = [threading.Thread(target=lambda: outcomes.append(d.dispatch(call))) for _ in range(2)]
    for run in runs:
        run.start()
    threading.Timer(0.5, release.set).start()
    for run in runs:
        run.join(20)
    assert script.seen == [1]  # the tool was called once, by the claim's winner
    assert [o.status for o in outcomes] == [DispatchStatus.SUCCEEDED] * 2
    assert ledger.get("op1").state is OpState.SUCCEEDED  # type: ignore[union-attr]


@pytest.mark.parametrize("claimer", ["live", "dead"])
def test_a_failed_verdict_on_not_found_needs_the_attempts_worker_gone_or_the_risk_accepted(
    ledger: SqliteLedger, clock: FakeClock, claimer: str
) -> None:
    """Parked because the attempt's worker may still send (SIGSTOP past its lease): a
    human's "failed" on the lookup's "not found" is refused while that worker is not
    proven gone (its mail landed after the verdict in a break test, FAILED kept); with
    ``acknowledge_duplicate_risk`` it is recorded; once the worker is gone, at once."""
    worker = new_worker_id() if claimer == "live" else _dead_worker_id()
    script = Script(
        calls=[],
        lookups=[Lookup.not_found("no such Message-ID")] * 3,
    )
    d, call = make(ledger, clock, script, kind=EffectKind.RECONCILABLE, reconciler=True, final=True)
    ledger.claim("op1", attempt=1, worker=worker)
    verdict: dict[str, Any] = {"verdict": "failed", "evidence": "not in the inbox"}
    if claimer == "live":
        parked = d.dispatch(call)
        assert parked.operation is not None
        assert parked.operation.state is OpState.NEEDS_RECONCILIATION
        with pytest.raises(DecisionError, match="may still complete"):
            d.apply_verdict("op1", verdict)  # type: ignore[arg-type]
        assert ledger.get("op1").state is OpState.NEEDS_RECONCILIATION  # type: ignore[union-attr]
        verdict["acknowledge_duplicate_risk"] = True
    else:
        ledger.recover_in_flight(thread_id="th", worker="w1")
        ledger.transition("op1", src=OpState.UNKNOWN, dst=OpState.NEEDS_RECONCILIATION)
    op = d.apply_verdict("op1", verdict)  # type: ignore[arg-type]
    assert op.state is OpState.FAILED
    assert script.seen == []  # nothing was called
