"""Connection faults on a private PostgreSQL: terminated backends, restarts, a stopped server.

Each test breaks a server of its own (``PrivateCluster``: ``initdb`` in a temp
directory, a free port), never the shared one, and asserts on what the
external systems hold (ledger rows, the ticket service's tickets), not on logs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate import StateDir, open_agent, submit
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing.oracle import world
from effectgate.testing.postgres import PrivateCluster, scratch_database
from effectgate.testing.tcp_proxy import DroppingProxy
from tests.cli.conftest import CLI, cli_env, eg
from tests.postgres._private import require_private_cluster

TASK = "Check the order service's error rate and handle any incident."

pytestmark = pytest.mark.crash


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    """One private server per module; each test gets its own database on it."""
    require_private_cluster()
    server = PrivateCluster()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def url(cluster: PrivateCluster) -> Iterator[str]:
    """A fresh database on the private server, dropped after the test."""
    with scratch_database(cluster.admin_dsn) as dsn:
        yield cluster.url(_dbname(dsn))


def _dbname(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def _approve_all(request: dict[str, Any]) -> dict[str, Any]:
    return {"decisions": [{"type": "approve"} for _ in request["action_requests"]]}


def test_terminated_backends_between_calls_are_retried_on_fresh_connections(
    cluster: PrivateCluster, url: str, services: DemoServices, state_dir: StateDir
) -> None:
    """pg_terminate_backend of every backend before each step: each next call succeeds.

    Before: the first call after the terminations failed as a ConfigError
    ("cannot use ledger database: server closed the connection unexpectedly"),
    the next with psycopg's AdminShutdown from the checkpoint pool.
    """
    db = _dbname(url)
    with open_agent(state_dir, endpoints=services.endpoints, store=url) as agent:
        result = agent.start(TASK, thread_id="t1")
        while result.status == "waiting_review":
            assert cluster.terminate_backends(db) >= 1
            pending = result.interrupts[0]
            result = agent.resume("t1", answers={pending.id: _approve_all(dict(pending.value))})
        assert result.status == "done", result.error
        cluster.terminate_backends(db)
        assert agent.status("t1").status == "done"
    assert world(state_dir).tickets == 1
    assert len(services.tickets()) == 1
    with PostgresLedger(url) as ledger:
        ops = ledger.list(thread_id="t1")
        assert sorted(op.tool for op in ops) == ["create_ticket", "send_email", "write_file"]
        assert {op.state for op in ops} == {OpState.SUCCEEDED}
        assert {op.attempt for op in ops} == {1}


def test_a_ledger_call_after_terminated_backends_commits_once(
    cluster: PrivateCluster, url: str
) -> None:
    """A thread record and a lease taken right after every backend was ended: one row each."""
    db = _dbname(url)
    with PostgresLedger(url, pool_size=2) as ledger:
        ledger.record_thread("t1", {"task": "x"}, {})
        cluster.terminate_backends(db)
        lease = ledger.acquire_lease("t1", "w1", 30)
        cluster.terminate_backends(db)
        ledger.renew_lease(lease, 30)
        cluster.terminate_backends(db)
        assert [t.thread_id for t in ledger.list_threads()] == ["t1"]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM ledger_threads").fetchone() == (1,)
        assert conn.execute("SELECT owner FROM ledger_thread_leases").fetchall() == [("w1",)]


def _state_of(url: str, tool: str) -> str | None:
    """The ledger row's state of the one operation of ``tool``, read straight from the table."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT state FROM ledger_operations WHERE tool = %s", (tool,)
            ).fetchone()
    except psycopg.OperationalError:
        return None
    return None if row is None else str(row[0])


