"""Thread tombstones: a deleted thread stays deleted.

``effectgate.retention.prune`` records a thread's deletion in the ledger first
(when, by whom, why: ``ThreadTombstone``), then removes its checkpoints. The
tombstone is read here: a resume, a start or a worker of a deleted thread is
refused with ``ThreadDeletedError``; listings name the thread as deleted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from effectgate.errors import ConfigError
from effectgate.ledger._model import ThreadTombstone

if TYPE_CHECKING:
    from effectgate.ledger._ledger import Ledger

__all__ = ["ThreadDeletedError", "deleted_threads", "refuse_deleted", "tombstone_of"]


class ThreadDeletedError(ConfigError):
    """The thread was deleted (``prune``); it cannot be resumed or started again.

    Attributes:
        tombstone: when, by whom and why it was deleted.
    """

    def __init__(self, tombstone: ThreadTombstone) -> None:
        self.tombstone = tombstone
        super().__init__(
            f"thread {tombstone.thread_id!r} was deleted at "
            f"{tombstone.deleted_at.isoformat(timespec='seconds')} by {tombstone.deleted_by}: "
            f"{tombstone.reason}"
        )


def tombstone_of(ledger: Ledger, thread_id: str) -> ThreadTombstone | None:
    """Return the tombstone of a deleted thread, or ``None`` if it was not deleted."""
    with ledger.store.read(single=True) as r:
        return r.get_thread_tombstone(thread_id)


def deleted_threads(ledger: Ledger) -> dict[str, ThreadTombstone]:
    """Return every deleted thread's tombstone, by thread id."""
    with ledger.store.read(single=True) as r:
        return {t.thread_id: t for t in r.list_thread_tombstones()}


def refuse_deleted(ledger: Ledger, thread_id: str) -> None:
    """Raise ``ThreadDeletedError`` if ``thread_id`` was deleted."""
    found = tombstone_of(ledger, thread_id)
    if found is not None:
        raise ThreadDeletedError(found)
