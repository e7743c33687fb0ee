"""Numbered schema migrations of the SQLite ledger; the list index is the version.

``MIGRATIONS[v]`` holds the statements that take a database from version
``v - 1`` to ``v``; ``MIGRATIONS[0]`` is the empty database. A migration is
never edited once released: a change is a new entry (langgraph's Postgres
saver, DBOS). The store refuses a database whose version is above
``LATEST_VERSION`` (it may hold states this build cannot interpret) and,
with migrations off, one below it.

Column units are in the names: ``*_ms`` are integer milliseconds since the
Unix epoch (UTC), ``*_s`` are float seconds, ``*_json`` are canonical JSON text.
"""

from __future__ import annotations

__all__ = ["APPLICATION_ID", "LATEST_VERSION", "MIGRATIONS", "UNFINISHED_STATES_SQL"]

APPLICATION_ID = 0x45474C44
"""``PRAGMA application_id`` of a ledger file ("EGLD"); tells our files from other SQLite files."""

_STATES = (
    "'PROPOSED','APPROVED','REJECTED','IN_FLIGHT','SUCCEEDED','FAILED',"
    "'RETRY_WAIT','UNKNOWN','NEEDS_RECONCILIATION'"
)
UNFINISHED_STATES_SQL = (
    "state IN ('PROPOSED','APPROVED','IN_FLIGHT','RETRY_WAIT','UNKNOWN','NEEDS_RECONCILIATION')"
)
"""The partial index's WHERE clause, verbatim.

It covers exactly the non-terminal states (a test compares it with
``UNFINISHED``), so recovery and "what is still open" queries cost
O(unfinished rows), not O(ledger size). SQLite uses a partial index only when
the query's WHERE contains this very term, so queries reuse this string.
"""

