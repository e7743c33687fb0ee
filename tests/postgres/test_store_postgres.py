"""What only the PostgreSQL store has: its schema guards, lock timeouts and the database clock."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from effectgate import errors
from effectgate.ledger import EventKind, NewEvent, PostgresLedger, PostgresLedgerStore, WriteOnce
from effectgate.ledger._postgres import (
    DatabaseClock,
    migrate_postgres_ledger,
    same_database,
    without_password,
)
from effectgate.ledger._postgres_migrations import PG_LATEST_VERSION, PG_MIGRATIONS
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_request


def _ledger(url: str, **kwargs: object) -> PostgresLedger:
    kwargs.setdefault("clock", FakeClock())
    return PostgresLedger(url, **kwargs)  # type: ignore[arg-type]


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
    with pytest.raises(errors.ConfigError, match="not made by effectgate"):
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


def _rejected(ledger: PostgresLedger, clock: FakeClock, operation_id: str) -> str:
    """Open ``operation_id`` and reject it: a terminal operation with an approval and events."""
    req = make_request(operation_id)
    ledger.record_review([req], [make_approval(req, clock, decision="reject")])
    return req.intent_hash


def test_a_version_1_schema_is_migrated_and_keeps_its_rows(postgres_url: str) -> None:
    """A schema written by the first PostgreSQL build opens, migrates to the latest, and works."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for statement in PG_MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute("INSERT INTO ledger_schema_version VALUES (1, 0)")
        conn.execute(
            "INSERT INTO ledger_threads VALUES ('old', '{}', '{}', 0)"
        )  # a row written before
    with pytest.raises(errors.SchemaVersionError):
        PostgresLedgerStore(postgres_url, migrate=False)
    clock = FakeClock()
    with _ledger(postgres_url, clock=clock) as ledger:
        assert ledger.get_thread("old") is not None
        _rejected(ledger, clock, "t1:c1")
        clock.advance(60)
        with ledger.store.transaction() as tx:
            assert tx.compact_operations(finished_before=clock.now(), now=clock.now()) == 1
    with psycopg.connect(postgres_url) as conn:
        (top,) = conn.execute("SELECT MAX(version) FROM ledger_schema_version").fetchone() or (0,)
    assert top == PG_LATEST_VERSION


def test_migrations_can_stop_at_an_older_version_and_the_store_takes_them_further(
    postgres_url: str,
) -> None:
    """``migrate_postgres_ledger`` runs the real migrations up to a version, recording each once."""

    def versions() -> list[int]:
        with psycopg.connect(postgres_url) as conn:
            return [
                r[0] for r in conn.execute("SELECT version FROM ledger_schema_version ORDER BY 1")
            ]

    with pytest.raises(ValueError, match="to_version"):
        migrate_postgres_ledger(postgres_url, to_version=PG_LATEST_VERSION + 1)
    assert migrate_postgres_ledger(postgres_url, to_version=1) == 1
    assert versions() == [1]
    assert migrate_postgres_ledger(postgres_url, to_version=PG_LATEST_VERSION - 1) == (
        PG_LATEST_VERSION - 1
    )
    assert migrate_postgres_ledger(postgres_url, to_version=1) == PG_LATEST_VERSION - 1  # no-op
    assert versions() == list(range(1, PG_LATEST_VERSION))
    with pytest.raises(errors.SchemaVersionError):
        PostgresLedgerStore(postgres_url, migrate=False)  # older than this build
    PostgresLedgerStore(postgres_url).close()
    assert versions() == list(range(1, PG_LATEST_VERSION + 1))


def test_rows_are_deleted_only_behind_a_tombstone(postgres_url: str) -> None:
    """The delete guards refuse by hand what compaction may do once the tombstone is written."""
    clock = FakeClock()
    with _ledger(postgres_url, clock=clock) as ledger:
        intent = _rejected(ledger, clock, "t1:c1")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for table in ("ledger_operations", "ledger_approvals", "ledger_events"):
                with pytest.raises(psycopg.errors.RaiseException, match="ledger: "):
                    conn.execute(f"DELETE FROM {table}")
            # a tombstone naming another intent does not free the operation row
            conn.execute(
                "INSERT INTO ledger_operation_tombstones VALUES "
                "('t1:c1', 't1', 'write_file', 'other', 'REJECTED', NULL, 0, 0)"
            )
            conn.execute("DELETE FROM ledger_events")  # events and approvals go once it exists
            with pytest.raises(psycopg.errors.RaiseException, match="only once compacted"):
                conn.execute("DELETE FROM ledger_operations")
            conn.execute("DELETE FROM ledger_operation_tombstones")
        clock.advance(60)
        with ledger.store.transaction() as tx:
            assert tx.compact_operations(finished_before=clock.now(), now=clock.now()) == 1
        assert ledger.get("t1:c1") is None
        with ledger.store.read() as r:
            tomb = r.get_operation_tombstone("t1:c1")
            assert r.approvals("t1:c1") == []
        assert tomb is not None and (tomb.intent_hash, tomb.compacted_at) == (intent, clock.now())
        with ledger.store.transaction() as tx:
            assert tx.drop_operation_tombstones(finished_before=clock.now()) == 1
        with ledger.store.read() as r:
            assert r.get_operation_tombstone("t1:c1") is None