def _wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_server_stopped_mid_command_ends_it_with_exit_75_in_one_line(
    cluster: PrivateCluster, url: str, services: DemoServices, state_dir: StateDir
) -> None:
    """The server stops while ``resume`` waits for the ticket service: exit 75, one line.

    Then, with the server back, ``resume`` finishes the thread with one ticket:
    the attempt whose result could not be recorded is settled by lookup, not repeated.
    Before: the command ended with a traceback or a ConfigError (exit 2).
    """
    sd = ["--state-dir", str(state_dir.root)]
    started = eg("demo", *sd, "--store", url, "--thread", "t1", "--json", timeout=120)
    assert started.code == 4, started.stderr[-2000:]
    services.set_fault("tickets", "slow", delay_s=6)
    env = {**cli_env(), "EFFECTGATE_DB_RETRY_S": "1"}
    proc = subprocess.Popen(
        [*CLI, "resume", *sd, "--thread", "t1", "--approve", "all"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stopped = False
    seen: list[tuple[float, str | None]] = []

    def claimed() -> bool:
        state = _state_of(url, "create_ticket")
        if not seen or seen[-1][1] != state:
            seen.append((round(time.monotonic() - began, 2), state))
        return state == "IN_FLIGHT" or proc.poll() is not None

    began = time.monotonic()
    try:
        _wait_for(claimed, "the ticket claim")
        assert proc.poll() is None, (seen, proc.communicate())
        cluster.stop("fast")
        stopped = True
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if stopped:
            cluster.start()
    # stderr: the progress lines (the thread, the ticket call), then the error in one line
    lines = [
        line for line in stderr.splitlines() if line.strip() and not line.startswith("thread ")
    ]
    assert proc.returncode == 75, stderr[-3000:]
    assert lines, stderr[-3000:]
    assert all(line.startswith("create_ticket: ") for line in lines[:-1]), lines
    assert lines[-1].startswith("error (busy, exit 75): DatabaseUnavailableError"), lines
    assert "Traceback" not in stderr
    services.set_fault("tickets", "normal")
    again = eg("resume", *sd, "--thread", "t1", "--approve", "all", "--json", timeout=120)
    assert again.code == 0, again.stderr[-2000:]
    assert len(services.tickets()) == 1
    with PostgresLedger(url) as ledger:
        assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.SUCCEEDED}


WORKER_FLAGS = ("--approve", "all", "--json", "--lease-ttl", "3")


def test_an_idle_worker_rides_over_a_server_restart(
    cluster: PrivateCluster, url: str, services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """``pg_ctl restart -m fast`` while a worker idles: it keeps running and takes a new thread.

    A regression guard: against the code before this change it passed too
    (the idle worker's first statement after the restart did not meet the
    dead connection here); the terminations of test (a) are what failed then.
    """
    with open_agent(state_dir, endpoints=services.endpoints, store=url) as agent:
        submit(agent, TASK, thread_id="t1")
    log = (tmp_path / "worker.out").open("w")
    worker = subprocess.Popen(
        [*CLI, "worker", "--state-dir", str(state_dir.root), "--store", url, *WORKER_FLAGS],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**cli_env(), "EFFECTGATE_DB_RETRY_S": "1"},
    )
    try:
        try:
            _wait_for(lambda: _states(url, "t1") == {"SUCCEEDED"}, "the first thread", 60)
        except AssertionError:
            raise AssertionError((tmp_path / "worker.out").read_text()[-3000:]) from None
        cluster.restart("fast")
        with open_agent(state_dir, endpoints=services.endpoints, store=url) as agent:
            submit(agent, TASK, thread_id="t2")
        # t2's calls share t1's operations (business keys): its own rows are its checkpoints
        _wait_for(lambda: _checkpoints(url, "t2") > 0 or worker.poll() is not None, "t2", 120)
        assert worker.poll() is None, (tmp_path / "worker.out").read_text()[-3000:]
        # no thread was taken for one this worker cannot run because of a database error
        assert '"skipped"' not in (tmp_path / "worker.out").read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()
    assert len(services.tickets()) == 1  # t2's ticket is t1's operation (same business key)


def test_a_worker_started_while_the_server_restarts_waits_for_it(
    cluster: PrivateCluster, url: str, services: DemoServices, state_dir: StateDir, tmp_path: Path
) -> None:
    """A worker whose state directory's store is down as it starts retries, then runs.

    The store was reached before (the state directory records it), so a
    refused first connection is the server restarting, not a mistyped URL:
    it is retried for the budget (``EFFECTGATE_DB_RETRY_S``) like any later
    one. Found by the fault campaign (``effectgate-pg-faults``): before, a
    worker started during a restart exited 2 with ``ConfigError: cannot use
    ledger database ...: the database system is starting up`` (and a pool's
    replacement worker, not replaced after an exit of its own, was gone).
    """
    proxy = DroppingProxy(("127.0.0.1", cluster.port))
    proxied = url.replace(f":{cluster.port}/", f":{proxy.port}/")
    try:
        bound = StateDir.open(state_dir.root, store=proxied)  # recorded in effectgate.json
        with open_agent(bound, endpoints=services.endpoints) as agent:
            submit(agent, TASK, thread_id="t1")
        cluster.stop("fast")
        before = proxy.accepted
        log = (tmp_path / "worker.out").open("w")
        worker = subprocess.Popen(
            [*CLI, "worker", "--state-dir", str(state_dir.root), "--until-idle", *WORKER_FLAGS],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**cli_env(), "EFFECTGATE_DB_RETRY_S": "120"},
        )
        try:
            # the worker has tried the stopped server once (or ended already)
            _wait_for(lambda: proxy.accepted > before or worker.poll() is not None, "a try", 60)
            cluster.start()
            worker.wait(timeout=180)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            log.close()
    finally:
        proxy.close()
    out = (tmp_path / "worker.out").read_text()
    assert worker.returncode == 0, out[-3000:]
    assert len(services.tickets()) == 1 and len(services.mails()) == 1
    assert _states(url, "t1") == {"SUCCEEDED"}