_V1: tuple[str, ...] = (
    f"PRAGMA application_id = {APPLICATION_ID}",
    """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY,
        applied_at_ms INTEGER NOT NULL
    ) STRICT""",
    f"""CREATE TABLE operations (
        operation_id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        tool_version TEXT NOT NULL,
        args_json TEXT NOT NULL,
        intent_hash TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ({_STATES})),
        prev_state TEXT,
        attempt INTEGER NOT NULL CHECK (attempt >= 0),
        max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
        deadline_at_ms INTEGER,
        backoff_base_s REAL NOT NULL,
        backoff_cap_s REAL NOT NULL,
        next_attempt_at_ms INTEGER,
        claimed_by TEXT,
        receipt_json TEXT,
        error TEXT,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL
    ) STRICT""",
    "CREATE INDEX operations_by_thread ON operations (thread_id, created_at_ms)",
    f"""CREATE INDEX operations_unfinished ON operations (state, created_at_ms)
        WHERE {UNFINISHED_STATES_SQL}""",
    # identity columns are write-once: an operation never changes what it means
    """CREATE TRIGGER operations_identity_immutable
        BEFORE UPDATE OF operation_id, thread_id, tool_call_id, tool, tool_version,
            args_json, intent_hash, max_attempts, deadline_at_ms, created_at_ms
        ON operations
        BEGIN SELECT RAISE(ABORT, 'ledger: operation identity and budget are write-once'); END""",
    """CREATE TRIGGER operations_no_delete BEFORE DELETE ON operations
        BEGIN SELECT RAISE(ABORT, 'ledger: operations are never deleted'); END""",
    """CREATE TABLE approvals (
        id INTEGER PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations (operation_id),
        thread_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        decision TEXT NOT NULL CHECK (decision IN ('approve', 'edit', 'reject')),
        intent_hash TEXT NOT NULL,
        reviewer TEXT NOT NULL,
        edited_args_json TEXT,
        message TEXT,
        decided_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER
    ) STRICT""",
    """CREATE UNIQUE INDEX approvals_write_once
        ON approvals (operation_id, decided_at_ms, reviewer, decision, intent_hash)""",
    """CREATE TRIGGER approvals_append_only_update BEFORE UPDATE ON approvals
        BEGIN SELECT RAISE(ABORT, 'ledger: approvals are append-only'); END""",
    """CREATE TRIGGER approvals_append_only_delete BEFORE DELETE ON approvals
        BEGIN SELECT RAISE(ABORT, 'ledger: approvals are append-only'); END""",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        operation_id TEXT NOT NULL REFERENCES operations (operation_id),
        kind TEXT NOT NULL,
        src TEXT,
        dst TEXT,
        attempt INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        detail_json TEXT NOT NULL
    ) STRICT""",
    "CREATE INDEX events_by_operation ON events (operation_id, seq)",
    "CREATE INDEX events_by_kind ON events (kind)",
    """CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'ledger: events are append-only'); END""",
    """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'ledger: events are append-only'); END""",
    """CREATE TABLE threads (
        thread_id TEXT PRIMARY KEY,
        input_json TEXT NOT NULL,
        metadata_json TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL
    ) STRICT""",
    """CREATE TABLE thread_leases (
        thread_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        token INTEGER NOT NULL CHECK (token >= 1),
        expires_at_ms INTEGER NOT NULL
    ) STRICT""",
)

_V2: tuple[str, ...] = (
    # possible duplicates are looked up by intent across threads at every review
    "CREATE INDEX operations_by_intent ON operations (intent_hash, state)",
)

_V3: tuple[str, ...] = (
    # Retention. A deleted thread keeps a tombstone (when, by whom, why), so
    # it is listed as deleted and never resumed. A terminal operation past
    # the retention window is compacted to a tombstone that still answers
    # "this id was used, with this intent and this receipt"; its approvals,
    # events and row may then go, and only then (the guards below).
    """CREATE TABLE thread_tombstones (
        thread_id TEXT PRIMARY KEY,
        deleted_at_ms INTEGER NOT NULL,
        deleted_by TEXT NOT NULL,
        reason TEXT NOT NULL
    ) STRICT""",
    """CREATE TABLE operation_tombstones (
        operation_id TEXT PRIMARY KEY,
        thread_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        intent_hash TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('SUCCEEDED','FAILED','REJECTED')),
        receipt_json TEXT,
        finished_at_ms INTEGER NOT NULL,
        compacted_at_ms INTEGER NOT NULL
    ) STRICT""",
    "CREATE INDEX operation_tombstones_by_finish ON operation_tombstones (finished_at_ms)",
    "DROP TRIGGER operations_no_delete",
    """CREATE TRIGGER operations_no_delete BEFORE DELETE ON operations
        WHEN NOT EXISTS (SELECT 1 FROM operation_tombstones t
            WHERE t.operation_id = OLD.operation_id AND t.intent_hash = OLD.intent_hash
            AND t.state = OLD.state)
        BEGIN SELECT RAISE(ABORT, 'ledger: an operation goes only once compacted'); END""",
    "DROP TRIGGER approvals_append_only_delete",
    """CREATE TRIGGER approvals_append_only_delete BEFORE DELETE ON approvals
        WHEN NOT EXISTS (SELECT 1 FROM operation_tombstones t
            WHERE t.operation_id = OLD.operation_id)
        BEGIN SELECT RAISE(ABORT, 'ledger: approvals are append-only'); END""",
    "DROP TRIGGER events_append_only_delete",
    """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
        WHEN NOT EXISTS (SELECT 1 FROM operation_tombstones t
            WHERE t.operation_id = OLD.operation_id)
        BEGIN SELECT RAISE(ABORT, 'ledger: events are append-only'); END""",
)

_V4: tuple[str, ...] = (
    # facts about a thread rather than one operation (a lease broken by hand), append-only
    """CREATE TABLE thread_events (
        seq INTEGER PRIMARY KEY,
        thread_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        actor TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        detail_json TEXT NOT NULL
    ) STRICT""",
    "CREATE INDEX thread_events_by_thread ON thread_events (thread_id, seq)",
    """CREATE TRIGGER thread_events_append_only_update BEFORE UPDATE ON thread_events
        BEGIN SELECT RAISE(ABORT, 'ledger: thread events are append-only'); END""",
    """CREATE TRIGGER thread_events_append_only_delete BEFORE DELETE ON thread_events
        BEGIN SELECT RAISE(ABORT, 'ledger: thread events are append-only'); END""",
)

_V5: tuple[str, ...] = (
    # the possible-duplicate check at review also looks up compacted operations by intent
    "CREATE INDEX operation_tombstones_by_intent ON operation_tombstones (intent_hash)",
)

_V6: tuple[str, ...] = (
    # Attempts given back because their worker died mid-call (Operation.recoveries).
    # The trigger lets the count only grow, one step per write; the load check
    # refuses a count above the attempts started or above MAX_RECOVERIES.
    """ALTER TABLE operations
        ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0 CHECK (recoveries >= 0)""",
    """CREATE TRIGGER operations_recoveries_grow BEFORE UPDATE OF recoveries ON operations
        WHEN NEW.recoveries < OLD.recoveries OR NEW.recoveries > OLD.recoveries + 1
        BEGIN SELECT RAISE(ABORT, 'ledger: recoveries only grow, one at a time'); END""",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = ((), _V1, _V2, _V3, _V4, _V5, _V6)
"""Statements per version; each runs inside one ``BEGIN IMMEDIATE`` transaction."""

LATEST_VERSION = len(MIGRATIONS) - 1
"""The schema version this build reads and writes."""