def test_compaction_leaves_unfinished_and_other_threads_alone(postgres_url: str) -> None:
    """Only terminal operations of the named threads, finished before the cutoff, are compacted."""
    clock = FakeClock()
    with _ledger(postgres_url, clock=clock) as ledger:
        _rejected(ledger, clock, "t1:c1")
        other = make_request("t2:c1", thread_id="t2")
        ledger.record_review([other], [make_approval(other, clock, decision="reject")])
        live = make_request("t1:c2")
        ledger.record_review([live], [make_approval(live, clock)])  # APPROVED: unfinished
        cutoff = clock.now() + timedelta(seconds=1)
        with ledger.store.transaction() as tx:
            assert tx.compact_operations(finished_before=cutoff, now=cutoff, thread_ids=[]) == 0
            n = tx.compact_operations(finished_before=cutoff, now=cutoff, thread_ids=["t1"])
        assert n == 1
        assert [op.operation_id for op in ledger.list()] == ["t1:c2", "t2:c1"]


def test_a_lease_stored_as_never_expiring_is_held_and_breakable(postgres_url: str) -> None:
    """An expiry past datetime's range reads as held; the compare-and-set still matches it."""
    with _ledger(postgres_url) as ledger:
        ledger.acquire_lease("t1", "far-host", 60)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"UPDATE ledger_thread_leases SET expires_at_ms = {2**63 - 1}")
        with pytest.raises(errors.ThreadBusyError):
            ledger.acquire_lease("t1", "me", 60)
        was = ledger.break_lease("t1", by="carol", reason="far-host is gone")
        assert was.expires_at == datetime.max.replace(tzinfo=UTC)
        assert ledger.acquire_lease("t1", "me", 60).token == 3
        (event,) = ledger.thread_events("t1")
        assert (event.kind, event.actor) == ("lease_broken", "carol")
    with (
        psycopg.connect(postgres_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.RaiseException, match="append-only"),
    ):
        conn.execute("DELETE FROM ledger_thread_events")


def test_an_id_used_again_after_compaction_is_flagged_and_compacts_again(
    postgres_url: str,
) -> None:
    """Reopening a compacted id records its tombstone; compacting it again replaces that."""
    clock = FakeClock()
    with _ledger(postgres_url, clock=clock) as ledger:
        first = _rejected(ledger, clock, "t1:c1")
        clock.advance(60)
        with ledger.store.transaction() as tx:
            assert tx.compact_operations(finished_before=clock.now(), now=clock.now()) == 1
        _rejected(ledger, clock, "t1:c1")
        (created,) = [e for e in ledger.events(operation_id="t1:c1") if e.kind is EventKind.CREATED]
        assert created.detail["compacted_earlier"]["intent_hash"] == first
        clock.advance(60)
        with ledger.store.transaction() as tx:
            assert tx.compact_operations(finished_before=clock.now(), now=clock.now()) == 1
        with ledger.store.read() as r:
            tomb = r.get_operation_tombstone("t1:c1")
        assert tomb is not None and tomb.compacted_at == clock.now()


def test_an_unknown_state_cannot_be_written(postgres_url: str) -> None:
    """The state CHECK makes a row no build can read impossible, so no state filter misses one."""
    clock = FakeClock()
    with _ledger(postgres_url, clock=clock) as ledger:
        _rejected(ledger, clock, "t1:c1")
    with (
        psycopg.connect(postgres_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.CheckViolation),
    ):
        conn.execute("UPDATE ledger_operations SET state = 'SUCCEEDED '")


def test_a_single_read_runs_without_a_transaction_and_refuses_a_second_statement(
    postgres_url: str,
) -> None:
    """read(single=True): one statement on the autocommit connection; a second is refused.

    A plain read() keeps its REPEATABLE READ snapshot: a commit made between its
    two statements is not seen by the second.
    """
    idle = psycopg.pq.TransactionStatus.IDLE
    with PostgresLedger(postgres_url, clock=FakeClock()) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, FakeClock())])
        store = ledger.store
        assert isinstance(store, PostgresLedgerStore)
        with store.read(single=True) as r:
            assert r.get_operation(req.operation_id) is not None
            session = r._conn  # type: ignore[attr-defined]
            assert session._conn.info.transaction_status is idle  # no BEGIN was sent
            with pytest.raises(errors.LedgerError, match="second statement"):
                r.get_thread(req.thread_id)
        with store.read(single=True) as r:  # the connection went back clean
            assert r.approvals(req.operation_id)
        other = make_request("t1:c2")
        with store.read() as r:
            assert r.get_operation(other.operation_id) is None
            assert r._conn._conn.info.transaction_status is not idle  # type: ignore[attr-defined]
            ledger.record_review([other], [make_approval(other, FakeClock())])
            assert r.get_operation(other.operation_id) is None  # the snapshot holds
        assert ledger.get(other.operation_id) is not None


