"""The operation ledger: did this external action happen, with what result? (DESIGN §1-3).

``Ledger`` is the facade callers use; ``SqliteLedger`` is a ledger over one
SQLite file. Backends implement ``LedgerStore`` and are checked by
``effectgate.testing.ledger_conformance``. This package imports neither
``effectgate.tools`` nor LangGraph (STYLE §1).
"""

from __future__ import annotations

from effectgate.ledger._backoff import full_jitter_delay
from effectgate.ledger._ledger import Ledger, SqliteLedger
from effectgate.ledger._model import (
    TERMINAL,
    TRANSITIONS,
    UNFINISHED,
    Approval,
    Budget,
    Event,
    EventKind,
    Lease,
    LedgerMetrics,
    OpenRequest,
    Operation,
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

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "UNFINISHED",
    "Approval",
    "Budget",
    "Change",
    "Event",
    "EventKind",
    "Expect",
    "Lease",
    "Ledger",
    "LedgerMetrics",
    "LedgerStore",
    "NewEvent",
    "OpState",
    "OpenRequest",
    "Operation",
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
