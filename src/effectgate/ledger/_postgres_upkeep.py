"""What retention sends to a PostgreSQL ledger: its tables' sizes and their VACUUM.

``prune`` (``effectgate.graph._prune``) reports the bytes of both records and
compacts both after it deletes; this module is the ledger's half on
PostgreSQL, whichever store holds the checkpoints. ``pg_vacuum`` (a VACUUM
under a bounded ``lock_timeout``) is also what the PostgreSQL checkpoint
store (``effectgate.graph._pg_saver``) runs on its own tables. psycopg is
imported only when a PostgreSQL ledger is met, so an SQLite run never loads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "PG_LEDGER_PRUNED_TABLES",
    "pg_vacuum",
    "postgres_ledger_sizes",
    "vacuum_postgres_ledger",
]

PG_LEDGER_PRUNED_TABLES = (
    "ledger_operations",
    "ledger_approvals",
    "ledger_events",
    "ledger_operation_tombstones",
    "ledger_thread_tombstones",
)
"""The ledger tables a prune deletes from or writes to (VACUUMed after it)."""

_PG_LEDGER_BYTES = (
    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relname LIKE %s"
)


def pg_vacuum(conn: Any, mode: str, tables: Sequence[str], wait_s: float) -> None:
    """VACUUM ``tables`` with a bounded ``lock_timeout``, restored afterwards.

    ``VACUUM FULL`` needs an ACCESS EXCLUSIVE lock: unbounded, it would wait
    behind any open transaction on the table, and every worker would then
    queue behind its own lock request. ``lock_timeout`` bounds that wait
    (PostgreSQL documentation, "Client Connection Defaults"); past it the
    server raises ``lock_not_available`` (SQLSTATE 55P03).

    Args:
        conn: an autocommit psycopg connection (VACUUM cannot run in a transaction).
        mode: ``"full"`` (``VACUUM (FULL, ANALYZE)``) or ``"incremental"``
            (``VACUUM (ANALYZE)``).
        tables: the tables, in the connection's ``search_path``.
        wait_s: seconds to wait for a table's lock (at least 1 ms).

    Raises:
        psycopg.Error: SQLSTATE 55P03 when a lock was not had within ``wait_s``.
    """
    conn.execute(f"SET lock_timeout = '{max(1, round(wait_s * 1000))}ms'")
    try:
        options = "FULL, ANALYZE" if mode == "full" else "ANALYZE"
        conn.execute(f"VACUUM ({options}) {', '.join(tables)}")
    finally:
        conn.execute("RESET lock_timeout")


@contextlib.contextmanager
def _postgres_ledger_conn(ledger: Any) -> Iterator[Any | None]:
    """A connection to a PostgreSQL ledger's schema, or ``None`` for another ledger."""
    dsn = getattr(ledger.store, "dsn", None)
    if not isinstance(dsn, str):
        yield None
        return
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        schema = getattr(ledger.store, "schema", None)
        if schema:
            conn.execute(pgsql.SQL("SET search_path = {}").format(pgsql.Identifier(schema)))
        yield conn


def postgres_ledger_sizes(ledger: Any) -> dict[str, int]:
    """``{"ledger": bytes}`` of a PostgreSQL ledger's tables; ``{}`` for another ledger.

    Args:
        ledger: a ``Ledger``; only one whose store has a ``dsn`` is measured.

    Returns:
        The ``pg_total_relation_size`` (table, TOAST and indexes) of every
        ``ledger_`` table in its schema, in bytes.
    """
    with _postgres_ledger_conn(ledger) as conn:
        if conn is None:
            return {}
        (total,) = conn.execute(_PG_LEDGER_BYTES, ("ledger\\_%",)).fetchone()
        return {"ledger": int(total)}


def vacuum_postgres_ledger(ledger: Any, mode: str, wait_s: float) -> None:
    """VACUUM the ledger tables a prune touched, for a PostgreSQL ledger; else nothing.

    Args:
        ledger: a ``Ledger``.
        mode: ``"full"``, ``"incremental"`` or ``"none"`` (nothing is sent).
        wait_s: as ``pg_vacuum``.

    Raises:
        psycopg.Error: as ``pg_vacuum``.
    """
    if mode == "none":
        return
    with _postgres_ledger_conn(ledger) as conn:
        if conn is not None:
            pg_vacuum(conn, mode, PG_LEDGER_PRUNED_TABLES, wait_s)