def test_a_single_read_sends_its_one_statement_and_nothing_else(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No BEGIN before it and no ROLLBACK after it: one statement, one round trip.

    A refactoring once dropped the ``single`` condition from the session's
    finish, and every one-statement read sent a ROLLBACK outside any
    transaction (15 extra round trips per side effect).
    """
    with PostgresLedger(postgres_url, clock=FakeClock()) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, FakeClock())])
        sent: list[str] = []
        original = psycopg.Connection.execute

        def spy(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(" ".join(str(query).split())[:20])
            return original(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", spy)
        assert ledger.get(req.operation_id) is not None  # a facade read: single=True
        assert len(sent) == 1 and sent[0].startswith("SELECT"), sent
        sent.clear()
        with ledger.store.read() as r:  # a snapshot read still opens and ends one
            r.get_operation(req.operation_id)
        assert [s.split()[0] for s in sent] == ["BEGIN", "SELECT", "ROLLBACK"], sent


class _Trips:
    """Counts what psycopg sends while installed: round trips (a pipeline is one) and statements."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trips = 0
        self.statements: list[str] = []
        execute, pipeline_exit = psycopg.Connection.execute, psycopg.Pipeline.__exit__

        def spy(conn: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self.statements.append(" ".join(str(query).split()).split(" ", 1)[0])
            if conn._pipeline is None:
                self.trips += 1
            return execute(conn, query, *args, **kwargs)

        def exit_spy(pipe: Any, *exc: Any) -> Any:
            if pipe._conn._pipeline is pipe and pipe.level == 1:
                self.trips += 1
            return pipeline_exit(pipe, *exc)

        monkeypatch.setattr(psycopg.Connection, "execute", spy)
        monkeypatch.setattr(psycopg.Pipeline, "__exit__", exit_spy)

    def reset(self) -> None:
        self.trips, self.statements = 0, []


def test_an_event_travels_with_the_commit_and_a_lease_is_one_round_trip(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim: [BEGIN, settings, UPDATE], then [INSERT event, COMMIT]; lease give-up, re-take: one.

    What the saving must not change: the event is committed with the claim,
    in the same transaction, and the lease rows are what the full rule gives.
    """
    clock = FakeClock()
    with PostgresLedger(postgres_url, clock=clock) as ledger:
        req = make_request()
        ledger.record_review([req], [make_approval(req, clock)])
        trips = _Trips(monkeypatch)
        ledger.claim(req.operation_id, attempt=1, worker="w1")
        # SELECT: the transaction's id and local settings, with BEGIN (no round trip of its own)
        assert trips.statements == ["BEGIN", "SELECT", "UPDATE", "INSERT", "COMMIT"]
        assert trips.trips == 2
        lease = ledger.acquire_lease("t1", "w1", 30)
        trips.reset()
        ledger.release_lease(lease)
        again = ledger.acquire_lease("t1", "w1", 30)
        assert trips.trips == 2  # one each: BEGIN, settings, UPDATE, COMMIT in one pipeline
        assert trips.statements.count("COMMIT") == 2
        assert (again.owner, again.token) == ("w1", lease.token)
    with PostgresLedger(postgres_url, clock=clock) as fresh:
        (claimed,) = [e for e in fresh.events(operation_id=req.operation_id) if e.attempt == 1]
        assert claimed.detail["worker"] == "w1"
        with fresh.store.read() as r:
            assert r.get_lease("t1") == again


def test_a_queued_event_that_fails_rolls_its_transaction_back(postgres_url: str) -> None:
    """The event insert's error surfaces at the COMMIT it travels with; nothing is kept."""
    clock = FakeClock()
    with PostgresLedger(postgres_url, clock=clock) as ledger:
        req = make_request()
        (op,) = ledger.record_review([req], [make_approval(req, clock)])
        before = ledger.events()
        ghost = dataclasses.replace(op, operation_id="no-such-operation")
        second = make_approval(req, clock)
        second = dataclasses.replace(second, reviewer="someone else")
        with pytest.raises(errors.LedgerError), ledger.store.transaction() as tx:
            assert tx.put_approval(second) is WriteOnce.INSERTED
            tx.append_event(  # REFERENCES ledger_operations: refused at the COMMIT
                NewEvent(
                    operation_id=ghost.operation_id,
                    kind=EventKind.NOTE,
                    src=None,
                    dst=None,
                    attempt=0,
                    at=clock.now(),
                    detail={"x": 1},
                )
            )
        assert ledger.events() == before
        assert len(ledger.approvals(op.operation_id)) == 1
        assert ledger.get(op.operation_id) == op  # the pooled connection went back clean
