"""Thread records and per-thread leases: the part of ``Ledger`` that is about runs, not operations.

A thread's lease keeps two runners off one LangGraph thread (LangGraph: two
workers on one thread must not fork it). Its token is a fencing token that
grows each time the lease changes hands (Kleppmann, *How to do distributed
locking*, 2016); a released lease keeps its row so the next owner's token is
still higher.

On SQLite, lease writes commit with ``synchronous=NORMAL``: they are atomic
and visible to every process at once (WAL), and a lease only coordinates
*live* processes, so losing the last lease write to a power cut, which kills
every holder too, cannot let two runners in. That saves two fsyncs per run
(benchmarks/README.md, "lease_normal").

That argument does not hold where the database is a server of its own: a
crash of the PostgreSQL server loses its asynchronous commits while the
workers that saw them go on running. A lost takeover hands the row back to
the old holder, whose renewal then succeeds while the new one runs on; a
lost renewal leaves an expiry another owner may take the thread at. Two
runners on one thread fork it (the PostgreSQL fault campaign saw a mail sent
twice that way). So a store says whether its lease writes must be durable
(``durable_leases``, ``True`` on ``PostgresLedgerStore``); tests/postgres/
test_lease_server_crash.py crashes a server right after each lease write.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from effectgate._clock import Clock, to_seconds
from effectgate._recent import Recent
from effectgate.errors import LedgerCorruptError, ThreadBusyError
from effectgate.ledger._model import DamagedThread, Lease, ThreadEvent, ThreadRecord
from effectgate.ledger._store import LedgerStore

__all__ = ["ThreadsMixin", "durable_leases"]


def durable_leases(store: LedgerStore) -> bool:
    """Whether ``store``'s lease writes must commit durably (its ``durable_leases``).

    ``True`` for a store on a database server that can crash and recover
    while its clients live on (``PostgresLedgerStore``); ``False`` (the
    default, for a store without the attribute) where losing the last lease
    write also ends every process that saw it (SQLite on the workers' host).
    """
    return bool(getattr(store, "durable_leases", False))


_NOBODY = "nobody"


def _ttl(ttl: timedelta | float) -> timedelta:
    seconds = to_seconds(ttl)
    if seconds <= 0:
        raise ValueError(f"a lease needs a positive ttl, got {seconds} s")
    return timedelta(seconds=seconds)


GIVEN_UP = datetime(1970, 1, 1, tzinfo=UTC)
"""The expiry a released or broken lease is stored with: the Unix epoch, not "now".

Giving a lease up is a state, not a moment. Two runners' clocks can disagree
by a little (each ``DatabaseClock`` estimates the PostgreSQL server's time to
within its round trip; a wall clock can be stepped back by NTP), so a lease
released "now" by one clock could still look held for that little while by the
next runner's clock, which is then refused with "expires in 0.0 s". The epoch
is in the past by every clock.
"""


def _floor_ms(value: datetime) -> datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


class ThreadsMixin:
    """Thread records and leases of ``Ledger``; every write is one durable transaction."""

    _store: LedgerStore
    _given_up: Recent[str, Lease]
    """The lease this ledger object last gave up, per thread, as it stored it.

    A runner that takes a thread again (the next resume of a conversation, a
    worker's next pass) expects the row to hold exactly that: the lease is
    then taken by one compare-and-set against it, without reading the row
    first. Anything else in the row (another runner took it, it was broken)
    fails the compare-and-set and the lease is taken by the full rule.
    """
    clock: Clock

    def _now(self) -> datetime:
        # The store keeps milliseconds; flooring here makes the records a call
        # returns equal to what a later read gives back.
        return _floor_ms(self.clock.now())

    def record_thread(
        self,
        thread_id: str,
        input: Mapping[str, Any],
        metadata: Mapping[str, Any] | None = None,
    ) -> ThreadRecord:
        """Keep the input a thread was started with; write-once.

        Args:
            thread_id: the LangGraph thread.
            input: the JSON-compatible input the run started from.
            metadata: JSON-compatible extras (model, flags) for people.

        Returns:
            The stored record: the existing one if the thread was recorded before.
        """
        record = ThreadRecord(
            thread_id=thread_id,
            input=dict(input),
            metadata=dict(metadata or {}),
            created_at=self._now(),
        )
        with self._store.transaction() as tx:
            return tx.put_thread(record)

    def get_thread(self, thread_id: str) -> ThreadRecord | None:
        """Return a thread's record, or ``None`` if it was never recorded."""
        with self._store.read(single=True) as r:
            return r.get_thread(thread_id)

    def list_threads(
        self, *, damaged: builtins.list[DamagedThread] | None = None
    ) -> builtins.list[ThreadRecord]:
        """Return every recorded thread, oldest first.

        Args:
            damaged: ``None``: a record that fails to decode raises. A list:
                such a record is left out of the listing and appended here
                (``DamagedThread``: thread, table, what is wrong), so one
                damaged row hides one thread, not every thread.

        Raises:
            LedgerCorruptError: a record fails to decode and ``damaged`` is ``None``.
        """
        with self._store.read(single=True) as r:
            try:
                return r.list_threads()
            except LedgerCorruptError:
                if damaged is None:
                    raise
        with self._store.read(single=True) as r:
            ids = r.thread_ids()
        records: builtins.list[ThreadRecord] = []
        for thread_id in ids:
            try:
                record = self.get_thread(thread_id)
            except LedgerCorruptError as exc:
                table = getattr(self._store, "THREADS_TABLE", "threads")
                damaged.append(DamagedThread(thread_id=thread_id, table=table, reason=str(exc)))
                continue
            if record is not None:
                records.append(record)
        return records

    def acquire_lease(
        self,
        thread_id: str,
        owner: str,
        ttl: timedelta | float,
        *,
        take_over_from: str | None = None,
    ) -> Lease:
        """Take (or renew) the thread's lease for ``ttl``; durable if the store's must be.

        The same owner re-acquires its own lease, expired or not, keeping the
        token; another owner gets it only once it has expired or been
        released, with the token incremented.

        Args:
            thread_id: the thread.
            owner: who runs it (e.g. a worker id, ``effectgate._process.new_worker_id``).
            ttl: how long the lease holds unless renewed; ``timedelta`` or float seconds.
            take_over_from: an owner the caller has proven dead (e.g. its process
                is gone); its unexpired lease is taken over, compare-and-set on
                the owner, so two callers cannot both take it.

        Returns:
            The lease now held by ``owner``.

        Raises:
            ThreadBusyError: another owner holds an unexpired lease.
            ValueError: ``ttl`` is not positive.
        """
        span = _ttl(ttl)
        now = self._now()
        last = self._given_up.pop(thread_id, None)
        if last is not None and last.owner == owner:
            # The row most likely still holds what this owner gave up: the
            # rule below would keep the token (same owner) and set the expiry.
            # The compare-and-set makes that so only if the row is that lease.
            lease = replace(last, expires_at=_floor_ms(now + span))
            if self._store.compare_and_set_lease(lease, expected=last):
                return lease
        with self._store.transaction(durable=durable_leases(self._store)) as tx:
            cur = tx.get_lease(thread_id)
            if (
                cur is not None
                and cur.owner not in (owner, take_over_from)
                and cur.expires_at > now
            ):
                raise _busy(cur, now)
            # the token grows only when the lease changes hands
            token = 1 if cur is None else cur.token + (cur.owner != owner)
            lease = Lease(
                thread_id=thread_id, owner=owner, token=token, expires_at=_floor_ms(now + span)
            )
            if not tx.put_lease(lease, expected=cur):
                raise _busy(tx.get_lease(thread_id), now, thread_id=thread_id)
        return lease

    def renew_lease(self, lease: Lease, ttl: timedelta | float) -> Lease:
        """Extend a held lease to ``now + ttl``; durable if the store's leases must be.

        A lease that expired but was not taken by anyone is still this
        owner's and is renewed.

        Raises:
            ThreadBusyError: the lease changed hands (another owner or token).
            ValueError: ``ttl`` is not positive.
        """
        span = _ttl(ttl)
        now = self._now()
        renewed = replace(lease, expires_at=_floor_ms(now + span))
        if self._store.compare_and_set_lease(renewed, expected=lease):
            return renewed  # the row held this very lease: renewed without reading it
        with self._store.transaction(durable=durable_leases(self._store)) as tx:
            cur = tx.get_lease(lease.thread_id)
            if cur is None or (cur.owner, cur.token) != (lease.owner, lease.token):
                raise _busy(cur, now, thread_id=lease.thread_id)
            renewed = replace(cur, expires_at=_floor_ms(now + span))
            if not tx.put_lease(renewed, expected=cur):
                raise _busy(tx.get_lease(lease.thread_id), now, thread_id=lease.thread_id)
        return renewed

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up now; a no-op if it is no longer held by this owner and token.

        The lease is stored as expiring at ``GIVEN_UP`` (the epoch), so every
        runner's clock sees it free at once, whatever their small disagreement.
        When the row holds ``lease`` exactly (as ``acquire_lease`` or
        ``renew_lease`` returned it), one compare-and-set gives it up without
        reading the row first; otherwise the row is read and the rule above
        applied.
        """
        given_up = replace(lease, expires_at=GIVEN_UP)
        if lease.expires_at > GIVEN_UP and self._store.compare_and_set_lease(
            given_up, expected=lease
        ):
            self._given_up[lease.thread_id] = given_up
            return
        with self._store.transaction(durable=durable_leases(self._store)) as tx:
            cur = tx.get_lease(lease.thread_id)
            if cur is None or (cur.owner, cur.token) != (lease.owner, lease.token):
                return
            given_up = replace(cur, expires_at=GIVEN_UP)
            if cur.expires_at > GIVEN_UP and not tx.put_lease(given_up, expected=cur):
                return
        self._given_up[lease.thread_id] = given_up

    def break_lease(self, thread_id: str, *, by: str, reason: str) -> Lease:
        """Break a thread's lease by hand, audited; return the lease as it was.

        For a lease no runner will give up: its holder is on another host or
        in another container (so it cannot be proven gone), or its expiry is
        absurd (year 9999, a damaged row). The lease is handed to nobody and
        is given up (``GIVEN_UP``), with its fencing token raised: the old holder, should it
        still run, can no longer renew it, and its next renewal stops its run
        (``Agent``'s lease keeper). Its attempts are not touched: recovery
        treats them by the usual rule once a runner takes the thread. One
        durable transaction with a ``lease_broken`` thread event naming who,
        when and why (``thread_events``).

        Args:
            thread_id: the thread.
            by: who breaks it (a person's name), kept in the event.
            reason: why, kept in the event; required.

        Returns:
            The lease that was broken, as it was stored.

        Raises:
            ValueError: ``reason`` or ``by`` is blank.
            KeyError: the thread has no lease to break.
            ThreadBusyError: the lease changed hands while it was being broken.
        """
        if not reason.strip():
            raise ValueError("breaking a lease needs a reason (it is kept in the audit trail)")
        if not by.strip():
            raise ValueError("breaking a lease needs the name of who breaks it")
        now = self._now()
        with self._store.transaction() as tx:
            cur = tx.get_lease(thread_id)
            if cur is None:
                raise KeyError(f"thread {thread_id!r} has no lease to break")
            broken = Lease(
                thread_id=thread_id,
                owner=f"{_BROKEN}{by}",
                token=cur.token + 1,
                expires_at=GIVEN_UP,
            )
            if not tx.put_lease(broken, expected=cur):
                raise _busy(tx.get_lease(thread_id), now, thread_id=thread_id)
            detail = {
                "reason": reason,
                "owner": cur.owner,
                "token": cur.token,
                "expires_at": cur.expires_at.isoformat(),
                "was_expired": cur.expires_at <= now,
            }
            event = ThreadEvent(
                seq=0, thread_id=thread_id, kind="lease_broken", actor=by, at=now, detail=detail
            )
            tx.append_thread_event(event)
        return cur

    def thread_events(self, thread_id: str | None = None) -> builtins.list[ThreadEvent]:
        """Return the audit events about threads (of one, or all), in append order."""
        with self._store.read(single=True) as r:
            return r.thread_events(thread_id)


_BROKEN = "broken by "
"""Owner prefix of a lease broken by hand; nobody's worker id, so the next runner takes it."""


def _busy(cur: Lease | None, now: datetime, *, thread_id: str = "") -> ThreadBusyError:
    if cur is None:
        return ThreadBusyError(thread_id=thread_id, owner=_NOBODY, expires_in_s=0.0)
    left = max(0.0, (cur.expires_at - now).total_seconds())
    return ThreadBusyError(thread_id=cur.thread_id, owner=cur.owner, expires_in_s=left)
