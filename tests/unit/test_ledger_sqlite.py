"""SQLite specifics: error codes, locking, durability settings, indexes, append-only tables."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate.errors import (
    ClaimLostError,
    ConfigError,
    LedgerBusyError,
    LedgerCorruptError,
    LedgerError,
)
from effectgate.ledger import UNFINISHED, OpState, SqliteLedger
from effectgate.ledger._migrations import LATEST_VERSION
from effectgate.ledger._sqlite import _translate_error
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_receipt, make_request


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as led:
        yield led


def _error(cls: type[sqlite3.Error], code: int, name: str, text: str) -> sqlite3.Error:
    exc = cls(text)
    exc.sqlite_errorcode = code
    exc.sqlite_errorname = name
    return exc


@pytest.mark.parametrize(
    ("code", "name", "text", "expected"),
    [
        (5, "SQLITE_BUSY", "database is locked", LedgerBusyError),
        (517, "SQLITE_BUSY_SNAPSHOT", "anything", LedgerBusyError),
        (6, "SQLITE_LOCKED", "database table is locked", LedgerBusyError),
        (26, "SQLITE_NOTADB", "file is not a database", LedgerCorruptError),
        (11, "SQLITE_CORRUPT", "database disk image is malformed", LedgerCorruptError),
        (14, "SQLITE_CANTOPEN", "unable to open database file", ConfigError),
        # the text says "locked", the code does not: classification follows the code
        (1, "SQLITE_ERROR", "database is locked", LedgerError),
    ],
)
def test_errors_are_classified_by_code_not_text(
    code: int, name: str, text: str, expected: type[Exception]
) -> None:
    """Each sqlite3 result code maps to one ledger error class."""
    err = _translate_error(_error(sqlite3.OperationalError, code, name, text), Path("x.db"))
    assert type(err) is expected
    assert name in str(err) and "x.db" in str(err)


def test_lock_held_past_busy_timeout_is_ledger_busy(tmp_path: Path) -> None:
    """Another process's write lock, held past busy_timeout, raises LedgerBusyError."""
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path, busy_timeout=0.05) as ledger:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(LedgerBusyError) as info:
            ledger.open(**vars_of(make_request()))
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        holder.execute("ROLLBACK")
        holder.close()
        assert ledger.get("t1:c1") is None
        ledger.open(**vars_of(make_request()))  # works once the lock is gone
        assert ledger.get("t1:c1") is not None


def test_durability_settings(ledger: SqliteLedger) -> None:
    """WAL, synchronous=FULL from the start and again after a review, foreign keys on."""
    conn = ledger.store._conn  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    req = make_request()
    ledger.record_review([req], [make_approval(req, FakeClock())])
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_happy_path_commits_and_statements(ledger: SqliteLedger, clock: FakeClock) -> None:
    """Review commits with NORMAL; claim and result are one FULL commit each and read nothing."""
    statements: list[str] = []
    conn = ledger.store._conn  # type: ignore[attr-defined]
    conn.set_trace_callback(statements.append)
    req = make_request()
    ledger.record_review([req], [make_approval(req, clock)])
    review = list(statements)
    statements.clear()
    op = ledger.claim(req.operation_id, attempt=1, worker="w1")
    claim = list(statements)
    statements.clear()
    ledger.record_result(
        op.operation_id, attempt=1, state=OpState.SUCCEEDED, receipt=make_receipt(op, clock)
    )
    result = list(statements)
    conn.set_trace_callback(None)
    assert review[0] == "PRAGMA synchronous = NORMAL" and review[-1] == "PRAGMA synchronous = FULL"
    for stmts in (claim, result):
        assert stmts[0] == "BEGIN IMMEDIATE" and stmts[-1] == "COMMIT"
        body = [s.split()[0] for s in stmts[1:-1]]
        assert body == ["UPDATE", "INSERT"], stmts  # compare-and-set RETURNING + event
        assert not any("synchronous" in s for s in stmts)


