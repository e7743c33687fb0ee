"""The operation ledger: did this external action happen, with what result?

``Ledger`` is the facade callers use; ``SqliteLedger`` is a ledger over one
SQLite file. Backends implement ``LedgerStore`` and are checked by
``effectgate.testing.ledger_conformance``. This package imports neither
``effectgate.tools`` nor LangGraph (tests/test_import_boundaries.py). ``PostgresLedger`` and
``PostgresLedgerStore`` (the ``postgres`` extra) load psycopg on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from effectgate.ledger._backoff import full_jitter_delay
from effectgate.ledger._lease_keeper import LeaseKeeper
from effectgate.ledger._ledger import Ledger, SqliteLedger
from effectgate.ledger._model import (
    MAX_RECOVERIES,
    TERMINAL,
    TRANSITIONS,
    UNFINISHED,
    Approval,
    Budget,
    DamagedOperation,
    DamagedThread,
    Event,
    EventKind,
    Lease,
    LedgerMetrics,
    OpenRequest,
    Operation,
    OperationTombstone,
    OpState,
    Receipt,
    ThreadEvent,
    ThreadRecord,
    check_transition,
)
from effectgate.ledger._sqlite import SqliteLedgerStore
from effectgate.ledger._store import (
    Change,
    Expect,
    LedgerStore,
    NewEvent,
    StateCount,
    StoreReader,
    StoreTransaction,
    WriteOnce,
)

if TYPE_CHECKING:
    from effectgate.ledger._postgres import PostgresLedger, PostgresLedgerStore

__all__ = [
    "MAX_RECOVERIES",
    "TERMINAL",
    "TRANSITIONS",
    "UNFINISHED",
    "Approval",
    "Budget",
    "Change",
    "DamagedOperation",
    "DamagedThread",
    "Event",
    "EventKind",
    "Expect",
    "Lease",
    "LeaseKeeper",
    "Ledger",
    "LedgerMetrics",
    "LedgerStore",
    "NewEvent",
    "OpState",
    "OpenRequest",
    "Operation",
    "OperationTombstone",
    "PostgresLedger",
    "PostgresLedgerStore",
    "Receipt",
    "SqliteLedger",
    "SqliteLedgerStore",
    "StateCount",
    "StoreReader",
    "StoreTransaction",
    "ThreadEvent",
    "ThreadRecord",
    "WriteOnce",
    "check_transition",
    "full_jitter_delay",
]


def __getattr__(name: str) -> Any:
    # PostgreSQL support is an optional extra: psycopg is imported only when asked for.
    if name in ("PostgresLedger", "PostgresLedgerStore"):
        from effectgate.ledger import _postgres

        return getattr(_postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
