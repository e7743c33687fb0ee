"""A PostgreSQL store whose role must give a password, from every command.

On a private cluster where role ``app`` logs in over TCP with
``scram-sha-256``, role ``nobody`` is turned away by ``pg_hba.conf``
(``reject``) and role ``busy`` has ``CONNECTION LIMIT 0``; ``postgres`` keeps
trust, for the set-up. A login the server refuses is bad input (exit 2, one
line, at once), never a database to wait for (exit 75); the password given
with ``--store`` (or ``EFFECTGATE_STORE``, ``PGPASSWORD``, ``~/.pgpass``) is
the one every connection of the command uses, and is written nowhere.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from effectgate.errors import ConfigError, DatabaseUnavailableError
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing.postgres import PrivateCluster, with_search_path
from tests._fork import python_m
from tests.cli.conftest import Ran, cli_env
from tests.postgres._private import require_private_cluster

pytestmark = pytest.mark.slow

SECRET = "s3cret-Pw-7f"
WRONG = "Not-Th1s-0ne"
AGENT = "tests.conversations._custom_agent:build"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    """The private server, with the three roles and database ``appdb`` owned by ``app``."""
    require_private_cluster()
    server = PrivateCluster(
        hba=[
            "host all nobody 127.0.0.1/32 reject",
            "host all app 127.0.0.1/32 scram-sha-256",
            "host all busy 127.0.0.1/32 scram-sha-256",
        ]
    )
    server.start()
    try:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"CREATE ROLE app LOGIN PASSWORD '{SECRET}'")
            conn.execute(f"CREATE ROLE nobody LOGIN PASSWORD '{SECRET}'")
            conn.execute(f"CREATE ROLE busy LOGIN CONNECTION LIMIT 0 PASSWORD '{SECRET}'")
            conn.execute("CREATE DATABASE appdb OWNER app")
        yield server
    finally:
        server.close()


@pytest.fixture
def schema(cluster: PrivateCluster) -> str:
    """A fresh schema of ``appdb`` owned by ``app``, for one test."""
    name = f"t_{secrets.token_hex(5)}"
    with psycopg.connect(cluster.url("appdb"), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}" AUTHORIZATION app')
    return name


def _url(cluster: PrivateCluster, schema: str, *, password: str | None = SECRET,
         user: str = "app", dbname: str = "appdb") -> str:  # fmt: skip
    auth = f"{user}:{password}" if password is not None else user
    return with_search_path(f"postgresql://{auth}@127.0.0.1:{cluster.port}/{dbname}", schema)


def eg(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Ran:
    """``effectgate ARGS`` with ``env`` added to the CLI tests' environment (no PG* inherited)."""
    base = {k: v for k, v in cli_env().items() if not k.startswith(("PG", "EFFECTGATE_STORE"))}
    proc = python_m("effectgate.cli", args, env={**base, **(env or {})}, timeout=timeout, cwd=ROOT)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def _refused(ran: Ran) -> None:
    """Exit 2 with one line saying the login was refused: no traceback, no password."""
    assert ran.code == 2, (ran.code, ran.stderr[-2000:])
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, ran.stderr
    assert "refused the login" in lines[0]
    assert "Traceback" not in ran.stderr
    assert SECRET not in ran.stderr + ran.stdout
    assert WRONG not in ran.stderr + ran.stdout  # nor the wrong one tried


def _run_waiting(state: Path, store: str, env: dict[str, str] | None = None) -> Ran:
    return eg("run", "Ring the bell for the release.", "--agent", AGENT, "--thread", "b",
              "--state-dir", str(state), "--store", store, env=env)  # fmt: skip


def test_the_password_given_with_store_is_used_by_every_command(
    tmp_path: Path, cluster: PrivateCluster, schema: str
) -> None:
    """run --store, then threads and pending (EFFECTGATE_STORE), resume --store: all on it.

    Before, ``run`` itself ended with exit 75: its recovery report
    (``cli/_recovery.explained``) reopened the store from effectgate.json,
    without the password; ``threads`` and ``pending`` ignored EFFECTGATE_STORE.
    """
    state = tmp_path / "state"
    url = _url(cluster, schema)
    ran = _run_waiting(state, url)
    assert ran.code == 4, ran.stderr[-2000:]  # waiting for review
    marker = (state / "effectgate.json").read_text()
    assert json.loads(marker)["store"] and SECRET not in marker

    env = {"EFFECTGATE_STORE": url}
    threads = eg("threads", "--state-dir", str(state), "--json", env=env)
    assert threads.code == 0, threads.stderr[-2000:]
    assert [t["thread_id"] for t in threads.json["threads"]] == ["b"]
    pending = eg("pending", "--state-dir", str(state), "--json", env=env)
    assert pending.code == 0, pending.stderr[-2000:]
    assert "ring_bell" in pending.stdout

    done = eg("resume", "--thread", "b", "--approve", "all", "--state-dir", str(state),
              "--store", url)  # fmt: skip
    assert done.code == 0, done.stderr[-2000:]
    assert SECRET not in done.stdout + done.stderr
    with PostgresLedger(url) as ledger:
        assert [(op.tool, op.state) for op in ledger.list(thread_id="b")] == [
            ("ring_bell", OpState.SUCCEEDED)
        ]
    assert SECRET not in (state / "effectgate.json").read_text()


