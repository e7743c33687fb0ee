"""The whole cycle through PgBouncer in transaction mode, in front of the shared test server.

Each transaction may meet another server session there: nothing may rest on
session state (a ``SET``, a session advisory lock, a statement prepared on
the server). Before: ``prepared statement "_pg3_0" already exists`` from the
checkpoint pool, and the ledger's session ``SET``s landed on whichever server
session ran them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate import StateDir, open_agent, submit
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing.postgres import ENV_REQUIRE, free_port, scratch_database
from tests.cli.conftest import cli_env

TASK = "Check the order service's error rate and handle any incident."

pytestmark = pytest.mark.slow


@pytest.fixture
def bouncer_url(postgres_database: str) -> Iterator[str]:
    """A fresh database on the shared server, reached through a PgBouncer of this test's own."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.access(binary, os.X_OK):
        if os.environ.get(ENV_REQUIRE) == "1":
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer)", pytrace=False)
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    info = psycopg.conninfo.conninfo_to_dict(postgres_database)
    root = Path(tempfile.mkdtemp(prefix="effectgate-bouncer-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    (root / "users.txt").write_text('"postgres" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={info.get('host', '127.0.0.1')} port={info.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 200\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    os.chmod(root / "users.txt", 0o644)
    os.chmod(root / "pgbouncer.ini", 0o644)
    proc = subprocess.Popen([*run_as, binary, str(root / "pgbouncer.ini")])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("pgbouncer did not start") from None
                time.sleep(0.05)
        admin = psycopg.conninfo.make_conninfo(postgres_database, dbname="postgres")
        with scratch_database(admin) as dsn:
            name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
            yield f"postgresql://postgres@127.0.0.1:{port}/{name}"
            # let PgBouncer give its server sessions of that database back before the drop
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _approve_all(request: dict[str, Any]) -> dict[str, Any]:
    return {"decisions": [{"type": "approve"} for _ in request["action_requests"]]}


def test_approve_effect_resume_through_pgbouncer_transaction_mode(
    bouncer_url: str, services: DemoServices, state_dir: StateDir
) -> None:
    """start -> review -> approve -> effects -> done, every statement through PgBouncer."""
    with open_agent(state_dir, endpoints=services.endpoints, store=bouncer_url) as agent:
        result = agent.start(TASK, thread_id="t1")
        while result.status == "waiting_review":
            pending = result.interrupts[0]
            result = agent.resume("t1", answers={pending.id: _approve_all(dict(pending.value))})
        assert result.status == "done", result.error
    assert len(services.tickets()) == 1 and len(services.mails()) == 1
    with PostgresLedger(bouncer_url) as ledger:
        assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.SUCCEEDED}


def test_two_workers_claim_through_pgbouncer(
    bouncer_url: str, services: DemoServices, state_dir: StateDir
) -> None:
    """Two worker processes share two threads through PgBouncer: each effect once."""
    with open_agent(state_dir, endpoints=services.endpoints, store=bouncer_url) as agent:
        for t in ("t1", "t2"):
            submit(agent, TASK, thread_id=t)
    cmd = [sys.executable, "-m", "effectgate.cli", "worker", "--state-dir", str(state_dir.root)]
    cmd += ["--store", bouncer_url, "--approve", "all", "--json", "--until-idle"]
    workers = [
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()
        )
        for _ in range(2)
    ]
    outs = [w.communicate(timeout=240) for w in workers]
    for w, (out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, (out[-2000:], err[-2000:])
        assert "Traceback" not in err
    assert len(services.tickets()) == 1  # one business key: one ticket for both threads
    with psycopg.connect(bouncer_url, prepare_threshold=None) as conn:
        rows = conn.execute(
            "SELECT count(DISTINCT thread_id) FROM checkpoints WHERE thread_id IN ('t1', 't2')"
        ).fetchone()
        assert rows == (2,)
        attempts = conn.execute("SELECT max(attempt) FROM ledger_operations").fetchone()
        assert attempts == (1,)
