"""Thread leases on PostgreSQL survive a crash of the database server.

A crash of the server (``pg_ctl stop -m immediate``, then crash recovery)
loses every transaction committed at ``synchronous_commit = off`` since the
last WAL flush, while the workers that saw those commits go on running. A
lease write lost that way would hand the thread back to its previous owner
while the new one still believes it holds it: two runners on one thread
(found by the PostgreSQL fault campaign, trial 9 of a 16-trial run: one mail
sent twice, checkpoint histories broken). Each test crashes a private
cluster of its own right after the lease write and reads the lease row, and
the old holder's renewal, after recovery.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from effectgate.errors import ThreadBusyError
from effectgate.ledger import PostgresLedger
from effectgate.testing.postgres import PrivateCluster
from tests.postgres._private import late_wal_cluster

pytestmark = pytest.mark.crash


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    """A private server that keeps asynchronous commits unflushed (``late_wal_cluster``)."""
    with late_wal_cluster("leases") as server:
        yield server


def _lease_row(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        return [
            (str(owner), int(token))
            for owner, token in conn.execute(
                "SELECT owner, token FROM ledger_thread_leases WHERE thread_id = 't1'"
            ).fetchall()
        ]


def test_a_lease_taken_over_survives_a_server_crash(cluster: PrivateCluster) -> None:
    """B takes over A's lapsed lease; the server crashes; the row is B's, A's renewal refused.

    Failed before leases were durable on PostgreSQL: after recovery the row
    was A's again (token 1), and A's renewal succeeded while B still held
    token 2 in memory.
    """
    url = cluster.url("leases")
    with PostgresLedger(url, pool_size=2) as ledger:
        ledger.record_thread("t1", {"task": "x"}, {})
        old = ledger.acquire_lease("t1", "worker-a", 30)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # A's lease is on disk, as a busy run's would be
        # A is stopped (SIGSTOP) past its lease: B takes it over from A, proven stale.
        new = ledger.acquire_lease("t1", "worker-b", 30, take_over_from="worker-a")
        assert new.token == old.token + 1
        cluster.restart("immediate")
        assert _lease_row(url) == [("worker-b", new.token)]
        with pytest.raises(ThreadBusyError):
            ledger.renew_lease(old, 30)
        assert _lease_row(url) == [("worker-b", new.token)]


def test_a_renewed_lease_survives_a_server_crash(cluster: PrivateCluster) -> None:
    """A renewal's new expiry is still there after a crash: no other owner may take the thread.

    Failed before: the renewal was lost, the row kept the expiry it had, and
    a lease that had lapsed by that expiry was taken by another owner while
    its holder went on under the renewal it had been told of.
    """
    url = cluster.url("leases")
    with PostgresLedger(url, pool_size=2) as ledger:
        ledger.record_thread("t1", {"task": "x"}, {})
        held = ledger.acquire_lease("t1", "worker-a", 0.2)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the short lease is on disk, flushed
        renewed = ledger.renew_lease(held, 60)
        cluster.restart("immediate")
        with psycopg.connect(url) as conn:
            ((expires_ms,),) = conn.execute(
                "SELECT expires_at_ms FROM ledger_thread_leases WHERE thread_id = 't1'"
            ).fetchall()
        assert int(expires_ms) == int(renewed.expires_at.timestamp() * 1000)
        with pytest.raises(ThreadBusyError):
            ledger.acquire_lease("t1", "worker-b", 30)


def test_a_commit_lost_with_a_crashed_server_is_not_taken_for_another(
    cluster: PrivateCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT whose answer and WAL a crash lost is unknown, not "committed" by a reused id.

    After crash recovery the server hands out again the transaction ids whose
    WAL it lost: ``pg_xact_status`` of the old id then reports the new
    transaction's outcome. Here the block's commit is lost with the crash (its
    flush never happened: forced by committing it asynchronously), another
    session commits the next transaction, and only then does the session look
    its id up. Failed before: the lookup said "committed" (the other
    session's), ``record_thread`` returned, and no thread row existed.
    """
    from effectgate.errors import DatabaseUnavailableError
    from effectgate.ledger import PostgresLedgerStore
    from effectgate.ledger._postgres import _Session, _tx_settings

    url = cluster.url("leases")
    real = _Session._send
    lost: list[bool] = []

    def send(self: Any, conn: Any, steps: Any, *, commit: bool, pipeline: bool) -> Any:
        results = real(self, conn, steps, commit=commit, pipeline=pipeline)
        if commit and not lost:
            lost.append(True)
            cluster.restart("immediate")
            with psycopg.connect(url, autocommit=True) as other, other.transaction():
                other.execute("SELECT pg_current_xact_id()")  # takes the lost id again
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return results

    def not_durable(self: Any, *, durable: bool = True) -> Any:
        return _tx_settings(durable=False, busy_s=self._busy_s, schema=self.schema)

    with PostgresLedger(url, pool_size=2, retry_for=10) as ledger:
        ledger.record_thread("t0", {"task": "x"}, {})
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        monkeypatch.setattr(PostgresLedgerStore, "_settings", not_durable)
        monkeypatch.setattr(_Session, "_send", send)
        with pytest.raises(DatabaseUnavailableError):
            ledger.record_thread("t1", {"task": "y"}, {})
        monkeypatch.undo()
        assert lost == [True]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT thread_id FROM ledger_threads ORDER BY 1").fetchall() == [
            ("t0",)
        ]
