"""``prune`` over threads in every state; tombstones; the checkpoint file's size after VACUUM.

Each thread opens one ticket on the demo ticket service (its own alert id),
so "each effect once" is read from the ticket service's own database.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import yaml

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.errors import ConfigError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.retention import PrunePolicy, ThreadDeletedError, tombstone_of
from tests.answers._bind import bound
from tests.cli.conftest import eg
from tests.conftest import run_worker

APPROVE: dict[str, Any] = {"decisions": [{"type": "approve"}], "reviewer": "t"}
NO_LEDGER = {"operations_after": None, "tombstones_after": None}


def _noise(key: str) -> str:
    """2 KiB of text that does not compress (PostgreSQL compresses large values)."""
    return "".join(hashlib.sha256(f"{key}/{i}".encode()).hexdigest() for i in range(32))


def _script(sd: StateDir, name: str, calls: int = 1) -> str:
    turns = [
        {
            "say": f"Opening ticket {name}-{k}.",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {
                        "title": f"{name} {k}",
                        "body": _noise(f"{name}-{k}"),
                        "severity": "low",
                        "alert_id": f"alert-{name}-{k}",
                    },
                }
            ],
        }
        for k in range(calls)
    ]
    path = sd.root / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "turns": turns, "final": f"{name} done."}))
    return f"scripted:{path}"


def _agent(
    sd: StateDir,
    services: DemoServices,
    name: str,
    calls: int = 1,
    store: str | None = None,
    policy: Policy | None = None,
) -> Any:
    return open_agent(
        sd, model=_script(sd, name, calls), endpoints=services.endpoints, store=store, policy=policy
    )


def _finish(agent: Agent, thread_id: str, calls: int) -> None:
    result = agent.start("go", thread_id=thread_id)
    for _ in range(calls):
        assert result.status is RunStatus.WAITING_REVIEW, result.error
        result = agent.resume(thread_id, decisions=bound(agent, thread_id, APPROVE))
    assert result.status is RunStatus.DONE, result.error


def _alerts(sd: StateDir) -> Counter[str]:
    return Counter(str(t.get("alert_id")) for t in read_tickets(sd.services))


def _checkpoint_rows(sd: StateDir, thread_id: str, store: str | None = None) -> int:
    if store is not None:
        import psycopg

        with psycopg.connect(store) as pg:
            row = pg.execute(
                "SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchone()
            assert row is not None
            return int(row[0])
    conn = sqlite3.connect(sd.checkpoints)
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        return int(n)
    finally:
        conn.close()


@pytest.mark.slow
def test_prune_keeps_every_unfinished_thread_whole_and_each_ticket_happens_once(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """Threads waiting at a review, at a verdict, IN_FLIGHT after a kill, forked, finished.

    ``prune`` keeps only the last checkpoint of each (and what it depends
    on), deletes the finished one, refuses to delete the others, and then
    every kept thread is answered or resumed to done with each ticket created
    exactly once.
    """
    sd = state_dir
    # finished, over several calls (so keep_last has history to drop)
    with _agent(sd, services, "done", calls=3, store=store) as agent:
        _finish(agent, "done", 3)
    # forked: finished, then replayed from an earlier checkpoint
    with _agent(sd, services, "fork", calls=2, store=store) as agent:
        _finish(agent, "fork", 2)
        history = list(agent.graph.get_state_history({"configurable": {"thread_id": "fork"}}))
        agent.replay("fork", history[len(history) // 2].config["configurable"]["checkpoint_id"])
    # waiting at a review, after two calls
    with _agent(sd, services, "review", calls=3, store=store) as agent:
        result = agent.start("go", thread_id="review")
        for _ in range(2):
            result = agent.resume("review", decisions=bound(agent, "review", APPROVE))
        assert result.status is RunStatus.WAITING_REVIEW
    # waiting for a verdict: the ticket service commits, then drops the connection
    with _agent(sd, services, "verdict", store=store) as agent:
        agent.start("go", thread_id="verdict")
        services.set_fault("tickets", "ambiguous-unqueryable", delay_s=0.2, times=1)
        result = agent.resume("verdict", decisions=bound(agent, "verdict", APPROVE))
        assert result.status is RunStatus.WAITING_RECONCILIATION, result.error
        services.set_fault("tickets", "normal")
    # IN_FLIGHT: a worker killed right after the ticket service committed
    _script(sd, "killed")
    run = run_worker(
        sd,
        "killed",
        failpoint="AFTER_EXTERNAL_COMMIT",
        model=f"scripted:{sd.root / 'killed.yaml'}",
        store=store,
    )
    assert run.returncode == 137, run.stderr
    before = {
        t: _checkpoint_rows(sd, t, store) for t in ("done", "fork", "review", "verdict", "killed")
    }
    with _agent(sd, services, "review", calls=3, store=store) as agent:
        assert [op.state for op in agent.ledger.list(thread_id="killed")] == [OpState.IN_FLIGHT]
        dry = agent.prune(
            PrunePolicy(
                keep_last=1, delete_threads=["done", "review", "verdict", "killed"], **NO_LEDGER
            ),
            dry_run=True,
        )
        assert dry.threads_deleted == ["done"]
        assert _checkpoint_rows(sd, "done", store) == before["done"]  # a dry run touches nothing
        report = agent.prune(
            PrunePolicy(
                keep_last=1, delete_threads=["done", "review", "verdict", "killed"], **NO_LEDGER
            )
        )
        assert report.threads_deleted == ["done"]
        assert set(report.threads_kept) == {"review", "verdict", "killed"}
        assert report.checkpoints_removed == dry.checkpoints_removed > 0
        assert report.payload_bytes == dry.payload_bytes > 0
        files = report.files["checkpoints"]
        # PostgreSQL's VACUUM may keep rows an open transaction elsewhere can
        # see; the size bound is test_file_after_prune_and_vacuum_...'s
        assert files["after"] < files["before"] if store is None else files["after"] > 0
        assert _checkpoint_rows(sd, "done", store) == 0
        for t in ("fork", "review", "verdict", "killed"):
            # fewer only past a snapshot: before it, every checkpoint is an ancestor the
            # latest one replays
            assert 0 < _checkpoint_rows(sd, t, store) <= before[t]
        # the kept threads still say where they stand
        assert agent.status("review").status is RunStatus.WAITING_REVIEW
        assert agent.status("verdict").status is RunStatus.WAITING_RECONCILIATION
        with pytest.raises(ThreadDeletedError, match="deleted on request"):
            agent.resume("done")
        tomb = tombstone_of(agent.ledger, "done")
        assert tomb is not None and tomb.deleted_by == "effectgate prune"
        # the review asks for the third call, not the first again
        (action,) = agent.status("review").interrupts[0].value["action_requests"]
        assert action["args"]["alert_id"] == "alert-review-2"
        assert (
            agent.resume("review", decisions=bound(agent, "review", APPROVE)).status
            is RunStatus.DONE
        )
    with _agent(sd, services, "verdict", store=store) as agent:
        (item,) = agent.status("verdict").interrupts
        op_id = item.value["operation_id"]
        (ticket,) = [t for t in read_tickets(sd.services) if t["alert_id"] == "alert-verdict-0"]
        done = agent.resume(
            "verdict",
            verdicts={op_id: {"verdict": "succeeded", "reference": str(ticket["ticket_id"])}},
        )
        assert done.status is RunStatus.DONE, done.error
    with _agent(sd, services, "killed", store=store) as agent:
        assert agent.resume("killed").status is RunStatus.DONE
    with _agent(sd, services, "fork", calls=2, store=store) as agent:
        result = agent.resume("fork")
        while result.status is RunStatus.WAITING_REVIEW:
            result = agent.resume("fork", decisions=bound(agent, "fork", APPROVE))
        assert result.status is RunStatus.DONE, result.error
    alerts = _alerts(sd)
    expected = {
        *(f"alert-done-{k}" for k in range(3)),
        *(f"alert-fork-{k}" for k in range(2)),
        *(f"alert-review-{k}" for k in range(3)),
        "alert-verdict-0",
        "alert-killed-0",
    }
    assert set(alerts) == expected
    assert all(n == 1 for n in alerts.values()), alerts


def test_a_late_write_after_delete_does_not_bring_the_thread_back(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """A second agent (a parked worker) that puts a checkpoint after the delete is refused."""
    sd = state_dir
    with (
        _agent(sd, services, "late", calls=2, store=store) as parked,
        _agent(sd, services, "late", calls=2, store=store) as pruner,
    ):
        _finish(parked, "late", 2)
        saver = parked.graph.checkpointer
        assert saver is not None
        stale = saver.get_tuple({"configurable": {"thread_id": "late"}})
        assert stale is not None
        report = pruner.prune(PrunePolicy(delete_threads=["late"], reason="gdpr", **NO_LEDGER))
        assert report.threads_deleted == ["late"]
        # the parked worker wakes up and writes what it had
        refused = (sqlite3.IntegrityError, psycopg.Error)
        with pytest.raises(refused, match="deleted"):
            saver.put(stale.config, stale.checkpoint, stale.metadata, {})
        with pytest.raises(refused, match="deleted"):
            saver.put_writes(stale.config, [("messages", [])], "task-1")
        assert _checkpoint_rows(sd, "late", store) == 0
        assert pruner.status("late").status is RunStatus.NOT_STARTED
        with pytest.raises(ThreadDeletedError, match="gdpr"):
            pruner.resume("late")
        with pytest.raises(ThreadDeletedError):
            parked.start("go", thread_id="late")
    assert _alerts(sd) == Counter({"alert-late-0": 1, "alert-late-1": 1})


def test_file_after_prune_and_vacuum_is_the_kept_threads_plus_a_constant(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """Deleting 4 of 5 threads leaves a checkpoint file the size of the one kept, plus a constant.

    The constant is the fixed cost of the empty tables and their indexes: a
    page each in SQLite (64 KiB allowed); on PostgreSQL a few pages per table
    (two indexes of two pages, a heap page, a TOAST table and its index;
    measured 190 KiB for the four tables after VACUUM FULL; 256 KiB allowed).
    """
    sd = state_dir
    names = ["keep", "a", "b", "c", "d"]
    for name in names:
        with _agent(sd, services, name, calls=2, store=store) as agent:
            _finish(agent, name, 2)
    bound = (64 if store is None else 256) * 1024
    with _agent(sd, services, "keep", calls=2, store=store) as agent:
        report = agent.prune(PrunePolicy(delete_threads=names[1:], **NO_LEDGER))
        assert sorted(report.threads_deleted) == sorted(names[1:])
        before = report.files["checkpoints"]["before"]
        kept = _stored_bytes(sd, store)
        # PostgreSQL's VACUUM keeps the rows a transaction still open on the
        # server may see (on a shared test server: another session's): the
        # space comes back with a later VACUUM, here a prune with nothing to remove.
        for _ in range(20 if store is not None else 0):
            if report.files["checkpoints"]["after"] <= kept + bound:
                break
            time.sleep(0.5)
            report = agent.prune(PrunePolicy(**NO_LEDGER))
        assert agent.status("keep").status is RunStatus.DONE
        assert len(agent.messages("keep")) == 6
    after = report.files["checkpoints"]["after"]
    assert after <= kept + bound
    assert after < before


def _stored_bytes(sd: StateDir, store: str | None) -> int:
    """The bytes of every checkpoint, write and blob row left."""
    if store is not None:
        total = 0
        with psycopg.connect(store) as pg:
            for sql in (
                "SELECT SUM(pg_column_size(checkpoint) + pg_column_size(metadata)) "
                "FROM checkpoints",
                "SELECT SUM(octet_length(blob)) FROM checkpoint_writes",
                "SELECT SUM(octet_length(blob)) FROM checkpoint_blobs",
            ):
                row = pg.execute(sql).fetchone()
                total += int(row[0] or 0) if row is not None else 0
        return total
    conn = sqlite3.connect(sd.checkpoints)
    try:
        (kept,) = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
        ).fetchone()
        (writes,) = conn.execute("SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes").fetchone()
    finally:
        conn.close()
    return int(kept) + int(writes)


def test_finished_older_than_deletes_only_finished_threads_past_the_age(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """A duration policy: the finished thread goes, the waiting one stays (with why)."""
    sd = state_dir
    with _agent(sd, services, "old", store=store) as agent:
        _finish(agent, "old", 1)
    with _agent(sd, services, "waiting", calls=2, store=store) as agent:
        agent.start("go", thread_id="waiting")
        young = agent.prune(
            PrunePolicy(finished_older_than=timedelta(hours=1), **NO_LEDGER), dry_run=True
        )
        assert young.threads_deleted == []
        report = agent.prune(PrunePolicy(finished_older_than=timedelta(0), **NO_LEDGER))
        assert report.threads_deleted == ["old"]
        assert "waiting" in report.threads_kept
        assert (
            agent.resume("waiting", decisions=bound(agent, "waiting", APPROVE)).status
            is RunStatus.WAITING_REVIEW
        )


def test_keep_last_on_a_long_thread_keeps_its_history(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """keep_last=1 on a thread past several snapshots: the history reads back whole.

    The LangGraph recipe (keep only the latest checkpoint) would leave the
    latest checkpoint without the deltas it replays: the history would read
    back short.
    """
    sd = state_dir
    with _agent(sd, services, "long", calls=12, store=store) as agent:
        result = agent.start("go", thread_id="long")
        for _ in range(11):
            result = agent.resume("long", decisions=bound(agent, "long", APPROVE))
        assert result.status is RunStatus.WAITING_REVIEW
        history = [m.id for m in agent.messages("long")]
        rows = _checkpoint_rows(sd, "long", store)
        report = agent.prune(PrunePolicy(keep_last=1, **NO_LEDGER))
        assert report.checkpoints_removed > 0
        assert _checkpoint_rows(sd, "long", store) < rows
    with _agent(sd, services, "long", calls=12, store=store) as agent:
        assert [m.id for m in agent.messages("long")] == history
        assert (
            agent.resume("long", decisions=bound(agent, "long", APPROVE)).status is RunStatus.DONE
        )
    assert len(_alerts(sd)) == 12


def test_replay_onto_a_pruned_or_unknown_checkpoint_is_refused_naming_it(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A checkpoint id that is not (or no longer) the thread's: ConfigError, nothing runs."""
    sd = state_dir
    with _agent(sd, services, "rp", calls=12) as agent:
        _finish(agent, "rp", 12)  # long enough that keep_last=1 removes checkpoints
        cfg: Any = {"configurable": {"thread_id": "rp"}}
        oldest = list(agent.graph.get_state_history(cfg))[-1]
        old_id = oldest.config["configurable"]["checkpoint_id"]
        assert agent.prune(PrunePolicy(keep_last=1, **NO_LEDGER)).checkpoints_removed > 0
        head = agent.graph.get_state(cfg).config["configurable"]["checkpoint_id"]
        for bad in (old_id, "no-such-checkpoint", "1ef00000-0000-6000-8000-000000000000"):
            with pytest.raises(ConfigError) as refused:
                agent.replay("rp", bad)
            assert f"has no checkpoint {bad!r}" in str(refused.value)
            assert "pruned" in str(refused.value)
        assert agent.graph.get_state(cfg).config["configurable"]["checkpoint_id"] == head
    assert len(_alerts(sd)) == 12


