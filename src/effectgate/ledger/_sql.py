"""Every SQL statement the ledger's stores send, written once and rendered per dialect.

Where is the ledger's SQL? Here, for both stores: the statements
``SqliteLedgerStore`` and ``PostgresLedgerStore`` share are written once in
``LedgerSql`` and rendered for a ``Dialect`` (``SQLITE``, ``POSTGRES``); what
only one of them sends (SQLite's pragmas and file inspection; PostgreSQL's
transaction openers, local settings, advisory locks and catalog reads) follows
under its own heading at the end. The schema (tables, indexes, triggers) is in
``_migrations`` and ``_postgres_migrations``; the code that sends these
statements, once for both stores, in ``_sql_store``.

What the dialects differ in, and nothing else:

- placeholders: ``?`` and ``:name`` (sqlite3) against ``%s`` and
  ``%(name)s`` (psycopg); PostgreSQL needs a type on a parameter tested only
  for ``IS NULL`` (``%(attempt)s::integer``);
- table names: ``operations`` against ``ledger_operations`` (a PostgreSQL
  ledger shares its schema with LangGraph's checkpoint tables);
- row locks: a PostgreSQL write transaction reads its operation and lease
  rows ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` already holds the one write
  lock of the file;
- a state this build does not know: only an SQLite file can hold one (a
  damaged file), so only there a duplicate check matches it, for decoding to
  report it;
- compaction: SQLite picks the rows past the cutoff by one ``WHERE`` clause
  under its write lock and replaces an older tombstone (``INSERT OR
  REPLACE``); PostgreSQL locks the rows it picks in id order, then writes and
  deletes by that list of ids (``ON CONFLICT ... DO UPDATE``).

Values inlined into a statement are ``OpState`` values only (fixed
identifiers, injection-safe, one cached statement per state set); everything
else is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from effectgate.ledger import _codec as codec
from effectgate.ledger._migrations import UNFINISHED_STATES_SQL
from effectgate.ledger._model import TERMINAL, UNFINISHED, OpState
from effectgate.ledger._postgres_migrations import VERSION_TABLE

__all__ = [
    "EVENT_COLUMNS",
    "LEASE_COLUMNS",
    "POSTGRES",
    "SQLITE",
    "THREAD_COLUMNS",
    "THREAD_EVENT_COLUMNS",
    "Compaction",
    "Dialect",
    "LedgerSql",
    "in_list",
]

EVENT_COLUMNS = ("seq", "operation_id", "kind", "src", "dst", "attempt", "at_ms", "detail_json")
THREAD_COLUMNS = ("thread_id", "input_json", "metadata_json", "created_at_ms")
LEASE_COLUMNS = ("thread_id", "owner", "token", "expires_at_ms")
THREAD_EVENT_COLUMNS = ("seq", "thread_id", "kind", "actor", "at_ms", "detail_json")
_THREAD_TOMBSTONE_COLUMNS = "thread_id, deleted_at_ms, deleted_by, reason"
_OP_TOMBSTONE_COLUMNS = (
    "operation_id, thread_id, tool, intent_hash, state, receipt_json, finished_at_ms, "
    "compacted_at_ms"
)

Params = list[Any]


def in_list(states: Iterable[OpState]) -> str:
    """``'A','B'``: states inlined for ``state IN (...)``, sorted (one statement per set)."""
    return ",".join(f"'{OpState(s).value}'" for s in sorted(states))


_KNOWN = in_list(OpState)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells what ``LedgerSql`` writes once."""

    name: str
    """``"sqlite"`` or ``"postgresql"``."""
    prefix: str
    """Put before every table name."""
    mark: str
    """The positional placeholder."""
    named_style: str
    """The named placeholder, with ``{}`` for the name."""
    for_update: str
    """Appended to a row read inside a write transaction (the row lock, if one is needed)."""
    matches_unknown_states: bool
    """A stored state may be one this build does not know (see the module)."""

    def table(self, name: str) -> str:
        """The table ``name`` as this dialect's ledger names it."""
        return self.prefix + name

    def marks(self, n: int) -> str:
        """``n`` positional placeholders, comma-separated."""
        return ", ".join([self.mark] * n)

    def named(self, name: str, cast: str | None = None) -> str:
        """The named placeholder ``name``; ``cast`` types it where PostgreSQL cannot infer one."""
        mark = self.named_style.format(name)
        return f"{mark}::{cast}" if cast and self.name == "postgresql" else mark


