"""A rolling upgrade on PostgreSQL: new workers migrate the ledger under an old build's live call.

The old worker is the real previous release: the source tree of ``OLD_BUILD``
(the last commit whose PostgreSQL ledger is at ``PG_LATEST_VERSION - 1``),
taken from this repository's history with ``git archive`` and run with its
own ``src`` first on ``PYTHONPATH``. The schema it opens was brought to its
version by this build's migrations stopped one short
(``migrate_postgres_ledger``); the old worker's thread writes the real rows
(thread record, lease, operations, approvals, events, checkpoints).

While the old worker is inside its ``create_ticket`` call (the ticket
service is slowed and the worker held with SIGSTOP, so the call outlasts any
start-up), a new worker is killed mid-migration (the ``MID_MIGRATION`` seam),
then three new workers start at once and migrate to the latest version.
The old worker then finishes its thread on the migrated schema. The
assertions read the database's catalogue and rows and the ticket service's
and mail sink's own records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.ledger import EventKind, OpState, PostgresLedger
from effectgate.ledger._postgres import migrate_postgres_ledger
from effectgate.ledger._postgres_migrations import PG_LATEST_VERSION
from effectgate.testing import Failpoint

pytestmark = [pytest.mark.slow, pytest.mark.crash]

OLD_BUILD = "6d31b71^"
"""The last commit whose PostgreSQL ledger is at ``PG_LATEST_VERSION - 1`` (version 3).

Move it forward when a migration is added: the ``old_build`` fixture fails
when the old build's latest version is not one below this build's.
"""
ROOT = Path(__file__).resolve().parents[2]
SLOW_S = 4.5
"""The ticket service's answer delay: below the ticket tool's 5 s read timeout."""
LEASE_TTL_S = 120.0
"""Far above how long the old worker is held: its lease stays live, so nobody takes over."""

_INVALID = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND NOT i.indisvalid"
)


@pytest.fixture(scope="module")
def old_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ``src`` directory of ``OLD_BUILD``, unpacked from this repository's history."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", OLD_BUILD, "src"],
            check=True,
            capture_output=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the old build {OLD_BUILD} is not in this checkout's git history ({exc})")
    where = tmp_path_factory.mktemp("old-build")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    src = where / "src"
    probe = subprocess.run(
        [sys.executable, "-c", _OLD_VERSION],
        env=_old_env(src),
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(probe.stdout) == {
        "file": str(src / "effectgate" / "__init__.py"),
        "version": PG_LATEST_VERSION - 1,
    }, f"move OLD_BUILD to the last commit at ledger version {PG_LATEST_VERSION - 1}"
    yield src


_OLD_MARK = "EFFECTGATE_TEST_OLD_BUILD"
"""Set in an old-build process's environment (it runs outside this checkout)."""

_OLD_VERSION = (
    "import json, effectgate, effectgate.ledger._postgres_migrations as m; "
    "print(json.dumps({'file': effectgate.__file__, 'version': m.PG_LATEST_VERSION}))"
)


