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
count: each worker process runs one fresh thread per round (three rounds), and the
two systems' rounds alternate (the idle group waits, polling a file every 2 ms).

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


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.005)


def child_worker(system: str, root: Path, thread: str, calls: int, sync_dir: Path) -> None:
    """One worker: open, say ready; per round wait for go, run a fresh thread, report."""
    rounds = int((sync_dir / "rounds").read_text())
    with c.probed_sqlite():
        sys_ = c.SYSTEMS[system](root, c.make_script(calls + 2))
        (sync_dir / f"ready-{thread}").touch()
        for r in range(rounds):
            _wait_for(sync_dir / f"go-{r}")
            for p in sys_.probes:
                p.lock_waits_ms.clear()
            before = len(sys_.sink)
            t0 = time.monotonic()
            sys_.start(f"{thread}-r{r}")
            for _ in range(calls):
                sys_.step(f"{thread}-r{r}")
            t1 = time.monotonic()
            waits = {p.label.split(".")[0]: list(p.lock_waits_ms) for p in sys_.probes}
            report = {"t0": t0, "t1": t1, "effects": len(sys_.sink) - before, "waits": waits}
            # Write, then rename: the parent must never read a half-written report.
            tmp = sync_dir / f"partial-{r}-{thread}"
            tmp.write_text(json.dumps(report))
            tmp.replace(sync_dir / f"report-{r}-{thread}.json")
        # Closing checkpoints the WAL (I/O): wait until no group is being measured.
        _wait_for(sync_dir / "quit")
        sys_.close()


def _prepare(system: str, root: Path) -> None:
    # Create the files and schemas once, so the workers measure steady state.
    sys_ = c.SYSTEMS[system](root, c.make_script(2))
    try:
        sys_.start("init")
    finally:
        sys_.close()


class _Group:
    """``workers`` processes of one system on one shared state directory, kept for every round."""

    def __init__(self, system: str, workers: int, calls: int, rounds: int) -> None:
        self.system, self.workers = system, workers
        self.base = c.work_dir("concurrency")
        root, self.sync = self.base / "state", self.base / "sync"
        self.sync.mkdir()
        (self.sync / "rounds").write_text(str(rounds))
        _prepare(system, root)
        cmd = [sys.executable, __file__, "--worker", system, str(root)]
        # stderr to files: a full pipe would block a worker that nobody reads yet
        self.logs = [(self.sync / f"stderr-{i}.txt").open("wb") for i in range(workers)]
        self.procs = [
            subprocess.Popen([*cmd, f"w{i}", str(calls), str(self.sync)], stderr=log)
            for i, log in enumerate(self.logs)
        ]

    def wait_ready(self) -> None:
        while len(list(self.sync.glob("ready-*"))) < self.workers:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a {self.system} worker died before starting")
            time.sleep(0.01)

    def round(self, r: int) -> dict[str, Any]:
        go_at = time.monotonic()
        (self.sync / f"go-{r}").touch()
        while len(list(self.sync.glob(f"report-{r}-*.json"))) < self.workers:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a {self.system} worker died: {self.errors()}")
            time.sleep(0.005)
        reports = [json.loads(f.read_text()) for f in self.sync.glob(f"report-{r}-*.json")]
        waits: dict[str, list[float]] = {}
        for rep in reports:
            for label, values in rep["waits"].items():
                waits.setdefault(label, []).extend(values)
        span = max(rep["t1"] for rep in reports) - go_at
        return {"effects": sum(rep["effects"] for rep in reports), "seconds": span, "waits": waits}

    def kill(self) -> None:
        """Stop every worker still running (after a failure elsewhere)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def errors(self) -> str:
        files = sorted(self.sync.glob("stderr-*.txt"))
        return " | ".join(f.read_text(errors="replace")[-1500:] for f in files)

    def close(self) -> None:
        (self.sync / "quit").touch()
        for p in self.procs:
            p.wait(timeout=600)
        for log in self.logs:
            log.close()
        if any(p.returncode != 0 for p in self.procs):
            raise RuntimeError(f"a {self.system} worker failed: {self.errors()}")
        shutil.rmtree(self.base, ignore_errors=True)


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
    """Every (system, worker count), rounds interleaved; pooled lock waits, effects per second."""
    rates: dict[tuple[str, int], list[float]] = {}
    waits: dict[tuple[str, int], dict[str, list[float]]] = {}
    for n in worker_counts:
        groups: dict[str, _Group] = {}
        try:
            for s in SYSTEMS:
                groups[s] = _Group(s, n, calls, repeats)
            for g in groups.values():
                g.wait_ready()
            for r in range(repeats):
                for s in c.rotated(SYSTEMS, r):
                    got = groups[s].round(r)
                    rates.setdefault((s, n), []).append(got["effects"] / got["seconds"])
                    pooled = waits.setdefault((s, n), {})
                    for label, values in got["waits"].items():
                        pooled.setdefault(label, []).extend(values)
                c.log(f"  {n} worker(s), round {r + 1}/{repeats}: " + ", ".join(
                    f"{s} {rates[s, n][-1]:.1f}/s" for s in SYSTEMS))  # fmt: skip
            for g in groups.values():
                g.close()
        finally:
            for g in groups.values():
                g.kill()
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
    params: dict[str, Any] = {
        "workers": [1, 2, 4],
        "calls_per_worker": 3 if q else 25,
        "repeats": 2 if q else 3,
    }
    c.log("concurrency: workers sharing one state directory")
    results = run(params["workers"], params["calls_per_worker"], params["repeats"])
    c.log(f"wrote {c.write_result('concurrency', params, results)}")


if __name__ == "__main__":
    main()