@dataclass(frozen=True, slots=True)
class Compaction:
    """The statements of one ``compact_operations`` call (``LedgerSql.compaction``)."""

    sql: LedgerSql
    where: str
    """Picks the terminal rows past the cutoff, in the threads asked for."""
    params: Params
    order: str
    """Appended to the pick: PostgreSQL locks the rows, in id order."""

    @property
    def victims(self) -> tuple[str, Params]:
        """Selects ``(operation_id, thread_id)`` of the rows to compact."""
        return (
            f"SELECT operation_id, thread_id FROM {self.sql.operations} WHERE {self.where}"
            f"{self.order}",
            self.params,
        )

    def writes(self, victims: Sequence[str], now_ms: int) -> list[tuple[str, Params]]:
        """Tombstones written, then approvals, events and rows deleted, for ``victims``."""
        s = self.sql
        if s.dialect.name == "sqlite":
            # under the file's write lock the WHERE clause picks the same rows again
            sub = f"SELECT operation_id FROM {s.operations} WHERE {self.where}"
            return [
                (s.compact_tombstones_where.format(where=self.where), [now_ms, *self.params]),
                (f"DELETE FROM {s.approvals} WHERE operation_id IN ({sub})", self.params),
                (f"DELETE FROM {s.events} WHERE operation_id IN ({sub})", self.params),
                (f"DELETE FROM {s.operations} WHERE {self.where}", self.params),
            ]
        ids = list(victims)
        return [
            (s.compact_tombstones_ids, [now_ms, ids]),
            *[
                (f"DELETE FROM {table} WHERE operation_id = ANY(%s::text[])", [ids])
                for table in (s.approvals, s.events, s.operations)
            ],
        ]