def test_pgpassword_and_pgpass_work_with_a_url_without_password(
    tmp_path: Path, cluster: PrivateCluster, schema: str
) -> None:
    """libpq's own places for a password: PGPASSWORD, and a password file (PGPASSFILE)."""
    state = tmp_path / "state"
    url = _url(cluster, schema, password=None)
    assert _run_waiting(state, url, env={"PGPASSWORD": SECRET}).code == 4
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{cluster.port}:appdb:app:{SECRET}\n")
    passfile.chmod(0o600)
    threads = eg("threads", "--state-dir", str(state), "--json",
                 env={"PGPASSFILE": str(passfile)})  # fmt: skip
    assert threads.code == 0, threads.stderr[-2000:]
    assert [t["thread_id"] for t in threads.json["threads"]] == ["b"]


def test_a_refused_login_is_bad_input_at_once_on_a_bound_store(
    tmp_path: Path, cluster: PrivateCluster, schema: str
) -> None:
    """A wrong or missing password on a directory that records its store: exit 2, one line.

    Before, the login refusal counted as a database down: retried for the
    whole budget (5 s), then exit 75, "try again"; a new directory's said
    libpq's text, not that the login was refused.
    """
    state = tmp_path / "state"
    assert _run_waiting(state, _url(cluster, schema)).code == 4
    wrong = _url(cluster, schema, password=WRONG)
    _refused(eg("resume", "--thread", "b", "--approve", "all", "--state-dir", str(state),
                "--store", wrong))  # fmt: skip
    _refused(eg("threads", "--state-dir", str(state), env={"EFFECTGATE_STORE": wrong}))
    missing = eg("pending", "--state-dir", str(state))  # effectgate.json holds no password
    _refused(missing)
    assert "PGPASSWORD" in missing.stderr
    # a malformed EFFECTGATE_STORE is named as such, not taken for a missing password
    bad = f"postgresql://app:{SECRET}%zz@127.0.0.1:{cluster.port}/appdb"
    malformed = eg("threads", "--state-dir", str(state), env={"EFFECTGATE_STORE": bad})
    assert malformed.code == 2, malformed.stderr
    assert "EFFECTGATE_STORE: not a usable PostgreSQL URL" in malformed.stderr
    assert SECRET not in malformed.stderr + malformed.stdout
    _refused(_run_waiting(tmp_path / "new", wrong))
    # a new directory whose store refused the login holds nothing (no marker,
    # no workspace) a later command would take for a SQLite state directory
    new = tmp_path / "new"
    assert not new.exists() or list(new.iterdir()) == []


def test_the_ledger_and_the_checkpoints_judge_a_connection_failure_alike(
    cluster: PrivateCluster, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused login, pg_hba reject, unknown database: ConfigError at once; a full role: retried.

    ``bound=True`` is a store a state directory recorded, whose first
    connection is retried. Before, all four were retried for the budget and
    ended in DatabaseUnavailableError.
    """
    from effectgate.graph._pg_saver import open_postgres_saver

    monkeypatch.setenv("EFFECTGATE_DB_RETRY_S", "3")
    cases = {
        "wrong password": _url(cluster, schema, password=WRONG),
        "no password": _url(cluster, schema, password=None),
        "pg_hba reject": _url(cluster, schema, user="nobody"),
        "unknown database": _url(cluster, schema, dbname="nosuchdb"),
    }
    for why, url in cases.items():
        with pytest.raises(ConfigError) as refused:
            PostgresLedger(url, bound=True)
        assert ("refused the login" in str(refused.value)) == (why != "unknown database"), why
        assert WRONG not in str(refused.value), why
        # the checkpoint pool's set-up is not retried either: libpq's error, at once
        with pytest.raises(psycopg.OperationalError), open_postgres_saver(url):
            pass
    with pytest.raises(DatabaseUnavailableError):  # too many connections: a retry may cure it
        PostgresLedger(_url(cluster, schema, user="busy"), bound=True, retry_for=0.5)


def test_a_worker_pool_hands_the_password_to_its_workers_off_their_command_line(
    tmp_path: Path, cluster: PrivateCluster, schema: str
) -> None:
    """worker --processes 2 with EFFECTGATE_STORE: each worker reaches the store; no argv has it."""
    import signal
    import subprocess
    import sys

    state = tmp_path / "state"
    url = _url(cluster, schema)
    assert _run_waiting(state, url).code == 4
    env = {k: v for k, v in cli_env().items() if not k.startswith("PG")}
    env["EFFECTGATE_STORE"] = url
    argv = ["worker", "--state-dir", str(state), "--processes", "2", "--approve", "all"]
    argv += ["--agent", AGENT]
    pool = subprocess.Popen(
        [sys.executable, "-m", "effectgate.cli", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        cwd=ROOT,
    )
    try:
        assert pool.stderr is not None and pool.stdout is not None
        ran = pool.stdout.readline()  # one line per run: the thread, taken by a worker
        assert "thread_id=b" in ran, ran
        ready = 0
        while ready < 2:  # each worker says so once it has opened the store
            line = pool.stderr.readline()
            assert line, "the pool ended before its workers were ready"
            ready += "effectgate worker: ready" in line
        children = Path(f"/proc/{pool.pid}/task/{pool.pid}/children").read_text().split()
        argvs = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children]
        assert len(argvs) == 2 and all(b"worker" in argv for argv in argvs)
        assert not any(SECRET.encode() in argv for argv in argvs)
    finally:
        pool.send_signal(signal.SIGTERM)
        out, err = pool.communicate(timeout=120)
    assert pool.returncode == 5, err[-2000:]
    assert SECRET not in out + err
    with PostgresLedger(url) as ledger:
        assert [op.state for op in ledger.list(thread_id="b")] == [OpState.SUCCEEDED]