def test_recovery_uses_the_partial_index(ledger: SqliteLedger) -> None:
    """recover_in_flight's scan searches the partial index, whose WHERE is exactly UNFINISHED."""
    conn = ledger.store._conn  # type: ignore[attr-defined]
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'operations_unfinished'"
    ).fetchone()
    assert set(re.findall(r"'([A-Z_]+)'", sql)) == {s.value for s in UNFINISHED}
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    ledger.recover_in_flight()
    conn.set_trace_callback(None)
    (scan,) = [s for s in statements if s.startswith("SELECT")]
    plan = " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + scan))
    assert "USING INDEX operations_unfinished (state=?)" in plan


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET detail_json = '{}'",
        "DELETE FROM events",
        "DELETE FROM approvals",
        "UPDATE approvals SET reviewer = 'mallory'",
        "DELETE FROM operations",
        "UPDATE operations SET args_json = '{}'",
        "UPDATE operations SET max_attempts = 99",
    ],
)
def test_write_once_tables_refuse_rewrites(
    tmp_path: Path, clock: FakeClock, statement: str
) -> None:
    """Events and approvals are append-only; identity and budget columns are write-once."""
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path, clock=clock) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, clock)])
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="ledger: "):
        conn.execute(statement)
    conn.close()


def test_threads_sharing_one_ledger_claim_once(ledger: SqliteLedger, clock: FakeClock) -> None:
    """Eight Python threads on one Ledger claim one attempt: one wins, seven lose."""
    req = make_request()
    ledger.record_review([req], [make_approval(req, clock)])
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def worker(n: int) -> None:
        barrier.wait()
        try:
            ledger.claim(req.operation_id, attempt=1, worker=f"w{n}")
            outcomes.append("won")
        except ClaimLostError:
            outcomes.append("lost")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]
    assert [e.dst for e in ledger.events()].count(OpState.IN_FLIGHT) == 1


def test_closed_ledger_refuses_calls(tmp_path: Path) -> None:
    """After close(), calls raise LedgerError; close() is idempotent."""
    ledger = SqliteLedger(tmp_path / "ledger.sqlite3")
    ledger.close()
    ledger.close()
    with pytest.raises(LedgerError, match="closed"):
        ledger.list()


def test_concurrent_first_open_migrates_once(tmp_path: Path) -> None:
    """Several connections creating the same new file end with one schema_version row."""
    path = tmp_path / "ledger.sqlite3"
    barrier = threading.Barrier(4)
    ledgers: list[SqliteLedger] = []

    def opener() -> None:
        barrier.wait()
        ledgers.append(SqliteLedger(path))

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for led in ledgers:
        led.close()
    conn = sqlite3.connect(path)
    versions = conn.execute("SELECT version FROM schema_version").fetchall()
    assert versions == [(v,) for v in range(1, LATEST_VERSION + 1)]
    conn.close()
    assert len(ledgers) == 4


def vars_of(req: object) -> dict[str, object]:
    return {name: getattr(req, name) for name in req.__dataclass_fields__}  # type: ignore[attr-defined]


def _undo_v3(conn: sqlite3.Connection) -> None:
    """Take the retention migration (v3) back out: its tables, and the v1 delete guards."""
    from effectgate.ledger._migrations import MIGRATIONS

    for table in ("thread_tombstones", "operation_tombstones"):
        conn.execute(f"DROP TABLE {table}")
    for name in (
        "operations_no_delete",
        "approvals_append_only_delete",
        "events_append_only_delete",
    ):
        conn.execute(f"DROP TRIGGER {name}")
        (stmt,) = [s for s in MIGRATIONS[1] if f"TRIGGER {name} " in s]
        conn.execute(stmt)


def test_a_v1_ledger_is_migrated_to_v2_and_keeps_its_rows(tmp_path: Path) -> None:
    """A ledger written before the intent index gains it; rows survive; no-migrate refuses."""
    from effectgate.errors import SchemaVersionError

    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as ledger:
        ledger.record_review([make_request("op-1")], [])
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX operations_by_intent")
    conn.execute("DROP TABLE thread_events")  # schema v4
    conn.execute("DROP TRIGGER operations_recoveries_grow")  # schema v6
    conn.execute("ALTER TABLE operations DROP COLUMN recoveries")
    conn.execute("DELETE FROM schema_version WHERE version >= 2")
    _undo_v3(conn)
    conn.commit()
    conn.close()
    with pytest.raises(SchemaVersionError):
        SqliteLedger(path, migrate=False)
    with SqliteLedger(path) as ledger:
        (op,) = ledger.list()
        assert ledger.list(intent_hash=op.intent_hash) == [op]
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
    assert "operations_by_intent" in names