class LedgerSql:
    """The statements both stores send, rendered for one ``Dialect``.

    Attributes are fixed statements; methods build the few whose ``WHERE``
    clause depends on the call and return ``(statement, parameters)``.
    """

    def __init__(self, d: Dialect) -> None:
        self.dialect = d
        self.operations = d.table("operations")
        self.approvals = d.table("approvals")
        self.events = d.table("events")
        self.threads = d.table("threads")
        """The table of thread records (named when one of them is damaged)."""
        self.operation_tombstones = d.table("operation_tombstones")
        self._operation_statements(d)
        self._approval_and_event_statements(d)
        self._thread_statements(d)
        self._tombstone_statements(d)
        version = VERSION_TABLE if d.name == "postgresql" else "schema_version"
        self.schema_version = f"SELECT MAX(version) FROM {version}"
        self.record_version = (
            f"INSERT INTO {version} (version, applied_at_ms) VALUES ({d.marks(2)})"
        )

    def _operation_statements(self, d: Dialect) -> None:
        m, n, ops = d.mark, d.named, self.operations
        op_cols = ", ".join(codec.OPERATION_COLUMNS)
        self.insert_operation = (
            f"INSERT INTO {ops} ({op_cols}) VALUES ({d.marks(len(codec.OPERATION_COLUMNS))}) "
            f"ON CONFLICT (operation_id) DO NOTHING RETURNING {op_cols}"
        )
        self.select_operations = f"SELECT {op_cols} FROM {ops}"
        self.list_order = " ORDER BY created_at_ms, operation_id"
        self.get_operation = f"{self.select_operations} WHERE operation_id = {m}"
        self.get_operation_for_update = self.get_operation + d.for_update
        # SET expressions see the *old* row, so ``prev_state = state`` records the
        # state being left and RETURNING hands it back: the transition event needs
        # it, and this saves a read per claim (SQLite's RETURNING only shows new values).
        self._compare_and_set = f"""UPDATE {ops} SET
    prev_state = state, state = {n("state")},
    attempt = COALESCE({n("attempt")}, attempt),
    receipt_json = COALESCE({n("receipt_json")}, receipt_json),
    error = COALESCE({n("error")}, error),
    claimed_by = {n("claimed_by")},
    next_attempt_at_ms = {n("next_attempt_at_ms")},
    {{recoveries}}
    updated_at_ms = {n("updated_at_ms")}
WHERE operation_id = {n("operation_id")} AND state IN ({{states}})
    AND ({n("expect_attempt", "integer")} IS NULL OR attempt = {n("expect_attempt")})
    AND ({n("expect_intent_hash", "text")} IS NULL OR intent_hash = {n("expect_intent_hash")})
    AND ({n("attempts_allowed_at_least", "integer")} IS NULL
        OR max_attempts + recoveries >= {n("attempts_allowed_at_least")})
RETURNING {op_cols}"""
        self._set_recoveries = f"recoveries = {n('recoveries')},"
        self.count_operations = (
            f"SELECT state, attempt, COUNT(*) FROM {ops} GROUP BY state, attempt"
        )
        self.oldest_updated = (
            f"SELECT MIN(updated_at_ms) FROM {ops} WHERE {UNFINISHED_STATES_SQL} AND state = {m}"
        )
        self.intent_neighbours = (
            f"{self.select_operations} WHERE operation_id = {m} OR intent_hash = {m}"
            + self.list_order
        )

    def _approval_and_event_statements(self, d: Dialect) -> None:
        m, approvals, events = d.mark, self.approvals, self.events
        approval_cols = ", ".join(codec.APPROVAL_COLUMNS)
        self.insert_approval = (
            f"INSERT INTO {approvals} ({approval_cols}) VALUES ({d.marks(10)}) "
            "ON CONFLICT DO NOTHING"
        )
        self.get_approval_by_key = (
            f"SELECT {approval_cols} FROM {approvals} WHERE operation_id = {m} "
            f"AND decided_at_ms = {m} AND reviewer = {m} AND decision = {m} AND intent_hash = {m}"
        )
        self.list_approvals = (
            f"SELECT {approval_cols} FROM {approvals} WHERE operation_id = {m} ORDER BY id"
        )
        self.insert_event = (
            f"INSERT INTO {events} (operation_id, kind, src, dst, attempt, at_ms, "
            f"detail_json) VALUES ({d.marks(7)})"
        )
        self.select_events = f"SELECT {', '.join(EVENT_COLUMNS)} FROM {events}"
        self.list_events_by_thread = (
            f"SELECT {', '.join('e.' + c for c in EVENT_COLUMNS)} FROM {events} e "
            f"JOIN {self.operations} o ON o.operation_id = e.operation_id WHERE o.thread_id = {m}"
        )
        self.count_events = f"SELECT COUNT(*) FROM {events} WHERE kind = {m}"

    def _thread_statements(self, d: Dialect) -> None:
        m, threads = d.mark, self.threads
        leases = d.table("thread_leases")
        thread_events = d.table("thread_events")
        thread_cols = ", ".join(THREAD_COLUMNS)
        lease_cols = ", ".join(LEASE_COLUMNS)
        self.insert_thread = (
            f"INSERT INTO {threads} ({thread_cols}) VALUES ({d.marks(4)}) "
            "ON CONFLICT (thread_id) DO NOTHING"
        )
        self.get_thread = f"SELECT {thread_cols} FROM {threads} WHERE thread_id = {m}"
        self.list_threads = f"SELECT {thread_cols} FROM {threads} ORDER BY created_at_ms, thread_id"
        self.thread_ids = f"SELECT thread_id FROM {threads} ORDER BY created_at_ms, thread_id"
        self.get_lease = f"SELECT {lease_cols} FROM {leases} WHERE thread_id = {m}"
        self.get_lease_for_update = self.get_lease + d.for_update
        self.insert_lease = (
            f"INSERT INTO {leases} ({lease_cols}) VALUES ({d.marks(4)}) "
            "ON CONFLICT (thread_id) DO NOTHING"
        )
        self.update_lease = (
            f"UPDATE {leases} SET owner = {m}, token = {m}, expires_at_ms = {m} "
            f"WHERE thread_id = {m} AND owner = {m} AND token = {m} "
            f"AND expires_at_ms BETWEEN {m} AND {m}"
        )
        self.lease_row = f"SELECT owner, token, expires_at_ms FROM {leases} WHERE thread_id = {m}"
        """What ``update_lease`` writes, read back (did a commit whose answer was lost happen?)."""
        self.insert_thread_event = (
            f"INSERT INTO {thread_events} (thread_id, kind, actor, at_ms, detail_json) "
            f"VALUES ({d.marks(5)}) RETURNING seq"
        )
        self.select_thread_events = f"SELECT {', '.join(THREAD_EVENT_COLUMNS)} FROM {thread_events}"

    def _tombstone_statements(self, d: Dialect) -> None:
        m, ops, op_tombs = d.mark, self.operations, self.operation_tombstones
        thread_tombs = d.table("thread_tombstones")
        select_thread_tombs = f"SELECT {_THREAD_TOMBSTONE_COLUMNS} FROM {thread_tombs}"
        self.get_thread_tombstone = f"{select_thread_tombs} WHERE thread_id = {m}"
        self.list_thread_tombstones = f"{select_thread_tombs} ORDER BY deleted_at_ms, thread_id"
        self.insert_thread_tombstone = (
            f"INSERT INTO {thread_tombs} ({_THREAD_TOMBSTONE_COLUMNS}) "
            f"VALUES ({d.marks(4)}) ON CONFLICT (thread_id) DO NOTHING"
        )
        select_op_tombs = f"SELECT {_OP_TOMBSTONE_COLUMNS} FROM {op_tombs}"
        tomb_order = " ORDER BY finished_at_ms, operation_id"
        self.get_operation_tombstone = f"{select_op_tombs} WHERE operation_id = {m}"
        self.list_operation_tombstones = f"{select_op_tombs} WHERE intent_hash = {m}{tomb_order}"
        self.intent_neighbour_tombstones = (
            f"{select_op_tombs} WHERE operation_id = {m} OR intent_hash = {m}{tomb_order}"
        )
        self.drop_operation_tombstones = f"DELETE FROM {op_tombs} WHERE finished_at_ms < {m}"
        # Compaction writes a tombstone for each row it picks, replacing the
        # tombstone of an id used again after an earlier compaction.
        tomb_select = (
            "SELECT operation_id, thread_id, tool, intent_hash, state, receipt_json, "
            f"updated_at_ms, {m} FROM {ops}"
        )
        insert_tomb = (
            f"INTO {op_tombs} (operation_id, thread_id, tool, intent_hash, state, "
            "receipt_json, finished_at_ms, compacted_at_ms) "
        )
        self.compact_tombstones_where = (
            f"INSERT OR REPLACE {insert_tomb}{tomb_select} WHERE {{where}}"
        )
        self.compact_tombstones_ids = (
            f"INSERT {insert_tomb}{tomb_select} WHERE operation_id = ANY(%s::text[]) "
            "ON CONFLICT (operation_id) DO UPDATE SET thread_id = EXCLUDED.thread_id, "
            "tool = EXCLUDED.tool, intent_hash = EXCLUDED.intent_hash, state = EXCLUDED.state, "
            "receipt_json = EXCLUDED.receipt_json, finished_at_ms = EXCLUDED.finished_at_ms, "
            "compacted_at_ms = EXCLUDED.compacted_at_ms"
        )

    # -- statements built per call ------------------------------------------

    def compare_and_set(self, states: Iterable[OpState], *, recoveries: bool) -> str:
        """The conditional update of one operation row (named parameters, see the stores).

        Only a given-back attempt names ``recoveries`` (``recoveries=True``),
        so the guard trigger on that column runs for it alone, not for every
        claim and result.
        """
        return self._compare_and_set.format(
            states=in_list(states), recoveries=self._set_recoveries if recoveries else ""
        )

    def list_operations(
        self,
        *,
        thread_id: str | None = None,
        states: Iterable[OpState] | None = None,
        tool: str | None = None,
        intent_hash: str | None = None,
    ) -> tuple[str, Params] | None:
        """The listing of operations matching every filter given; ``None``: none can match."""
        m = self.dialect.mark
        where: list[str] = []
        params: Params = []
        if states is not None:
            wanted = frozenset(OpState(s) for s in states)
            if not wanted:
                return None
            if intent_hash is not None and self.dialect.matches_unknown_states:
                # A duplicate check, served by the intent index: a row whose
                # state this build does not know (a damaged file) matches too,
                # so decoding reports it instead of the check silently missing it.
                # (On PostgreSQL the CHECK constraint on ledger_operations.state
                # makes such a row impossible to write.)
                where.append(f"(state IN ({in_list(wanted)}) OR state NOT IN ({_KNOWN}))")
            else:
                if wanted <= UNFINISHED:
                    where.append(UNFINISHED_STATES_SQL)  # lets the planner use the partial index
                where.append(f"state IN ({in_list(wanted)})")
        for column, value in (
            ("thread_id", thread_id),
            ("tool", tool),
            ("intent_hash", intent_hash),
        ):
            if value is not None:
                where.append(f"{column} = {m}")  # intent_hash: operations_by_intent
                params.append(value)
        sql = self.select_operations + (" WHERE " + " AND ".join(where) if where else "")
        return sql + self.list_order, params

    def list_events(
        self, *, operation_id: str | None = None, thread_id: str | None = None
    ) -> tuple[str, Params]:
        """Events of one operation, one thread, both, or all, in ``seq`` order."""
        m = self.dialect.mark
        if thread_id is not None:
            sql, params = self.list_events_by_thread, [thread_id]
            if operation_id is not None:
                sql += f" AND e.operation_id = {m}"
                params.append(operation_id)
            return sql + " ORDER BY e.seq", params
        if operation_id is not None:
            return f"{self.select_events} WHERE operation_id = {m} ORDER BY seq", [operation_id]
        return self.select_events + " ORDER BY seq", []

    def thread_events(self, thread_id: str | None) -> tuple[str, Params]:
        """Thread events of one thread, or all, in ``seq`` order."""
        if thread_id is None:
            return self.select_thread_events + " ORDER BY seq", []
        return (
            f"{self.select_thread_events} WHERE thread_id = {self.dialect.mark} ORDER BY seq",
            [thread_id],
        )

    def operation_refs(
        self, thread_id: str | None, operation_id: str | None, intent_hash: str | None
    ) -> tuple[str, Params]:
        """``(operation_id, thread_id)`` of a thread's rows and/or those under an id or intent."""
        m = self.dialect.mark
        where: list[str] = []
        params: Params = []
        if thread_id is not None:
            where.append(f"thread_id = {m}")
            params.append(thread_id)
        near = []
        for column, value in (("operation_id", operation_id), ("intent_hash", intent_hash)):
            if value is not None:
                near.append(f"{column} = {m}")
                params.append(value)
        if near:
            where.append("(" + " OR ".join(near) + ")")
        clause = " WHERE " + " AND ".join(where) if where else ""
        return (
            f"SELECT operation_id, thread_id FROM {self.operations}{clause}{self.list_order}",
            params,
        )

    def compaction(
        self, cutoff_ms: int, thread_ids: Iterable[str] | None, keep_threads: Sequence[str]
    ) -> Compaction:
        """What compacts the terminal rows last updated before ``cutoff_ms`` (see the module).

        On PostgreSQL the rows picked are locked in id order (a concurrent
        transition waits, then finds the row gone), and written and deleted
        in separate statements so that each delete guard (schema version 2)
        sees the tombstones already written.
        """
        d = self.dialect
        terminal = f"state IN ({in_list(TERMINAL)}) AND updated_at_ms < {d.mark}"
        params: Params = [cutoff_ms]
        where = terminal
        if d.name == "sqlite":
            if thread_ids is not None:
                ids = list(thread_ids)
                where += f" AND thread_id IN ({', '.join('?' * len(ids))})"
                params.extend(ids)
            if keep_threads:
                where += f" AND thread_id NOT IN ({', '.join('?' * len(keep_threads))})"
                params.extend(keep_threads)
            order = ""
        else:
            if thread_ids is not None:
                where += " AND thread_id = ANY(%s::text[])"
                params.append(list(thread_ids))
            if keep_threads:
                where += " AND NOT (thread_id = ANY(%s::text[]))"
                params.append(list(keep_threads))
            order = " ORDER BY operation_id FOR UPDATE"
        return Compaction(sql=self, where=where, params=params, order=order)


