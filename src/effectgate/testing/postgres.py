"""A scratch PostgreSQL database per test session, and the pytest fixtures that hand it out.

The server comes from ``EFFECTGATE_TEST_POSTGRES`` (a libpq DSN or
``postgresql://`` URL; default ``postgresql://postgres@127.0.0.1:5432/postgres``).
The session creates a fresh database ``effectgate_test_<random>`` on it and
drops it at the end, so tests never see each other's rows or a developer's.
Each test that asks for ``postgres_url`` gets its own schema in that database,
named in the URL's ``options`` (``-c search_path=...``), so every connection
opened from the URL (ledger, checkpointer, a child process) lands in it.

Without a reachable server the PostgreSQL tests are skipped, with one reason
line; with ``EFFECTGATE_REQUIRE_POSTGRES=1`` (CI) they fail instead.

Load the fixtures with ``pytest_plugins = ("effectgate.testing.postgres",)``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = [
    "DEFAULT_DSN",
    "ENV_DSN",
    "ENV_REQUIRE",
    "PrivateCluster",
    "free_port",
    "postgres_database",
    "postgres_url",
    "scratch_database",
    "with_search_path",
]

ENV_DSN = "EFFECTGATE_TEST_POSTGRES"
"""The environment variable naming the test server."""
ENV_REQUIRE = "EFFECTGATE_REQUIRE_POSTGRES"
"""Set to ``1`` to make an unreachable server fail the PostgreSQL tests instead of skipping them."""
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
"""The local trust-authenticated server these tests expect by default."""


def _admin_dsn() -> str:
    return os.environ.get(ENV_DSN) or DEFAULT_DSN


def with_search_path(dsn: str, schema: str) -> str:
    """Return ``dsn`` as a ``postgresql://`` URL whose connections use ``schema``.

    The schema goes in libpq's ``options`` (``-c search_path=<schema>``); user,
    password, host, port and database are kept, other parameters dropped.
    """
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user", "")), safe="")
    password = parts.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(parts.get("host") or "localhost")
    port = parts.get("port") or 5432
    query = urlencode({"options": f"-c search_path={schema}"}, quote_via=quote)
    return f"postgresql://{auth}{host}:{port}/{quote(str(parts.get('dbname', '')))}?{query}"


@contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """Create a fresh database on the server of ``admin_dsn``; drop it (forcibly) afterwards.

    Args:
        admin_dsn: a DSN whose user may ``CREATE DATABASE``.

    Yields:
        The DSN of the new, empty database.

    Raises:
        psycopg.OperationalError: the server cannot be reached.
    """
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"effectgate_test_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """The DSN of a scratch database for this test session (skipped or failed without a server)."""
    admin = _admin_dsn()
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the test extra installs it
        _unavailable("psycopg is not installed (pip install 'effectgate[postgres]')")
    from effectgate.ledger._postgres import redacted

    try:
        database = scratch_database(admin)
        dsn = database.__enter__()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _unavailable(f"no PostgreSQL at {redacted(admin)} ({first})")
    try:
        yield dsn
    finally:
        database.__exit__(None, None, None)


@pytest.fixture
def postgres_url(postgres_database: str) -> str:
    """A DSN of a fresh, empty schema of the session's scratch database, for one test."""
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return with_search_path(postgres_database, schema)


