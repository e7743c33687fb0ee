"""The ledger conformance suite against every store: SQLite files and PostgreSQL schemas."""

from __future__ import annotations

import secrets
import sqlite3
from pathlib import Path

import pytest

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
        db = sqlite3.connect(self.tmp / f"{name}.sqlite3")
        try:
            with db:
                triggers = db.execute(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
                ).fetchall()
                for trigger, _ in triggers:
                    db.execute(f'DROP TRIGGER "{trigger}"')
                db.execute(
                    'UPDATE operations SET args_json = \'{"path": "elsewhere"}\' '
                    "WHERE operation_id = ?",
                    (operation_id,),
                )
                for _, sql in triggers:
                    db.execute(sql)
        finally:
            db.close()


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