def _old_env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env["PYTHONPATH"] = str(src)  # the old build, not this one
    env[_OLD_MARK] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _new_env(failpoint: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env.update({"NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    return env


def _until(what: str, ready: Callable[[], bool], *, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {within_s:g} s: {what}")
        time.sleep(0.05)


def _rows(url: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(query)]


def _ledger_versions(url: str) -> list[object]:
    return [r[0] for r in _rows(url, "SELECT version FROM ledger_schema_version ORDER BY 1")]


def _ticket(url: str) -> tuple[object, ...] | None:
    rows = _rows(url, "SELECT state, attempt FROM ledger_operations WHERE tool = 'create_ticket'")
    return rows[0] if rows else None


TASK = "Check the order service's error rate and handle any incident."

_OLD_SUBMIT = """
import sys
from effectgate import StateDir, open_agent
from effectgate._workers import submit  # this release had it there
sd = StateDir.open(sys.argv[1], store=sys.argv[2])
with open_agent(sd) as agent:
    submit(agent, sys.argv[3], thread_id="S")
"""


def _cli_worker(
    sd: StateDir, *, env: dict[str, str], lease_ttl_s: float, log: Path | None = None
) -> subprocess.Popen[str]:
    """``effectgate worker --until-idle --approve all --json`` of the build ``env`` names."""
    cmd = [sys.executable, "-m", "effectgate.cli", "worker", "--state-dir", str(sd.root)]
    cmd += ["--until-idle", "--approve", "all", "--json", "--lease-ttl", str(lease_ttl_s)]
    return subprocess.Popen(
        cmd,
        env=env,
        # the old build runs away from this checkout (nothing of it on sys.path)
        cwd=sd.root.parent if env.get(_OLD_MARK) else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if log is None else log.open("w"),
        text=True,
    )


@contextmanager
def _old_release(
    tmp_path: Path, url: str, old_build: Path
) -> Iterator[tuple[StateDir, DemoServices]]:
    """The world an old release left: its schema version, its state directory, a thread S submitted.

    The ledger is brought to ``PG_LATEST_VERSION - 1`` by this build's own
    migrations, stopped one short; the old build then binds the state
    directory to the store and submits thread S (its first rows). The demo
    services run with the ticket service slowed.
    """
    assert migrate_postgres_ledger(url, to_version=PG_LATEST_VERSION - 1) == PG_LATEST_VERSION - 1
    assert _ledger_versions(url) == list(range(1, PG_LATEST_VERSION))
    state = tmp_path / "state"
    subprocess.run(
        [sys.executable, "-c", _OLD_SUBMIT, str(state), url, TASK],
        env=_old_env(old_build),
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    sd = StateDir.open(state)
    with DemoServices(sd.services) as services:
        services.set_error_rate("orders", 0.12)
        # the old build reads endpoints.json as it wrote it: without the "owner" field
        endpoints = sd.services / "endpoints.json"
        published = json.loads(endpoints.read_text())
        published.pop("owner", None)
        endpoints.write_text(json.dumps(published))
        services.set_fault("tickets", "slow", delay_s=SLOW_S)
        yield sd, services


def _held_mid_call(old: subprocess.Popen[str], url: str, services: DemoServices) -> None:
    """Wait until the old worker's create_ticket is at the ticket service; SIGSTOP it there."""
    _until(
        "the old worker's create_ticket is at the ticket service",
        lambda: (
            old.poll() is None
            and _ticket(url) == ("IN_FLIGHT", 1)
            and services.stats("tickets")["create_requests"] == 1
        ),
    )
    old.send_signal(signal.SIGSTOP)
    services.set_fault("tickets", "normal")  # "slow" lasts until changed


def _summary(out: str) -> dict[str, object]:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines and "worker" in lines[-1], out[-2000:]
    return lines[-1]


def _waiting_on_locks(url: str) -> int:
    """How many other sessions of this database wait for a lock (a table's or an advisory one)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    ((n,),) = _rows(url, query)
    return int(str(n))


def _checkpoint_versions(url: str) -> list[object]:
    return [r[0] for r in _rows(url, "SELECT v FROM checkpoint_migrations ORDER BY v")]


def _has_column(url: str, table: str, column: str) -> bool:
    query = (
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() "
        f"AND table_name = '{table}' AND column_name = '{column}'"
    )
    return _rows(url, query) == [(1,)]


def test_new_workers_migrate_under_an_old_workers_live_call_and_it_finishes_once(
    tmp_path: Path, postgres_url: str, old_build: Path
) -> None:
    """Kill one new start-up mid-migration, start three at once, let the old call finish.

    The old worker's lease (120 s) stays live while it is held, so no new
    worker takes its thread: the call it has in flight finishes in the old
    process, which then writes the rest of the thread (result, review,
    mail, note) with the old build's statements on the migrated schema.
    """
    url = postgres_url
    with _old_release(tmp_path, url, old_build) as (sd, services):
        old = _cli_worker(sd, env=_old_env(old_build), lease_ttl_s=LEASE_TTL_S)
        new: list[subprocess.Popen[str]] = []
        try:
            _held_mid_call(old, url, services)
            # a new worker killed between the migration's statements and its COMMIT
            killed = _cli_worker(sd, env=_new_env(Failpoint.MID_MIGRATION.value), lease_ttl_s=3)
            _, err = killed.communicate(timeout=120)
            assert killed.returncode == ExitCode.KILLED, err[-2000:]
            # nothing of the new version is left: no version row, no column, no invalid index
            assert _ledger_versions(url) == list(range(1, PG_LATEST_VERSION))
            assert not _has_column(url, "ledger_operations", "recoveries")
            assert _rows(url, _INVALID) == []
            # three new workers at once: the next start-up migrates, once. A reader
            # of ledger_operations holds the migration's ALTER TABLE back until all
            # three are inside their migration (the first at the ALTER, the others
            # at the migration lock), so their start-ups truly overlap.
            logs = [tmp_path / f"new-{n}.err" for n in range(3)]
            with psycopg.connect(url) as blocker:
                blocker.execute("LOCK TABLE ledger_operations IN ACCESS SHARE MODE")
                new = [_cli_worker(sd, env=_new_env(), lease_ttl_s=3, log=log) for log in logs]
                _until(
                    "three start-ups wait inside the migration",
                    lambda: _waiting_on_locks(url) == 3 or any(p.poll() is not None for p in new),
                    within_s=120,
                )
                assert [p.poll() for p in new] == [None, None, None], [
                    log.read_text()[-2000:] for log in logs
                ]
                blocker.rollback()
            _until(
                "every new worker is up (migrated, taking threads), or one ended",
                lambda: (
                    all("worker: ready" in log.read_text() for log in logs)
                    or any(p.poll() is not None for p in new)
                ),
                within_s=180,
            )
            # every one up, waiting on S
            assert [p.poll() for p in new] == [None, None, None], [
                log.read_text()[-2000:] for log in logs
            ]
            assert _ledger_versions(url) == list(range(1, PG_LATEST_VERSION + 1))
            assert _ticket(url) == ("IN_FLIGHT", 1)  # still the old worker's call
        finally:
            old.send_signal(signal.SIGCONT)
        out, err = old.communicate(timeout=180)
        assert old.returncode == 0, err[-2000:]
        assert _summary(out)["runs"] == 1
        finished = [json.loads(line) for line in out.splitlines() if '"thread_id"' in line]
        assert [(r["thread_id"], r["status"]) for r in finished] == [("S", "done")]
        for proc, log in zip(new, logs, strict=True):
            out, _ = proc.communicate(timeout=180)
            assert proc.returncode == 0, log.read_text()[-2000:]
            assert _summary(out)["runs"] == 0  # the thread was the old worker's throughout
        # the external systems' own records: the one call reached them once
        assert services.stats("tickets") == {"create_requests": 1, "tickets": 1}
        assert services.stats("mail") == {"data_commands": 1, "messages": 1}
    # one row per version, every index valid
    assert _ledger_versions(url) == list(range(1, PG_LATEST_VERSION + 1))
    assert _checkpoint_versions(url) == list(range(len(PostgresSaver.MIGRATIONS)))
    assert _rows(url, _INVALID) == []
    # the old build's late writes are valid rows of the new schema: this build reads them all
    with PostgresLedger(url) as ledger:
        ops = ledger.list()
        events = ledger.events()
    assert sorted(op.tool for op in ops) == ["create_ticket", "send_email", "write_file"]
    assert {(op.state, op.attempt, op.recoveries) for op in ops} == {(OpState.SUCCEEDED, 1, 0)}
    assert sorted(e.operation_id for e in events if e.dst is OpState.SUCCEEDED) == sorted(
        op.operation_id for op in ops
    )  # one success each
    assert (sd.workspace / "incidents" / "orders-error-rate.md").is_file()


def test_an_old_workers_late_result_after_a_takeover_on_the_migrated_schema_is_fenced(
    tmp_path: Path, postgres_url: str, old_build: Path
) -> None:
    """The old worker is held past its lease; a new worker migrates, takes over and finishes.

    Continued, the old worker's answer for attempt 1 must be refused by the
    fencing token (its attempt is no longer the row's), kept only as a note.
    """
    url = postgres_url
    with _old_release(tmp_path, url, old_build) as (sd, services):
        old = _cli_worker(sd, env=_old_env(old_build), lease_ttl_s=1.5)
        try:
            _held_mid_call(old, url, services)
            # the service commits the ticket while its caller is stopped
            _until("the ticket exists", lambda: services.stats("tickets")["tickets"] == 1)
            new = [_cli_worker(sd, env=_new_env(), lease_ttl_s=3) for _ in range(2)]
            outs = [proc.communicate(timeout=300) for proc in new]
            assert [proc.returncode for proc in new] == [0, 0], [e[-2000:] for _, e in outs]
            runs = [json.loads(line) for out, _ in outs for line in out.splitlines()]
            assert [r["status"] for r in runs if r.get("thread_id") == "S" and "status" in r] == [
                "done"
            ]
            # taken over: the held attempt 1 was settled by the ticket service's lookup
            assert _ticket(url) == ("SUCCEEDED", 1)
        finally:
            old.send_signal(signal.SIGCONT)
        _, err = old.communicate(timeout=180)
        assert old.returncode == 0, err[-2000:]  # the old worker ends, seeing the thread done
        # the external systems' own records: one create request, one ticket, one mail
        assert services.stats("tickets") == {"create_requests": 1, "tickets": 1}
        assert services.stats("mail") == {"data_commands": 1, "messages": 1}
    assert _ledger_versions(url) == list(range(1, PG_LATEST_VERSION + 1))
    assert _checkpoint_versions(url) == list(range(len(PostgresSaver.MIGRATIONS)))
    assert _rows(url, _INVALID) == []
    with PostgresLedger(url) as ledger:
        ops = {op.tool: op for op in ledger.list()}
        events = ledger.events(operation_id="ticket:orders-error-rate")
    assert sorted(ops) == ["create_ticket", "send_email", "write_file"]
    assert {op.state for op in ops.values()} == {OpState.SUCCEEDED}
    ticket = ops["create_ticket"].receipt
    assert ticket is not None and ticket.source == "reconcile"  # the takeover's, not the old answer
    # the old worker's late answer: refused as the operation's outcome, kept as a note
    fenced = [e.detail for e in events if e.kind is EventKind.NOTE and "fenced_attempt" in e.detail]
    assert [(d["fenced_attempt"], d["late_result"]) for d in fenced] == [(1, "SUCCEEDED")]
    assert len([e for e in events if e.dst is OpState.SUCCEEDED]) == 1
