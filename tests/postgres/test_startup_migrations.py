"""Start-up on PostgreSQL: migrations are atomic, versions are recorded once, indexes end valid.

Before, ``PostgresSaver.setup`` built its indexes with ``CREATE INDEX
CONCURRENTLY IF NOT EXISTS``, one statement at a time: a start-up killed
while one was being built left an invalid index, which every later start
skipped while recording the migration as done. A newer migration version
went unnoticed, and a foreign ``checkpoints`` table was refused only after
the ledger had created its tables.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

from effectgate import StateDir
from tests.cli.conftest import eg, finish, start

pytestmark = pytest.mark.slow

UP = ("worker", "--until-idle")
"""A start-up: a worker opens both stores (migrating them), finds nothing to do and exits."""

_INVALID = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND NOT i.indisvalid"
)


def _versions(url: str) -> tuple[list[int], list[int]]:
    with psycopg.connect(url) as conn:
        cp = [r[0] for r in conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v")]
        ledger = [
            r[0] for r in conn.execute("SELECT version FROM ledger_schema_version ORDER BY 1")
        ]
    return cp, ledger


def _invalid(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(_INVALID)]


def _all_versions() -> tuple[list[int], list[int]]:
    from effectgate.ledger._postgres_migrations import PG_LATEST_VERSION

    return list(range(len(PostgresSaver.MIGRATIONS))), list(range(1, PG_LATEST_VERSION + 1))


def test_a_start_up_killed_mid_migration_leaves_no_invalid_index(
    tmp_path: Path, postgres_url: str
) -> None:
    """SIGKILL of a real start-up while it builds an index; the next start-up ends valid."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for v, statement in enumerate(PostgresSaver.MIGRATIONS[:6]):  # an older install
            conn.execute(statement)
            conn.execute("INSERT INTO checkpoint_migrations (v) VALUES (%s)", (v,))
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    sdir = ["--state-dir", str(sd.root)]
    with psycopg.connect(postgres_url) as blocker, psycopg.connect(postgres_url) as watch:
        # a writer mid-transaction on checkpoints: the index build waits for it
        blocker.execute("LOCK TABLE checkpoints IN ROW EXCLUSIVE MODE")
        proc = start(*UP, *sdir)
        deadline = time.monotonic() + 60
        backend = None
        while backend is None:
            assert time.monotonic() < deadline, "the start-up never reached the index build"
            assert proc.poll() is None, finish(proc)
            watch.rollback()
            row = watch.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE %s "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                ("%checkpoints_thread_id_idx%",),
            ).fetchone()
            backend = None if row is None else row[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        finish(proc)
        # the client is gone; its backend goes too (as on a dropped connection)
        watch.execute("SELECT pg_terminate_backend(%s)", (backend,))
        watch.commit()
        blocker.rollback()
    again = eg(*UP, *sdir)
    assert again.code == 0, again.stderr
    assert _invalid(postgres_url) == []
    assert _versions(postgres_url) == _all_versions()  # each version recorded once


def test_workers_starting_together_on_an_empty_schema_migrate_once(
    tmp_path: Path, postgres_url: str
) -> None:
    """Four start-ups queue on the migration locks together, then each migrates at most once.

    The test holds both migration locks (the ledger's and the checkpoint
    tables') in one open transaction until all four start-ups wait on an
    advisory lock, so their migrations really overlap: each one read the
    schema as empty before the lock, and must read it again under the lock.
    """
    from effectgate.graph._pg_saver import _SETUP_LOCK
    from effectgate.ledger._sql import PG_MIGRATION_LOCK

    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    with psycopg.connect(postgres_url) as holder, psycopg.connect(postgres_url) as watch:
        holder.execute(PG_MIGRATION_LOCK)
        holder.execute(_SETUP_LOCK)
        procs = [start(*UP, "--state-dir", str(sd.root)) for _ in range(4)]
        deadline = time.monotonic() + 60
        waiting = 0
        while waiting < 4:
            assert time.monotonic() < deadline, f"only {waiting} start-ups reached the lock"
            for p in procs:
                assert p.poll() is None, finish(p)
            watch.rollback()
            ((waiting,),) = watch.execute(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
            time.sleep(0.05)
        holder.commit()  # all four go on together
    ran = [finish(p, timeout=120) for p in procs]
    assert [r.code for r in ran] == [0] * 4, [r.stderr for r in ran]
    assert _invalid(postgres_url) == []
    assert _versions(postgres_url) == _all_versions()


def test_a_newer_checkpoint_migration_is_refused_in_one_line(
    tmp_path: Path, postgres_url: str
) -> None:
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    assert eg(*UP, "--state-dir", str(sd.root)).code == 0
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO checkpoint_migrations (v) VALUES (999)")
    ran = eg(*UP, "--state-dir", str(sd.root))
    assert ran.code == 2, ran.stderr
    (line,) = [x for x in ran.stderr.splitlines() if x.strip()]
    assert "999" in line and "newer" in line


def test_a_foreign_checkpoints_table_is_refused_before_anything_is_created(
    tmp_path: Path, postgres_url: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE checkpoints (id integer PRIMARY KEY, note text)")
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    ran = eg(*UP, "--state-dir", str(sd.root))
    assert ran.code == 2, ran.stderr
    (line,) = [x for x in ran.stderr.splitlines() if x.strip()]
    assert "checkpoints" in line
    with psycopg.connect(postgres_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
    assert tables == ["checkpoints"]  # nothing else was created


def test_a_foreign_ledger_table_is_refused_in_one_line_exit_2(
    tmp_path: Path, postgres_url: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger_operations (id integer)")
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    ran = eg(*UP, "--state-dir", str(sd.root))
    assert ran.code == 2, ran.stderr
    with psycopg.connect(postgres_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
    assert tables == ["ledger_operations"]


def test_an_invalid_index_left_by_an_older_build_is_rebuilt(
    tmp_path: Path, postgres_url: str
) -> None:
    """The state an older effectgate left: every migration recorded, one index invalid."""
    import threading

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for v, statement in enumerate(PostgresSaver.MIGRATIONS):
            if "INDEX" not in statement:
                conn.execute(statement)
            conn.execute("INSERT INTO checkpoint_migrations (v) VALUES (%s)", (v,))
    with psycopg.connect(postgres_url) as blocker, psycopg.connect(postgres_url) as watch:
        blocker.execute("LOCK TABLE checkpoints IN ROW EXCLUSIVE MODE")
        builder = psycopg.connect(postgres_url, autocommit=True)
        pid = builder.info.backend_pid
        failed: list[BaseException] = []

        def build() -> None:
            try:
                builder.execute(
                    "CREATE INDEX CONCURRENTLY checkpoints_thread_id_idx ON checkpoints(thread_id)"
                )
            except psycopg.Error as exc:
                failed.append(exc)

        t = threading.Thread(target=build)
        t.start()
        deadline = time.monotonic() + 60
        while not watch.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)
        ).fetchone():
            assert time.monotonic() < deadline
            watch.rollback()
            time.sleep(0.05)
        watch.execute("SELECT pg_terminate_backend(%s)", (pid,))
        watch.commit()
        t.join(30)
        blocker.rollback()
        builder.close()
    assert failed and _invalid(postgres_url) == ["checkpoints_thread_id_idx"]
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    ran = eg(*UP, "--state-dir", str(sd.root))
    assert ran.code == 0, ran.stderr
    assert _invalid(postgres_url) == []
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'checkpoints_thread_id_idx' "
            "AND c.relnamespace = current_schema()::regnamespace"
        ).fetchone()
    assert row is not None and row[0] is True
    assert _versions(postgres_url)[0] == _all_versions()[0]
