"""Prune 10,000 finished threads: time, and bytes reclaimed on disk.

One effectgate thread of ``CALLS`` approved calls is run to its end; its
checkpoint rows, pending writes, thread record and ledger operations are then
copied in SQL under ``N`` thread ids (10,000 by default), so the state holds
``N`` finished threads as the agent writes them, without running the agent
``N`` times. ``Agent.prune`` with ``finished_older_than=0`` then deletes them
all (each under its lease, behind a tombstone), compacts their operations
(``operations_after=0``), checkpoints the WAL and VACUUMs. Reported: seconds
in all and per thread, the files' sizes before and after, and one kept
thread (started after the copies) that must still resume.

Usage: ``python benchmarks/bench_prune.py [--threads N] [--calls C]``
(writes results/prune.json).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import _common as c


def _copy_rows(conn: sqlite3.Connection, table: str, renamed: dict[str, str]) -> None:
    """Copy thread ``t``'s rows of ``table`` once per id in ``temp.ids``, renaming columns."""
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    picked = ", ".join(renamed.get(col, col) for col in cols)
    conn.execute(
        f"INSERT INTO {table} ({', '.join(cols)}) SELECT {picked} FROM {table}, ids "
        "WHERE thread_id = 't'"
    )


def _clone(state: Path, n: int) -> None:
    """Copy thread ``t``'s rows under ``c0 .. c{n-1}`` in both files."""
    ids = [(f"c{k}",) for k in range(n)]
    for name, tables in (
        ("checkpoints.sqlite3", {"checkpoints": {}, "writes": {}}),
        (
            "ledger.sqlite3",
            {
                "threads": {},
                "operations": {
                    "operation_id": "ids.id || substr(operation_id, 2)",
                    # a receipt names its operation
                    "receipt_json": "replace(receipt_json, '\"t:call', '\"' || ids.id || ':call')",
                },
            },
        ),
    ):
        conn = sqlite3.connect(state / name)
        try:
            conn.execute("CREATE TEMP TABLE ids (id TEXT)")
            conn.executemany("INSERT INTO ids VALUES (?)", ids)
            for table, renamed in tables.items():
                _copy_rows(conn, table, {"thread_id": "ids.id", **renamed})
            conn.commit()
        finally:
            conn.close()


def run(threads: int, calls: int) -> dict[str, Any]:
    """Build the state, prune it, and check a kept thread; return the figures."""
    from effectgate.graph import RunStatus
    from effectgate.retention import PrunePolicy

    root = c.work_dir("prune")
    script = c.make_script(calls)
    system = c.Effectgate(root, script)
    try:
        system.start("t")
        for _ in range(calls):
            system.step("t")
        assert system.agent.status("t").status.value == "done"
    finally:
        system.close()
    c.log(f"  template thread done; copying it {threads} times")
    _clone(root, threads)
    system = c.Effectgate(root, script)
    try:
        assert isinstance(system, c.Effectgate)
        agent = system.agent
        time.sleep(0.01)
        system.start("kept")  # waits at its first review: must survive
        t0 = time.perf_counter()
        report = agent.prune(
            PrunePolicy(
                finished_older_than=timedelta(0),
                operations_after=timedelta(0),
                tombstones_after=None,
            )
        )
        seconds = time.perf_counter() - t0
        kept_status = agent.status("kept").status
        system.step("kept")
        resumed = agent.status("kept").status
    finally:
        system.close()
    shutil.rmtree(root, ignore_errors=True)
    files = report.files
    return {
        "threads_deleted": len(report.threads_deleted),
        "threads_kept": dict(sorted(report.threads_kept.items())[:5]),
        "seconds": round(seconds, 2),
        "ms_per_thread": round(seconds * 1e3 / max(1, len(report.threads_deleted)), 3),
        "checkpoints_removed": report.checkpoints_removed,
        "writes_removed": report.writes_removed,
        "operations_compacted": report.operations_compacted,
        "payload_mib": round(report.payload_bytes / 2**20, 2),
        "files_mib": {
            name: {k: round(v / 2**20, 2) for k, v in sizes.items()}
            for name, sizes in files.items()
        },
        "reclaimed_mib": round(sum(s["before"] - s["after"] for s in files.values()) / 2**20, 2),
        "kept_thread": {
            "status_after_prune": kept_status.value,
            "after_one_more_approval": resumed.value,
            "ok": kept_status is RunStatus.WAITING_REVIEW,
        },
    }


def main() -> None:
    """Parse the sizes, run, write ``results/prune.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=50 if c.quick() else 10_000)
    parser.add_argument("--calls", type=int, default=3)
    ns = parser.parse_args()
    c.log(f"prune: {ns.threads} finished threads of {ns.calls} calls")
    results = run(ns.threads, ns.calls)
    params = {"threads": ns.threads, "calls_per_thread": ns.calls}
    c.log(f"wrote {c.write_result('prune', params, results)}")


if __name__ == "__main__":
    main()
