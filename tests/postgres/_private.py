"""Private PostgreSQL clusters for the tests that crash, restart or stop a server.

One home for the skip rule (initdb / pg_ctl absent: skipped, or failed when
``EFFECTGATE_REQUIRE_POSTGRES`` asks for them) and for the cluster whose WAL
writer flushes as late as it may, on which an asynchronous commit is still
unflushed when the test crashes the server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from effectgate.testing.postgres import ENV_REQUIRE, PrivateCluster


def require_private_cluster() -> None:
    """Skip the test when initdb / pg_ctl are not installed; fail instead if they are required.

    Raises:
        pytest.skip.Exception: PostgreSQL's server binaries are absent.
        pytest.fail.Exception: they are absent and ``ENV_REQUIRE`` is ``1`` (CI).
    """
    if not PrivateCluster.available():
        if os.environ.get(ENV_REQUIRE) == "1":
            pytest.fail("initdb / pg_ctl not installed", pytrace=False)
        pytest.skip("initdb / pg_ctl not installed (Debian: postgresql)")


@contextmanager
def late_wal_cluster(dbname: str) -> Iterator[PrivateCluster]:
    """A private server whose WAL writer flushes as late as it may (10 s), holding ``dbname``.

    An asynchronous commit is then still in the WAL buffers when the test
    crashes the server: what a crash within ``3 * wal_writer_delay`` of the
    commit does on a default server, made certain.

    Args:
        dbname: the database created on it for the test.

    Yields:
        The running cluster; it is stopped and removed after the block.
    """
    require_private_cluster()
    server = PrivateCluster()
    server.start()
    try:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("ALTER SYSTEM SET wal_writer_flush_after = 0")
            conn.execute(f'CREATE DATABASE "{dbname}"')
        server.restart("fast")
        yield server
    finally:
        server.close()
