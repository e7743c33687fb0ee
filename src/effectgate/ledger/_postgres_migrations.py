"""Numbered schema migrations of the PostgreSQL ledger; the list index is the version.

Versioned exactly as the SQLite ones (``_migrations``): ``PG_MIGRATIONS[v]``
takes a schema from version ``v - 1`` to ``v``, a released entry is never
edited, and a store refuses a schema newer than ``PG_LATEST_VERSION``. The
PostgreSQL line starts at 1 with what SQLite reached in two steps;
version 2 brings what SQLite's versions 3 (retention) and 4 (thread events) added,
version 3 what its version 5 added (tombstones looked up by intent hash).

Columns keep the SQLite names and units (``*_ms`` integer milliseconds since
the Unix epoch, ``*_s`` float seconds, ``*_json`` canonical JSON *text*, not
``jsonb``: the text is what the intent hash and the decode memo compare byte
for byte), so both stores share one codec. Every table is prefixed
``ledger_`` and created unqualified, in the connection's current schema, so a
ledger can share a database, or a schema, with LangGraph's checkpoint tables.
"""

from __future__ import annotations

from effectgate.ledger._migrations import UNFINISHED_STATES_SQL

__all__ = ["PG_LATEST_VERSION", "PG_MIGRATIONS", "VERSION_TABLE"]

VERSION_TABLE = "ledger_schema_version"
"""The table whose presence marks a schema as holding an effectgate ledger."""

_STATES = (
    "'PROPOSED','APPROVED','REJECTED','IN_FLIGHT','SUCCEEDED','FAILED',"
    "'RETRY_WAIT','UNKNOWN','NEEDS_RECONCILIATION'"
)


def _refuse(table: str, what: str, message: str) -> str:
    # One trigger per rule; the message names the rule, as the SQLite triggers do.
    return (
        f"CREATE TRIGGER {table}_{what} BEFORE {what.upper().replace('_', ' ')} ON {table} "
        f"FOR EACH {'STATEMENT' if what == 'truncate' else 'ROW'} "
        f"EXECUTE FUNCTION ledger_refuse('{message}')"
    )


_V1: tuple[str, ...] = (
    f"""CREATE TABLE {VERSION_TABLE} (
        version integer PRIMARY KEY,
        applied_at_ms bigint NOT NULL
    )""",
    """CREATE FUNCTION ledger_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'ledger: %', TG_ARGV[0]; END $$""",
    f"""CREATE TABLE ledger_operations (
        operation_id text PRIMARY KEY,
        thread_id text NOT NULL,
        tool_call_id text NOT NULL,
        tool text NOT NULL,
        tool_version text NOT NULL,
        args_json text NOT NULL,
        intent_hash text NOT NULL,
        state text NOT NULL CHECK (state IN ({_STATES})),
        prev_state text,
        attempt integer NOT NULL CHECK (attempt >= 0),
        max_attempts integer NOT NULL CHECK (max_attempts >= 1),
        deadline_at_ms bigint,
        backoff_base_s double precision NOT NULL,
        backoff_cap_s double precision NOT NULL,
        next_attempt_at_ms bigint,
        claimed_by text,
        receipt_json text,
        error text,
        created_at_ms bigint NOT NULL,
        updated_at_ms bigint NOT NULL
    )""",
    "CREATE INDEX ledger_operations_by_thread ON ledger_operations (thread_id, created_at_ms)",
    # recovery and "what is still open" cost O(unfinished rows), as on SQLite
    f"""CREATE INDEX ledger_operations_unfinished ON ledger_operations (state, created_at_ms)
        WHERE {UNFINISHED_STATES_SQL}""",
    "CREATE INDEX ledger_operations_by_intent ON ledger_operations (intent_hash, state)",
    # identity columns are write-once: an operation never changes what it means
    """CREATE TRIGGER ledger_operations_identity_immutable
        BEFORE UPDATE OF operation_id, thread_id, tool_call_id, tool, tool_version,
            args_json, intent_hash, max_attempts, deadline_at_ms, created_at_ms
        ON ledger_operations FOR EACH ROW
        EXECUTE FUNCTION ledger_refuse('operation identity and budget are write-once')""",
    _refuse("ledger_operations", "delete", "operations are never deleted"),
    _refuse("ledger_operations", "truncate", "operations are never deleted"),
    """CREATE TABLE ledger_approvals (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        operation_id text NOT NULL REFERENCES ledger_operations (operation_id),
        thread_id text NOT NULL,
        tool_call_id text NOT NULL,
        decision text NOT NULL CHECK (decision IN ('approve', 'edit', 'reject')),
        intent_hash text NOT NULL,
        reviewer text NOT NULL,
        edited_args_json text,
        message text,
        decided_at_ms bigint NOT NULL,
        expires_at_ms bigint
    )""",
    """CREATE UNIQUE INDEX ledger_approvals_write_once
        ON ledger_approvals (operation_id, decided_at_ms, reviewer, decision, intent_hash)""",
    _refuse("ledger_approvals", "update", "approvals are append-only"),
    _refuse("ledger_approvals", "delete", "approvals are append-only"),
    _refuse("ledger_approvals", "truncate", "approvals are append-only"),
    """CREATE TABLE ledger_events (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        operation_id text NOT NULL REFERENCES ledger_operations (operation_id),
        kind text NOT NULL,
        src text,
        dst text,
        attempt integer NOT NULL,
        at_ms bigint NOT NULL,
        detail_json text NOT NULL
    )""",
    "CREATE INDEX ledger_events_by_operation ON ledger_events (operation_id, seq)",
    "CREATE INDEX ledger_events_by_kind ON ledger_events (kind)",
    _refuse("ledger_events", "update", "events are append-only"),
    _refuse("ledger_events", "delete", "events are append-only"),
    _refuse("ledger_events", "truncate", "events are append-only"),
    """CREATE TABLE ledger_threads (
        thread_id text PRIMARY KEY,
        input_json text NOT NULL,
        metadata_json text NOT NULL,
        created_at_ms bigint NOT NULL
    )""",
    """CREATE TABLE ledger_thread_leases (
        thread_id text PRIMARY KEY,
        owner text NOT NULL,
        token bigint NOT NULL CHECK (token >= 1),
        expires_at_ms bigint NOT NULL
    )""",
)