def _checkpoints(url: str, thread_id: str) -> int:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchone()
    except psycopg.Error:
        return 0
    return 0 if row is None else int(row[0])


def _states(url: str, thread_id: str) -> set[str]:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT state FROM ledger_operations WHERE thread_id = %s", (thread_id,)
            ).fetchall()
    except psycopg.Error:
        return set()
    return {str(r[0]) for r in rows}


def test_connections_cut_mid_run_repeat_no_effect(
    cluster: PrivateCluster, url: str, services: DemoServices, state_dir: StateDir
) -> None:
    """A proxy cuts every connection over and over while a thread runs: no effect twice.

    The run finishes (resumed again if a cut left it incomplete), every
    operation succeeded at attempt 1, one ticket and one mail exist.
    """
    proxy = DroppingProxy(("127.0.0.1", cluster.port))
    proxied = url.replace(f":{cluster.port}/", f":{proxy.port}/")
    stop = threading.Event()

    def cut() -> None:
        while not stop.wait(1.5):
            proxy.drop_all()

    cutter = threading.Thread(target=cut, daemon=True)
    try:
        with open_agent(state_dir, endpoints=services.endpoints, store=proxied) as agent:
            cutter.start()
            result = agent.start(TASK, thread_id="t1")
            for _ in range(20):
                if result.status == "done":
                    break
                answers = {
                    p.id: _approve_all(dict(p.value))
                    for p in result.interrupts
                    if isinstance(p.value, dict) and p.value.get("type") == "review"
                }
                result = agent.resume("t1", answers=answers or None)
            stop.set()
            cutter.join()
            assert result.status == "done", result.error
    finally:
        stop.set()
        proxy.close()
    assert proxy.dropped > 0
    assert len(services.tickets()) == 1 and len(services.mails()) == 1
    with PostgresLedger(url) as ledger:
        ops = ledger.list(thread_id="t1")
        assert {op.state for op in ops} == {OpState.SUCCEEDED}
        assert {op.attempt for op in ops} == {1}


def test_a_commit_whose_answer_is_lost_is_looked_up_not_repeated(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT runs, then its connection dies before the answer is read: one row, no error.

    The session looks the transaction id up (``pg_xact_status``: committed) instead
    of replaying the block; a replay would find its own row and refuse
    (LedgerBusyError), a blind repeat would write twice. Before: ConfigError.
    """
    from effectgate.ledger._postgres import _Session

    real = _Session._send
    lost: list[bool] = []

    def send(self: Any, conn: Any, steps: Any, *, commit: bool, pipeline: bool) -> Any:
        results = real(self, conn, steps, commit=commit, pipeline=pipeline)
        if commit and not lost:
            lost.append(True)
            conn.close()  # the answer is "lost" with its connection
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return results

    with PostgresLedger(postgres_url) as ledger:
        ledger.record_thread("t0", {"task": "x"}, {})
        monkeypatch.setattr(_Session, "_send", send)
        ledger.record_thread("t1", {"task": "y"}, {})
        monkeypatch.undo()
        assert lost == [True]
        assert len(ledger.thread_events("t1")) == len(ledger.thread_events("t0"))
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM ledger_threads WHERE thread_id = 't1'"
        ).fetchone() == (1,)


_PIPELINE_LOST = """
import sys, time
import psycopg
from effectgate.ledger import PostgresLedger  # noqa: F401  (the store quiets psycopg)

url = sys.argv[1]
conn = psycopg.connect(url, autocommit=True)
with psycopg.connect(url, autocommit=True) as killer:
    try:
        with conn.pipeline():
            killer.execute("select pg_terminate_backend(%s)", (conn.info.backend_pid,))
            time.sleep(0.3)
            conn.execute("select 1")
    except psycopg.OperationalError:
        print("lost")
"""


def test_psycopg_warning_on_a_lost_pipeline_stays_off_stderr(url: str) -> None:
    """A pipeline whose backend is terminated: psycopg's own warning never reaches stderr.

    psycopg logs "error ignored terminating <psycopg.Pipeline [BAD]>: the
    connection is lost" when it closes such a pipeline; with no logging
    configured Python's last-resort handler printed it, a second line beside
    the command's one-line exit-75 error (CI failed on it in
    test_a_server_stopped_mid_command_ends_it_with_exit_75_in_one_line).
    """
    proc = subprocess.run(
        [sys.executable, "-c", _PIPELINE_LOST, url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "lost"
    assert proc.stderr == ""
