"""Retention: prune checkpoints, delete threads behind tombstones, compact the ledger.

The public face of retention (docs/retention.md). What it removes and what it
never removes, and why, is told in ``effectgate.graph._prune``, where the
prune lives beside the graph whose checkpoints it removes; a deleted thread's
tombstone is read in ``effectgate.ledger._tombstones``, beside the ledger
that keeps it.
"""

from __future__ import annotations

from effectgate.graph._prune import PrunePolicy, PruneReport, Vacuum, prune
from effectgate.ledger._tombstones import (
    ThreadDeletedError,
    deleted_threads,
    refuse_deleted,
    tombstone_of,
)

__all__ = [
    "PrunePolicy",
    "PruneReport",
    "ThreadDeletedError",
    "Vacuum",
    "deleted_threads",
    "prune",
    "refuse_deleted",
    "tombstone_of",
]