def test_postgres_vacuum_full_behind_an_open_transaction_is_skipped_not_waited_for(
    services: DemoServices, state_dir: StateDir, postgres_url: str
) -> None:
    """VACUUM FULL needs an exclusive lock: behind an open reader it gives up after the wait.

    The rows are removed and reported; the report says the VACUUM was
    skipped. Without the bound the prune would wait as long as the reader.
    """
    sd = state_dir
    with _agent(sd, services, "pv", calls=12, store=postgres_url) as agent:
        _finish(agent, "pv", 12)  # long enough that keep_last=1 removes checkpoints
        reports: list[Any] = []
        with psycopg.connect(postgres_url) as holder:
            holder.execute(
                "SELECT count(*) FROM checkpoints"
            ).fetchone()  # a transaction stays open
            policy = PrunePolicy(keep_last=1, vacuum_wait=timedelta(seconds=1), **NO_LEDGER)
            runner = threading.Thread(target=lambda: reports.append(agent.prune(policy)))
            started = time.monotonic()
            runner.start()
            runner.join(timeout=20)
            waited = time.monotonic() - started
            finished = not runner.is_alive()
            holder.rollback()
        runner.join()
        assert finished, "prune waited behind the open transaction"
        (report,) = reports
        assert report.vacuum_skipped is not None
        assert report.vacuum_skipped.startswith("vacuum skipped: table busy")
        assert report.vacuum_skipped.endswith("run again") and "\n" not in report.vacuum_skipped
        assert report.checkpoints_removed > 0
        assert waited < 15
        again = agent.prune(PrunePolicy(keep_last=1, **NO_LEDGER))
        assert again.checkpoints_removed == 0 and again.vacuum_skipped is None


def test_a_lock_held_at_vacuum_exits_75_with_the_report_and_one_line(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``effectgate prune`` meeting another process's lock at VACUUM: exit 75, report, rows gone.

    The prune only reads the ledger here (no ledger windows), so a write
    lock held on the ledger file meets only the closing VACUUM of that file.
    """
    sd = state_dir
    with _agent(sd, services, "lk", calls=12) as agent:
        _finish(agent, "lk", 12)
    holder = sqlite3.connect(sd.ledger, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        ran = eg(
            "prune", "--state-dir", str(sd.root), "--keep-last", "1", "--operations-after",
            "none", "--tombstones-after", "none", "--vacuum-wait", "1s",
        )  # fmt: skip
    finally:
        holder.close()
    assert ran.code == 75, (ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vacuum skipped: table busy"), ran.stderr
    assert lines[0].endswith("run again")
    found = re.search(r"checkpoints\W+(\d+)", ran.stdout)
    assert found is not None, ran.stdout
    assert int(found.group(1)) > 0  # the report of what was removed is printed
    again = eg("prune", "--state-dir", str(sd.root), "--keep-last", "1", "--json")
    assert again.code == 0, again.stderr
    assert again.json["checkpoints_removed"] == 0 and again.json["vacuum_skipped"] is None
