"""The ledger conformance suite against the SQLite store."""

from __future__ import annotations

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
