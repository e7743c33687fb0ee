"""The ledger conformance suite against every store: SQLite files and PostgreSQL schemas."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from tests._damage import damage_sqlite_arguments

from effectgate.ledger import LedgerStore, SqliteLedgerStore
from effectgate.testing.ledger_conformance import LedgerConformance


class TestSqliteStore(LedgerConformance):
    """Every conformance test, each on its own SQLite files under ``tmp_path``."""

    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.tmp = tmp_path

    def make_store(self, name: str) -> LedgerStore:
        return SqliteLedgerStore(self.tmp / f"{name}.sqlite3")

    def damage_arguments(self, name: str, operation_id: str) -> None:
        damage_sqlite_arguments(self.tmp / f"{name}.sqlite3", operation_id)


class TestPostgresStore(LedgerConformance):
    """Every conformance test, each on its own schemas of the session's scratch database."""

    @pytest.fixture(autouse=True)
    def _database(self, postgres_database: str) -> None:
        self.dsn = postgres_database
        self.prefix = f"c_{secrets.token_hex(4)}"

    def make_store(self, name: str) -> LedgerStore:
        from effectgate.ledger import PostgresLedgerStore

        return PostgresLedgerStore(self.dsn, schema=f"{self.prefix}_{name}", pool_size=2)

    def damage_arguments(self, name: str, operation_id: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn) as conn:  # one transaction, committed on exit
            table = sql.Identifier(f"{self.prefix}_{name}", "ledger_operations")
            conn.execute(sql.SQL("ALTER TABLE {} DISABLE TRIGGER USER").format(table))
            conn.execute(
                sql.SQL("UPDATE {} SET args_json = %s WHERE operation_id = %s").format(table),
                ('{"path": "elsewhere"}', operation_id),
            )
            conn.execute(sql.SQL("ALTER TABLE {} ENABLE TRIGGER USER").format(table))
