"""The physical floor: durable SQLite commits per second on the disk the benchmarks use.

Each repeat writes single-row ``INSERT`` + ``COMMIT`` transactions (400 per
fsync'd mode, 2000 for NORMAL, so a slow disk does not stretch the run) to a
fresh file in the benchmark work directory, in every mode, the modes taking
turns (the order rotates by repeat):

- ``wal_full``: WAL + ``synchronous=FULL``, what ``SqliteSaver`` and the ledger's
  durable commits do: one WAL fsync per commit. This is the floor every other
  figure is divided by.
- ``wal_normal``: WAL + ``synchronous=NORMAL``: no fsync at commit.
- ``fsync_4k``: a bare ``write(4 KiB)`` + ``fsync`` on a plain file.

Usage: ``python benchmarks/bench_floor.py`` (writes results/floor.json).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import _common as c

MODES = ["wal_full", "wal_normal", "fsync_4k"]


def _sqlite_run(path: Path, synchronous: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        payload = os.urandom(200)
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (id, v) VALUES (?, ?)", (i, payload))
            conn.execute("COMMIT")
        return time.perf_counter() - t0
    finally:
        conn.close()


def _fsync_run(path: Path, n: int) -> float:
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, block)
            os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def measure(repeats: int, sizes: dict[str, int]) -> dict[str, Any]:
    """Per mode: commits/s and microseconds per commit, median and min-max over repeats."""
    root = c.work_dir("floor")
    secs: dict[str, list[float]] = {m: [] for m in MODES}
    n_full = sizes["wal_full"]
    try:
        for r in range(repeats):
            for mode in c.rotated(MODES, r):
                n = sizes[mode]
                path = root / f"{mode}-{r}.sqlite3"
                if mode == "fsync_4k":
                    secs[mode].append(_fsync_run(path, n))
                else:
                    secs[mode].append(_sqlite_run(path, mode.split("_")[1].upper(), n))
            rate = n_full / secs["wal_full"][-1]
            c.log(f"  repeat {r + 1}/{repeats}: wal_full {rate:.0f} commits/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per = {m: [s / sizes[m] for s in secs[m]] for m in MODES}  # seconds per commit
    ratio = [f / full for f, full in zip(per["wal_normal"], per["wal_full"], strict=True)]
    return {
        "commits_per_s": {m: c.spread([1 / s for s in per[m]], 0) for m in MODES},
        "us_per_commit": {m: c.spread([s * 1e6 for s in per[m]], 1) for m in MODES},
        "normal_over_full_time": c.spread(ratio),
    }


def main() -> None:
    q = c.quick()
    sizes = (
        {"wal_full": 50, "wal_normal": 200, "fsync_4k": 50}
        if q
        else {"wal_full": 400, "wal_normal": 2000, "fsync_4k": 400}
    )
    params: dict[str, Any] = {"repeats": 2 if q else 5, "commits_per_run": sizes}
    c.log("floor: raw SQLite commits")
    results = measure(params["repeats"], sizes)
    c.log(f"wrote {c.write_result('floor', params, results)}")


if __name__ == "__main__":
    main()
