"""Thread leases: one runner per thread, renewed while its run goes on.

LangGraph does not serialise runs per thread (two runs silently fork it), so
``Agent`` runs a thread only while it holds the thread's lease in the ledger
database (docs/architecture.md, "The runner"). ``LeaseKeeper`` takes the
lease (waiting a little for a live holder, taking over from a dead one) and
renews every lease it holds from one background thread.

The renewal is also the heartbeat of a live attempt: an IN_FLIGHT attempt is
taken over only when its worker is proven gone or its thread's lease was not
renewed for a whole TTL (``Ledger.attempt_holder``). A dispatcher whose run
holds no lease (a served graph, your own graph invoked directly) holds the
thread's lease itself for each dispatch (``LeaseKeeper.shared``), as a
Temporal activity heartbeats while it runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from effectgate._process import owner_is_gone
from effectgate.errors import LedgerError, ThreadBusyError
from effectgate.ledger._ledger import Ledger
from effectgate.ledger._model import Lease

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """Renews the thread leases an agent holds, from one background thread.

    Every ``ttl_s / 3`` seconds each held lease is renewed; a lease another
    runner took (``ThreadBusyError``) is dropped and ``on_lost`` asks the run
    to stop at its next step boundary. One lock orders renewals and releases,
    so a released lease is never renewed again. The thread starts with the
    first lease held and ends once a period passes with none held: an idle
    agent keeps no thread, and back-to-back runs do not start one each.

    Args:
        ledger: where the leases are taken, renewed and released.
        ttl_s: seconds a renewal extends a lease by.
        on_lost: called with a reason when a held lease was taken over.
        name: the renewing thread's name.
    """

    def __init__(
        self, ledger: Ledger, ttl_s: float, on_lost: Callable[[str], None], *, name: str
    ) -> None:
        self._name = name
        self._ledger = ledger
        self._ttl_s = ttl_s
        self._on_lost = on_lost
        self._held: dict[str, Lease] = {}
        self._shares: dict[str, int] = {}
        """Per thread: ``shared`` blocks open; the lease is released by the last, if it took it."""
        self._taken: set[str] = set()
        """Threads whose lease ``shared`` took (and so releases), not a run's ``held``."""
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(
        self, thread_id: str, *, worker: str, ttl_s: float, wait_s: float, notes: list[str]
    ) -> Iterator[Lease]:
        """Hold ``thread_id``'s lease for the block; a failed release becomes a note.

        The run's own result (or exception) is what the caller gets: a
        release that fails (the ledger stayed locked) must not replace it.
        The lease is then no longer renewed and expires by itself.

        Args:
            thread_id: the thread to hold.
            worker: the owner recorded on the lease (the agent's worker id).
            ttl_s: seconds the lease lasts without renewal.
            wait_s: seconds to wait for a live holder before giving up.
            notes: where a failed release is noted (``RunResult.notes``).

        Yields:
            The lease, renewed in the background until the block ends.

        Raises:
            ThreadBusyError: another live runner still holds the thread
                after ``wait_s``.
        """
        lease = self._acquire(thread_id, worker=worker, ttl_s=ttl_s, wait_s=wait_s)
        self.hold(lease)
        try:
            yield lease
        finally:
            try:
                self.release(thread_id)
            except LedgerError as exc:
                notes.append(
                    f"the lease of thread {thread_id!r} could not be released ({exc}); "
                    f"it expires by itself within {ttl_s:g} s"
                )

    @contextmanager
    def shared(self, thread_id: str, *, worker: str) -> Iterator[bool]:
        """Keep ``thread_id``'s lease held and renewed for the block, if it can be had.

        The heartbeat of a dispatch: a run of this keeper's that holds the
        thread already (``held``) is only counted (no ledger I/O); otherwise
        the lease is taken for ``worker`` (taken over from a proven-dead
        holder), renewed every ``ttl_s / 3``, and released by the last block
        open on the thread (two effect nodes of one superstep share it).

        Args:
            thread_id: the thread whose operations the block dispatches.
            worker: the owner recorded on the lease (the dispatcher's
                worker id, the attempts' ``claimed_by``).

        Yields:
            True when the lease is held for the block; False when another
            live runner holds the thread, or the ledger could not be written
            (the dispatch goes on: its claims are compare-and-set, and a
            live attempt of another worker is waited for, never repeated).
        """
        with self._lock:
            if thread_id not in self._held:
                try:
                    lease = self._acquire(thread_id, worker=worker, ttl_s=self._ttl_s, wait_s=0)
                except (ThreadBusyError, LedgerError):
                    lease = None
                if lease is None:
                    have = False
                else:
                    self.hold(lease)
                    self._taken.add(thread_id)
                    have = True
            else:
                have = True
            if have:
                self._shares[thread_id] = self._shares.get(thread_id, 0) + 1
        try:
            yield have
        finally:
            if have:
                with self._lock:
                    left = self._shares[thread_id] - 1
                    if left:
                        self._shares[thread_id] = left
                    else:
                        del self._shares[thread_id]
                        if thread_id in self._taken:
                            self._taken.discard(thread_id)
                            # A failed release expires by itself within one TTL.
                            with contextlib.suppress(LedgerError):
                                self.release(thread_id)

    def _acquire(self, thread_id: str, *, worker: str, ttl_s: float, wait_s: float) -> Lease:
        waited = 0.0
        pause = 0.005
        while True:
            try:
                return self._ledger.acquire_lease(thread_id, worker, ttl_s)
            except ThreadBusyError as exc:
                if owner_is_gone(exc.owner):
                    # The holder's process is gone (kill -9): waiting for its lease
                    # to expire would only delay recovery. Take it over, fenced by owner.
                    return self._ledger.acquire_lease(
                        thread_id, worker, ttl_s, take_over_from=exc.owner
                    )
                if waited >= wait_s:
                    raise
                # A live holder, perhaps only for a moment (another process
                # checking the thread): wait a little, as long as allowed.
                pause = min(pause * 2, 0.1, wait_s - waited)
                time.sleep(pause)
                waited += pause

    def hold(self, lease: Lease) -> None:
        """Keep renewing ``lease`` until ``release``; starts the renewing thread if none runs."""
        with self._lock:
            self._held[lease.thread_id] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def release(self, thread_id: str) -> None:
        """Stop renewing ``thread_id``'s lease and release it in the ledger.

        Raises:
            LedgerError: the release could not be written (the lease then
                expires by itself).
        """
        with self._lock:
            lease = self._held.pop(thread_id, None)
            if lease is not None:
                self._ledger.release_lease(lease)

    def _loop(self) -> None:
        with self._lock:
            try:
                while True:
                    self._lock.wait(self._ttl_s / 3)
                    if not self._held:
                        return
                    for thread_id, lease in list(self._held.items()):
                        self._renew(thread_id, lease)
            finally:
                self._thread = None

    def _renew(self, thread_id: str, lease: Lease) -> None:
        try:
            self._held[thread_id] = self._ledger.renew_lease(lease, self._ttl_s)
        except ThreadBusyError:
            del self._held[thread_id]
            self._on_lost("thread lease lost to another runner")
        except Exception:  # noqa: BLE001
            # The ledger was busy or failed for a moment: keep the lease and try
            # again next period; it stays valid for two more periods. Losing
            # the keeper thread instead would let every lease of this agent expire.
            return
