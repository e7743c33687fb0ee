"""What the ledger conformance suite stands on: request and receipt makers, and its base class.

``StoreSuite`` opens ledgers over the subclass's ``make_store`` on a fake
clock and closes them after each test; ``LedgerConformance``
(``testing/ledger_conformance.py``) and ``LeaseConformance``
(``testing/_lease_conformance.py``) are its tests. The makers are public
through ``effectgate.testing.ledger_conformance``, where other suites import them.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from effectgate._clock import FakeClock
from effectgate._intent import intent_hash
from effectgate.ledger import (
    Approval,
    Budget,
    EventKind,
    Ledger,
    LedgerStore,
    OpenRequest,
    Operation,
    Receipt,
)
from effectgate.ledger._store import NewEvent

__all__ = [
    "StoreSuite",
    "dead_worker_id",
    "make_approval",
    "make_receipt",
    "make_request",
    "note_event",
    "open_fields",
]


def make_request(
    operation_id: str = "t1:c1",
    *,
    thread_id: str = "t1",
    tool: str = "write_file",
    args: Mapping[str, Any] | None = None,
    budget: Budget | None = None,
) -> OpenRequest:
    """Build a valid ``OpenRequest`` (its intent hash matches its arguments)."""
    args = dict(args if args is not None else {"path": "notes.txt", "content": operation_id})
    return OpenRequest(
        operation_id=operation_id,
        thread_id=thread_id,
        tool_call_id=operation_id.rsplit(":", 1)[-1],
        tool=tool,
        tool_version="1",
        args=args,
        intent_hash=intent_hash(tool, "1", args),
        budget=budget,
    )


def make_approval(
    op: Operation | OpenRequest,
    clock: FakeClock,
    *,
    decision: str = "approve",
    reviewer: str = "alice",
    message: str | None = None,
) -> Approval:
    """Build an approval of ``op``'s exact intent, decided now."""
    return Approval(
        operation_id=op.operation_id,
        thread_id=op.thread_id,
        tool_call_id=op.tool_call_id,
        decision=decision,  # type: ignore[arg-type]
        intent_hash=op.intent_hash,
        reviewer=reviewer,
        message=message,
        decided_at=clock.now(),
    )


def make_receipt(op: Operation, clock: FakeClock, *, result: Any = None) -> Receipt:
    """Build the receipt of ``op``'s current attempt."""
    return Receipt(
        operation_id=op.operation_id,
        intent_hash=op.intent_hash,
        attempt=op.attempt,
        result={"ok": True} if result is None else result,
        reference=f"ref-{op.operation_id}",
        recorded_at=clock.now(),
    )


@functools.cache
def dead_worker_id() -> str:
    """A worker id of this host and PID namespace whose process has exited (a ``kill -9`` left it).

    Made by a child interpreter that prints its own ``new_worker_id()`` and
    exits, so ``owner_is_gone`` proves it gone. Cached per process: the pid
    could in principle be reused later, which would only make it "alive".
    """
    child = subprocess.run(
        [sys.executable, "-c", "from effectgate._process import new_worker_id as n; print(n())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return child.stdout.strip()


class StoreSuite(abc.ABC):
    """The base of the conformance suites: a subclass implements ``make_store``."""

    @abc.abstractmethod
    def make_store(self, name: str) -> LedgerStore:
        """Return a store over the storage called ``name`` (same name, same data)."""

    @pytest.fixture(autouse=True)
    def _conformance_lifecycle(self) -> Iterator[None]:
        self.clock = FakeClock()
        self._opened: list[Ledger] = []
        yield
        for ledger in self._opened:
            ledger.close()

    def damage_arguments(self, name: str, operation_id: str) -> None:
        """Rewrite a stored operation's arguments behind the ledger's back (its guards off).

        The row then fails validation (its intent hash no longer matches).
        A store suite overrides this with its own SQL; the default skips the
        tests that need it.
        """
        pytest.skip("this store suite offers no way to damage a stored row")

    def ledger(self, name: str = "main") -> Ledger:
        """Open a ``Ledger`` over ``name`` on the suite's fake clock (closed after the test)."""
        ledger = Ledger(self.make_store(name), clock=self.clock)
        self._opened.append(ledger)
        return ledger

    def approved(self, ledger: Ledger, req: OpenRequest | None = None) -> Operation:
        """Open ``req`` and approve it in one review; return the APPROVED operation."""
        req = req or make_request()
        (op,) = ledger.record_review([req], [make_approval(req, self.clock)])
        return op

    def in_flight(self, ledger: Ledger, req: OpenRequest | None = None) -> Operation:
        """Open, approve and claim attempt 1."""
        op = self.approved(ledger, req)
        return ledger.claim(op.operation_id, attempt=1, worker="w1")


def note_event(op: Operation, clock: FakeClock) -> NewEvent:
    """A bare ``note`` event for ``op`` at the clock's time, as a store appends it."""
    kind, at = EventKind.NOTE, clock.now()
    return NewEvent(
        operation_id=op.operation_id, kind=kind, src=None, dst=None, attempt=0, at=at, detail={}
    )


def open_fields(req: OpenRequest) -> dict[str, Any]:
    """``req``'s fields as ``Ledger.open`` keywords."""
    return {f.name: getattr(req, f.name) for f in dataclasses.fields(req)}
