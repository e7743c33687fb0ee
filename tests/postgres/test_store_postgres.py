"""What only the PostgreSQL store has: its schema guards, lock timeouts and the database clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from effectgate import errors
from effectgate._clock import FakeClock
from effectgate.ledger import PostgresLedger, PostgresLedgerStore
from effectgate.ledger._postgres import DatabaseClock, same_database, without_password
from effectgate.testing.ledger_conformance import make_approval, make_request


def _ledger(url: str, **kwargs: object) -> PostgresLedger:
    return PostgresLedger(url, clock=FakeClock(), **kwargs)  # type: ignore[arg-type]


def test_a_newer_schema_is_refused_untouched(postgres_url: str) -> None:
    """A ledger schema from a later build raises SchemaVersionError and is not written to."""
    _ledger(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ledger_schema_version VALUES (99, 0)")
    with pytest.raises(errors.SchemaVersionError):
        PostgresLedgerStore(postgres_url)
    with psycopg.connect(postgres_url) as conn:
        (top,) = conn.execute("SELECT MAX(version) FROM ledger_schema_version").fetchone() or (0,)
    assert top == 99


def test_foreign_ledger_tables_are_refused(postgres_url: str) -> None:
    """A schema with ledger_* tables but no version table is not ours: LedgerCorruptError."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger_operations (id int)")
    with pytest.raises(errors.LedgerCorruptError, match="not made by effectgate"):
        PostgresLedgerStore(postgres_url)


def test_history_is_append_only_in_the_database(postgres_url: str) -> None:
    """Updating or deleting events, or changing an operation's identity, is refused by triggers."""
    clock = FakeClock()
    with PostgresLedger(postgres_url, clock=clock) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, clock)])
    statements = [
        "UPDATE ledger_events SET kind = 'x'",
        "DELETE FROM ledger_approvals",
        "TRUNCATE ledger_events",
        "UPDATE ledger_operations SET args_json = '{}'",
        "DELETE FROM ledger_operations",
    ]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for statement in statements:
            with pytest.raises(psycopg.errors.RaiseException, match="ledger: "):
                conn.execute(statement)


def test_a_row_lock_held_past_the_busy_timeout_is_ledger_busy(postgres_url: str) -> None:
    """A claim waiting on a row another transaction holds gives up with LedgerBusyError."""
    clock = FakeClock()
    with PostgresLedger(postgres_url, clock=clock) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, clock)])
    holder = _ledger(postgres_url)
    waiter = _ledger(postgres_url, busy_timeout=0.2)
    held = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with holder.store.transaction() as tx:
            tx.get_operation(req.operation_id)  # FOR UPDATE
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        with pytest.raises(errors.LedgerBusyError):
            waiter.claim(req.operation_id, attempt=1, worker="w")
    finally:
        done.set()
        thread.join()
    assert waiter.claim(req.operation_id, attempt=1, worker="w").attempt == 1
    holder.close()
    waiter.close()


def test_the_database_clock_is_the_servers(postgres_url: str) -> None:
    """PostgresLedger's default clock reads the server; between re-reads it runs monotonically."""
    with PostgresLedger(postgres_url) as ledger:
        assert isinstance(ledger.clock, DatabaseClock)
        server = ledger.store.server_time()  # type: ignore[attr-defined]
        assert abs((ledger.clock.now() - server).total_seconds()) < 1.0
    reads: list[datetime] = []
    base = datetime(2030, 1, 1, tzinfo=UTC)

    def read() -> datetime:
        reads.append(base)
        return base

    clock = DatabaseClock(read, resync_s=3600)
    first, second = clock.now(), clock.now()
    assert len(reads) == 1 and base <= first <= second < base + timedelta(seconds=1)


def test_store_urls_are_compared_and_written_without_passwords() -> None:
    """The marker gets the URL without its password; the password does not make it another store."""
    url = "postgresql://ann:s3cret@db:5433/agents?options=-c%20search_path%3Dteam"
    bare = without_password(url)
    assert "s3cret" not in bare and same_database(bare, url)
    assert not same_database(url, url.replace("team", "other"))
