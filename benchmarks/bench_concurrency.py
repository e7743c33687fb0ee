"""1, 2 and 4 worker processes on distinct threads sharing one state directory.

Each worker process opens the system on the shared directory (effectgate: one
``checkpoints.sqlite3`` and one ``ledger.sqlite3``; baseline: one
``checkpoints.sqlite3``), reports ready, and waits for a common start signal.
Then it runs its own thread: start plus ``M`` approved side effects. Every
connection is probed (see ``_common``), so each time a writer acquires the
SQLite write lock is recorded: the ledger's ``BEGIN IMMEDIATE`` and the
saver's first write statement of a transaction (which takes the lock and
includes any busy-wait on another process's lock).

Reported per system and worker count: side effects per second over the whole
group (from the start signal to the last worker's end) and the p50/p99/max of
the lock waits, pooled over workers, per file. Systems take turns per worker
count; two repeats.

Usage: ``python benchmarks/bench_concurrency.py`` (writes results/concurrency.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c

SYSTEMS = ["baseline", "effectgate"]


def child_worker(system: str, root: Path, thread: str, calls: int, sync_dir: Path) -> None:
    """Run one worker: open, say ready, wait for go, run ``calls`` effects, report."""
    with c.probed_sqlite():
        sys_ = c.SYSTEMS[system](root, c.make_script(calls + 2))
        (sync_dir / f"ready-{thread}").touch()
        go = sync_dir / "go"
        while not go.exists():
            time.sleep(0.001)
        for p in sys_.probes:
            p.lock_waits_ms.clear()
        t0 = time.monotonic()
        sys_.start(thread)
        for _ in range(calls):
            sys_.step(thread)
        t1 = time.monotonic()
        waits = {p.label.split(".")[0]: p.lock_waits_ms for p in sys_.probes}
        sys_.close()
    report = {"t0": t0, "t1": t1, "effects": len(sys_.sink), "waits": waits}
    (sync_dir / f"report-{thread}.json").write_text(json.dumps(report))


def _prepare(system: str, root: Path) -> None:
    # Create the files and schemas once, so the workers measure steady state.
    sys_ = c.SYSTEMS[system](root, c.make_script(2))
    try:
        sys_.start("init")
    finally:
        sys_.close()


def _group(system: str, workers: int, calls: int) -> dict[str, Any]:
    base = c.work_dir("concurrency")
    root, sync_dir = base / "state", base / "sync"
    sync_dir.mkdir()
    _prepare(system, root)
    cmd = [sys.executable, __file__, "--worker", system, str(root)]
    procs = [
        subprocess.Popen([*cmd, f"w{i}", str(calls), str(sync_dir)], stderr=subprocess.PIPE)
        for i in range(workers)
    ]
    while len(list(sync_dir.glob("ready-*"))) < workers:
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"a {system} worker died before starting")
        time.sleep(0.01)
    go_at = time.monotonic()
    (sync_dir / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{system} worker exited {p.returncode}: {err.decode()[-2000:]}")
    reports = [json.loads(f.read_text()) for f in sync_dir.glob("report-*.json")]
    shutil.rmtree(base, ignore_errors=True)
    effects = sum(r["effects"] for r in reports)
    span = max(r["t1"] for r in reports) - go_at
    waits: dict[str, list[float]] = {}
    for r in reports:
        for label, values in r["waits"].items():
            waits.setdefault(label, []).extend(values)
    return {"effects": effects, "seconds": span, "waits": waits}


def _wait_stats(values: list[float]) -> dict[str, Any]:
    def r3(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "p50_ms": r3(c.percentile(values, 0.5)),
        "p99_ms": r3(c.percentile(values, 0.99)),
        "max_ms": r3(max(values) if values else None),
        "n": len(values),
    }


def run(worker_counts: list[int], calls: int, repeats: int) -> dict[str, Any]:
    """Every (system, worker count), interleaved; pooled lock waits, effects per second."""
    rates: dict[tuple[str, int], list[float]] = {}
    waits: dict[tuple[str, int], dict[str, list[float]]] = {}
    for r in range(repeats):
        for n in worker_counts:
            for s in c.rotated(SYSTEMS, r + n):
                g = _group(s, n, calls)
                rates.setdefault((s, n), []).append(g["effects"] / g["seconds"])
                pooled = waits.setdefault((s, n), {})
                for label, values in g["waits"].items():
                    pooled.setdefault(label, []).extend(values)
            c.log(f"  repeat {r + 1}/{repeats}, {n} worker(s): " + ", ".join(
                f"{s} {rates[s, n][-1]:.1f}/s" for s in SYSTEMS))  # fmt: skip
    out: dict[str, Any] = {}
    for s in SYSTEMS:
        out[s] = {
            str(n): {
                "effects_per_s": c.spread(rates[s, n], 1),
                "lock_wait": {k: _wait_stats(v) for k, v in sorted(waits[s, n].items())},
            }
            for n in worker_counts
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=5, metavar=("SYSTEM", "DIR", "THREAD", "CALLS", "SYNC"))
    args = parser.parse_args()
    if args.worker:
        s, d, t, n, sync_dir = args.worker
        child_worker(s, Path(d), t, int(n), Path(sync_dir))
        return
    q = c.quick()
    params = {"workers": [1, 2, 4], "calls_per_worker": 3 if q else 30, "repeats": 1 if q else 2}
    c.log("concurrency: workers sharing one state directory")
    results = run(params["workers"], params["calls_per_worker"], params["repeats"])
    c.log(f"wrote {c.write_result('concurrency', params, results)}")


if __name__ == "__main__":
    main()