_V2: tuple[str, ...] = (
    # Retention, as SQLite's version 3. A deleted thread keeps a tombstone
    # (when, by whom, why), so it is listed as deleted and never resumed. A
    # terminal operation past the retention window is compacted to a
    # tombstone that still answers "this id was used, with this intent and
    # this receipt"; its approvals, events and row may then go, and only then.
    """CREATE TABLE ledger_thread_tombstones (
        thread_id text PRIMARY KEY,
        deleted_at_ms bigint NOT NULL,
        deleted_by text NOT NULL,
        reason text NOT NULL
    )""",
    """CREATE TABLE ledger_operation_tombstones (
        operation_id text PRIMARY KEY,
        thread_id text NOT NULL,
        tool text NOT NULL,
        intent_hash text NOT NULL,
        state text NOT NULL CHECK (state IN ('SUCCEEDED','FAILED','REJECTED')),
        receipt_json text,
        finished_at_ms bigint NOT NULL,
        compacted_at_ms bigint NOT NULL
    )""",
    """CREATE INDEX ledger_operation_tombstones_by_finish
        ON ledger_operation_tombstones (finished_at_ms)""",
    # The delete guards: a row goes only once its operation has a tombstone;
    # the operation row itself only if the tombstone records its very intent
    # and state. TRUNCATE stays refused (version 1's statement triggers).
    """CREATE FUNCTION ledger_refuse_untombstoned() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_TABLE_NAME = 'ledger_operations' THEN
                IF NOT EXISTS (SELECT 1 FROM ledger_operation_tombstones t
                        WHERE t.operation_id = OLD.operation_id
                        AND t.intent_hash = OLD.intent_hash AND t.state = OLD.state) THEN
                    RAISE EXCEPTION 'ledger: %', TG_ARGV[0];
                END IF;
            ELSIF NOT EXISTS (SELECT 1 FROM ledger_operation_tombstones t
                    WHERE t.operation_id = OLD.operation_id) THEN
                RAISE EXCEPTION 'ledger: %', TG_ARGV[0];
            END IF;
            RETURN OLD;
        END $$""",
    "DROP TRIGGER ledger_operations_delete ON ledger_operations",
    """CREATE TRIGGER ledger_operations_delete BEFORE DELETE ON ledger_operations
        FOR EACH ROW
        EXECUTE FUNCTION ledger_refuse_untombstoned('an operation goes only once compacted')""",
    "DROP TRIGGER ledger_approvals_delete ON ledger_approvals",
    """CREATE TRIGGER ledger_approvals_delete BEFORE DELETE ON ledger_approvals
        FOR EACH ROW EXECUTE FUNCTION ledger_refuse_untombstoned('approvals are append-only')""",
    "DROP TRIGGER ledger_events_delete ON ledger_events",
    """CREATE TRIGGER ledger_events_delete BEFORE DELETE ON ledger_events
        FOR EACH ROW EXECUTE FUNCTION ledger_refuse_untombstoned('events are append-only')""",
    # Recovery, as SQLite's version 4: facts about a thread rather than one
    # operation (a lease broken by hand), append-only.
    """CREATE TABLE ledger_thread_events (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL,
        kind text NOT NULL,
        actor text NOT NULL,
        at_ms bigint NOT NULL,
        detail_json text NOT NULL
    )""",
    "CREATE INDEX ledger_thread_events_by_thread ON ledger_thread_events (thread_id, seq)",
    _refuse("ledger_thread_events", "update", "thread events are append-only"),
    _refuse("ledger_thread_events", "delete", "thread events are append-only"),
    _refuse("ledger_thread_events", "truncate", "thread events are append-only"),
)

_V3: tuple[str, ...] = (
    # As SQLite's version 5: the possible-duplicate check at review also looks
    # up compacted operations by intent.
    """CREATE INDEX ledger_operation_tombstones_by_intent
        ON ledger_operation_tombstones (intent_hash)""",
)

_V4: tuple[str, ...] = (
    # As SQLite's version 6: attempts given back because their worker died
    # mid-call; the count only grows, one at a time.
    """ALTER TABLE ledger_operations
        ADD COLUMN recoveries integer NOT NULL DEFAULT 0 CHECK (recoveries >= 0)""",
    """CREATE TRIGGER ledger_operations_recoveries_grow
        BEFORE UPDATE OF recoveries ON ledger_operations FOR EACH ROW
        WHEN (NEW.recoveries < OLD.recoveries OR NEW.recoveries > OLD.recoveries + 1)
        EXECUTE FUNCTION ledger_refuse('recoveries only grow, one at a time')""",
)

PG_MIGRATIONS: tuple[tuple[str, ...], ...] = ((), _V1, _V2, _V3, _V4)
"""Statements per version; all pending versions run in one transaction under an advisory lock."""

PG_LATEST_VERSION = len(PG_MIGRATIONS) - 1
"""The PostgreSQL schema version this build reads and writes."""