PG_BIN_DIRS = (
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
)
"""Where Debian's ``initdb`` and ``pg_ctl`` live, tried in order before ``PATH``."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str | None:
    for d in PG_BIN_DIRS:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name)


class PrivateCluster:
    """A PostgreSQL cluster of a test's own (``initdb`` in a temp dir, a free port).

    For tests that stop, restart or break the server: the shared server is
    never touched. Trust authentication, loopback and a socket in ``root``
    only; ``fsync`` stays on (the durability claims are about a real server).

    The cluster lives in a new directory of its own under the system's temp
    directory (``close`` removes it). Run as root (a container), the server
    runs as the ``postgres`` user (``initdb`` refuses root), through ``runuser``.

    Args:
        max_connections: the server's ``max_connections`` (a fault campaign's
            four workers, a reviewer and a stopped worker's pools need more
            than a test's 40).
        hba: ``pg_hba.conf`` lines put before initdb's own (the first line
            that matches a connection decides): e.g. ``host all app
            127.0.0.1/32 scram-sha-256`` for a role that must give a password,
            while ``postgres`` (``admin_dsn``) keeps trust.

    Raises:
        FileNotFoundError: ``initdb`` / ``pg_ctl`` are not installed (see ``available``).
    """

    def __init__(self, *, max_connections: int = 40, hba: Sequence[str] = ()) -> None:
        import tempfile

        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise FileNotFoundError("initdb / pg_ctl not found (install postgresql)")
        self._pg_ctl = pg_ctl
        self.root = root = Path(tempfile.mkdtemp(prefix="effectgate-pg-"))
        self._as: list[str] = []
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.data = root / "data"
        self.port = free_port()
        self.log = root / "server.log"
        options = ["-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"]
        subprocess.run(
            [*self._as, initdb, *options, "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
        settings = (
            f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{root}'\nmax_connections = {max_connections}\n"
            "shared_buffers = 16MB\n"
        )
        subprocess.run(
            [*self._as, "sh", "-c", f"cat >> '{self.data / 'postgresql.conf'}'"],
            input=settings.encode(),
            check=True,
        )
        if hba:
            conf = self.data / "pg_hba.conf"
            old = subprocess.run([*self._as, "cat", str(conf)], check=True, capture_output=True)
            subprocess.run(
                [*self._as, "sh", "-c", f"cat > '{conf}'"],
                input="".join(f"{line}\n" for line in hba).encode() + old.stdout,
                check=True,
            )

    @staticmethod
    def available() -> bool:
        """Whether ``initdb`` and ``pg_ctl`` are installed."""
        return _pg_bin("initdb") is not None and _pg_bin("pg_ctl") is not None

    @property
    def admin_dsn(self) -> str:
        """The DSN of the ``postgres`` database as the superuser ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        """A ``postgresql://`` URL of database ``dbname`` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _ctl(self, *args: str) -> None:
        where = ["-D", str(self.data), "-l", str(self.log)]
        subprocess.run(
            [*self._as, self._pg_ctl, *where, "-w", "-t", "60", *args],
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._ctl("start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``) and wait until it is down."""
        self._ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m mode``: every connection is ended; wait until it is up again."""
        self._ctl("restart", "-m", mode)

    def terminate_backends(self, dbname: str) -> int:
        """``pg_terminate_backend`` every backend connected to ``dbname``; return how many.

        Waits (with a deadline) until none of them is left.
        """
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchall()
            pids = [int(r[0]) for r in rows]
            for pid in pids:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                ((left,),) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                ).fetchall()
                if left == 0:
                    break
                time.sleep(0.02)
        return len(rows)

    def close(self) -> None:
        """Stop the server if it runs (immediate mode) and remove its directory."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _unavailable(reason: str) -> None:
    hint = f"set {ENV_DSN} to a server's DSN; {ENV_REQUIRE}=1 makes this a failure"
    if os.environ.get(ENV_REQUIRE) == "1":
        pytest.fail(f"PostgreSQL tests required but {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason} ({hint})")


def pytest_report_header() -> str:
    """One line at the top of every run: which PostgreSQL the tests use, or why they skip."""
    admin = _admin_dsn()
    try:
        import psycopg

        from effectgate.ledger._postgres import redacted

        where = redacted(admin)
        with psycopg.connect(admin, connect_timeout=2):
            pass
    except ImportError:
        return "postgresql: psycopg not installed; PostgreSQL tests will be skipped"
    except psycopg.Error:
        required = os.environ.get(ENV_REQUIRE) == "1"
        return f"postgresql: no server at {where}; PostgreSQL tests will " + (
            "FAIL (EFFECTGATE_REQUIRE_POSTGRES=1)" if required else f"be skipped (set {ENV_DSN})"
        )
    return f"postgresql: {where} (a scratch database per session)"