SQLITE = LedgerSql(
    Dialect(
        name="sqlite",
        prefix="",
        mark="?",
        named_style=":{}",
        for_update="",
        matches_unknown_states=True,
    )
)
"""The statements of ``SqliteLedgerStore``."""

POSTGRES = LedgerSql(
    Dialect(
        name="postgresql",
        prefix="ledger_",
        mark="%s",
        named_style="%({})s",
        for_update=" FOR UPDATE",
        matches_unknown_states=False,
    )
)
"""The statements of ``PostgresLedgerStore`` (tables unqualified: see ``search_path``)."""


# -- SQLite only ---------------------------------------------------------------

SQLITE_DATA_VERSION = "PRAGMA data_version"
"""Changes exactly when another connection committed (``_ThreadListings``)."""
SQLITE_HAS_SCHEMA_TABLE = (
    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
)
SQLITE_COUNT_OBJECTS = "SELECT COUNT(*) FROM sqlite_master"


# -- PostgreSQL only -------------------------------------------------------------

PG_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
PG_BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
# A transaction's settings, local to it (nothing lingers on a connection that a
# transaction pooler hands to someone else next), and its id, read with its
# first statement, by which a COMMIT whose answer was lost is looked up. The
# server's start time goes with it: after a crash the server hands out again
# the ids whose WAL it lost, so an id is looked up only on the same server run.
PG_TX_ID = (
    "SELECT pg_current_xact_id()::text, set_config('synchronous_commit', %s, true), "
    "set_config('lock_timeout', %s, true), "
    "set_config('search_path', COALESCE(%s, current_setting('search_path')), true), "
    "pg_postmaster_start_time()::text"
)
PG_TX_PATH = "SELECT set_config('search_path', %s, true)"
PG_XACT_STATUS = (
    "SELECT CASE WHEN pg_postmaster_start_time()::text = %s "
    "THEN pg_xact_status(%s::xid8) ELSE 'restarted' END"
)
PG_HAS_TABLE = (
    "SELECT COUNT(*) FROM pg_catalog.pg_tables "
    "WHERE schemaname = current_schema() AND tablename = %s"
)
PG_COUNT_LEDGER_TABLES = (
    "SELECT COUNT(*) FROM pg_catalog.pg_tables "
    "WHERE schemaname = current_schema() AND tablename LIKE %s"
)
PG_CURRENT_SCHEMA = "SELECT current_schema()"
PG_SHOW_SEARCH_PATH = "SHOW search_path"
PG_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {}"
"""Formatted with ``psycopg.sql.Identifier(schema)``."""
PG_MIGRATION_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtext('effectgate.ledger:' || COALESCE(current_schema(), '')))"
)
PG_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('effectgate.ledger.schema'))"
PG_CLOCK = "SELECT clock_timestamp()"
