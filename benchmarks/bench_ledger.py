"""Benchmark: what the ledger costs per side effect, against raw durable SQLite commits.

In one run, on one disk:

1. floor: single-row ``INSERT`` + ``COMMIT`` in WAL mode with ``synchronous=FULL``
   (one fsync each), the cheapest durable write SQLite can do;
2. the full ledger path of one operation: ``open`` -> ``record_review`` ->
   ``claim`` -> ``record_result``; and the dispatch path alone (``claim`` ->
   ``record_result``), which is what a side effect pays once its review is
   recorded.

The two are interleaved in rounds so that disk and CPU drift hit both; each
round gives a paired ratio, and we report the median and min-max of those.
Then ``get`` by id and ``recover_in_flight`` on ledgers of 1k/10k/100k rows
(1M with ``--with-1m``), each with 10 rows IN_FLIGHT.

Writes ``benchmarks/results/ledger.json`` and prints a Markdown table.
Usage: ``.venv/bin/python benchmarks/bench_ledger.py [--rounds 40] [--per-round 50] [--with-1m]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from effectgate.graph import new_worker_id
from effectgate.ledger import (
    Approval,
    Budget,
    OpenRequest,
    Operation,
    OpState,
    Receipt,
    SqliteLedger,
)
from effectgate.ledger import _codec as codec
from effectgate.tools import intent_hash

RESULTS = Path(__file__).parent / "results"
IN_FLIGHT_ROWS = 10


def _request(n: int, tag: str) -> OpenRequest:
    args = {"path": f"out/{tag}-{n}.txt", "content": "x" * 64}
    return OpenRequest(
        operation_id=f"{tag}:{n}",
        thread_id=f"thread-{tag}",
        tool_call_id=f"call_{n}",
        tool="write_file",
        tool_version="1",
        args=args,
        intent_hash=intent_hash("write_file", "1", args),
        budget=Budget(max_attempts=3),
    )


def _approval(req: OpenRequest, now: datetime) -> Approval:
    return Approval(
        operation_id=req.operation_id,
        thread_id=req.thread_id,
        tool_call_id=req.tool_call_id,
        decision="approve",
        intent_hash=req.intent_hash,
        reviewer="bench",
        decided_at=now,
    )


def _receipt(op: Operation, now: datetime) -> Receipt:
    return Receipt(
        operation_id=op.operation_id,
        intent_hash=op.intent_hash,
        attempt=op.attempt,
        result={"bytes": 64},
        recorded_at=now,
    )


class Floor:
    """Raw durable commits: one row per ``BEGIN IMMEDIATE; INSERT; COMMIT``."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        self.payload = "x" * 200

    def commit_once(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO t (payload) VALUES (?)", (self.payload,))
        self.conn.execute("COMMIT")


class LedgerPath:
    """One operation's ledger path; ``count()`` tallies its commits with a trace callback."""

    def __init__(self, path: Path) -> None:
        self.ledger = SqliteLedger(path)  # the wall clock by default
        self.n = 0
        self.commits = 0
        self.normal_commits = 0

    def count(self, fn: Callable[[], None], times: int) -> tuple[float, float]:
        """Run ``fn`` with tracing on (untimed); return (commits, NORMAL commits) per call."""
        conn = self.ledger.store._conn  # type: ignore[attr-defined]
        self.commits = self.normal_commits = 0
        conn.set_trace_callback(self._trace)
        for _ in range(times):
            fn()
        conn.set_trace_callback(None)
        return self.commits / times, self.normal_commits / times

    def _trace(self, sql: str) -> None:
        if sql == "COMMIT":
            self.commits += 1
        elif sql == "PRAGMA synchronous = NORMAL":
            self.normal_commits += 1  # the next COMMIT skips the fsync

    def full(self) -> None:
        """open -> record_review -> claim -> record_result."""
        self.n += 1
        req = _request(self.n, "full")
        now = datetime.now(UTC)
        fields = {f: getattr(req, f) for f in req.__dataclass_fields__}
        self.ledger.open(**fields)
        self.ledger.record_review([req], [_approval(req, now)])
        op = self.ledger.claim(req.operation_id, attempt=1, worker="bench")
        self.ledger.record_result(
            op.operation_id, attempt=1, state=OpState.SUCCEEDED, receipt=_receipt(op, now)
        )

    def prepare_dispatch(self, count: int) -> list[str]:
        reqs = [_request(self.n + i + 1, "disp") for i in range(count)]
        self.n += count
        now = datetime.now(UTC)
        self.ledger.record_review(reqs, [_approval(r, now) for r in reqs])
        return [r.operation_id for r in reqs]

    def dispatch(self, operation_id: str) -> None:
        """claim -> record_result: what one side effect pays after its review."""
        op = self.ledger.claim(operation_id, attempt=1, worker="bench")
        self.ledger.record_result(
            op.operation_id,
            attempt=1,
            state=OpState.SUCCEEDED,
            receipt=_receipt(op, datetime.now(UTC)),
        )


def _per_call_s(fn: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - start) / count


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_paths(work: Path, rounds: int, per_round: int) -> dict[str, Any]:
    floor = Floor(work / "floor.sqlite3")
    path = LedgerPath(work / "ledger.sqlite3")
    floor_s, full_s, disp_s = [], [], []
    for _ in range(2):  # warm-up: page cache, statement cache
        floor.commit_once()
        path.full()
    full_commits = path.count(path.full, 20)
    ids = iter(path.prepare_dispatch(20))
    dispatch_commits = path.count(lambda: path.dispatch(next(ids)), 20)
    for _ in range(rounds):
        floor_s.append(_per_call_s(floor.commit_once, per_round))
        full_s.append(_per_call_s(path.full, per_round))
        ids = iter(path.prepare_dispatch(per_round))
        disp_s.append(_per_call_s(lambda ids=ids: path.dispatch(next(ids)), per_round))
    path.ledger.close()
    floor.conn.close()
    return {
        "rounds": rounds,
        "ops_per_round": per_round,
        "floor_commit_ms": _spread([s * 1e3 for s in floor_s]),
        "full_path_ms": _spread([s * 1e3 for s in full_s]),
        "dispatch_path_ms": _spread([s * 1e3 for s in disp_s]),
        "full_path_ratio": _spread([f / c for f, c in zip(full_s, floor_s, strict=True)]),
        "dispatch_path_ratio": _spread([d / c for d, c in zip(disp_s, floor_s, strict=True)]),
        "commits_per_full_op": full_commits[0],
        "normal_commits_per_full_op": full_commits[1],
        "commits_per_dispatch_op": dispatch_commits[0],
        "normal_commits_per_dispatch_op": dispatch_commits[1],
    }


def _dead_worker() -> str:
    host, _pid, nonce, *scope = new_worker_id().split(":")
    return ":".join([host, str(2**22 + 1), nonce, *scope])


DEAD_WORKER = _dead_worker()
"""A worker id proven gone: this host and scope, a pid above any ``pid_max``."""


def put_back_in_flight(path: Path) -> None:
    """Undo a recovery for the next repetition: the rows as the dead worker left them.

    Recovery clears ``claimed_by`` and gives the dead worker's attempt back
    (``recoveries`` + 1). The ledger's guard lets ``recoveries`` only grow, so
    the undo lifts the guard for its one statement, in one transaction.
    """
    from effectgate.ledger._migrations import MIGRATIONS

    (guard,) = [sql for sql in MIGRATIONS[6] if "TRIGGER operations_recoveries_grow" in sql]
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("DROP TRIGGER operations_recoveries_grow")
        raw.execute(
            "UPDATE operations SET state = 'IN_FLIGHT', claimed_by = ?, recoveries = 0 "
            "WHERE state = 'UNKNOWN'",
            (DEAD_WORKER,),
        )
        raw.execute(guard)
        raw.execute("COMMIT")
    finally:
        raw.close()


def _bulk_ledger(path: Path, rows: int) -> list[str]:
    """Fill a ledger with ``rows`` SUCCEEDED operations (10 IN_FLIGHT) in one transaction.

    The IN_FLIGHT rows name a worker that is proven gone (this host and scope,
    a pid above any ``pid_max``), as a ``kill -9`` leaves them: the ledger
    refuses an IN_FLIGHT row without its worker as damaged.
    """
    SqliteLedger(path).close()  # create and migrate
    now = datetime.now(UTC)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    placeholders = ", ".join("?" * len(codec.OPERATION_COLUMNS))
    sql = f"INSERT INTO operations ({', '.join(codec.OPERATION_COLUMNS)}) VALUES ({placeholders})"
    ids = []
    batch = []
    for n in range(rows):
        req = _request(n, "bulk")
        state = OpState.IN_FLIGHT if n % (rows // IN_FLIGHT_ROWS) == 0 else OpState.SUCCEEDED
        op = Operation(
            operation_id=req.operation_id,
            thread_id=req.thread_id,
            tool_call_id=req.tool_call_id,
            tool=req.tool,
            tool_version=req.tool_version,
            args=req.args,
            intent_hash=req.intent_hash,
            state=state,
            attempt=1,
            created_at=now,
            updated_at=now,
            claimed_by=DEAD_WORKER if state is OpState.IN_FLIGHT else None,
        )
        if state is OpState.SUCCEEDED:
            op = dataclasses.replace(op, receipt=_receipt(op, now))
        batch.append(codec.operation_to_row(op))
        ids.append(req.operation_id)
        if len(batch) == 10_000:
            conn.executemany(sql, batch)
            batch.clear()
    conn.executemany(sql, batch)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return ids


def bench_scale(work: Path, rows: int) -> dict[str, Any]:
    path = work / f"scale-{rows}.sqlite3"
    t0 = time.perf_counter()
    ids = _bulk_ledger(path, rows)
    build_s = time.perf_counter() - t0
    rng = random.Random(rows)
    with SqliteLedger(path) as ledger:
        # Cold reads of distinct ids (a repeat would come from the memo of
        # decoded rows); the first 100 only warm the connection up.
        picked = rng.sample(ids, min(len(ids), 1100))
        for op_id in picked[:100]:
            ledger.get(op_id)
        sample = picked[100:]
        get_s = [_per_call_s(lambda op_id=op_id: ledger.get(op_id), 1) for op_id in sample]
        recover_s = []
        for _ in range(5):
            start = time.perf_counter()
            recovered = ledger.recover_in_flight()
            recover_s.append(time.perf_counter() - start)
            assert len(recovered) == IN_FLIGHT_ROWS, len(recovered)
            # put them back in flight for the next repetition
            put_back_in_flight(path)
        conn = ledger.store._conn  # type: ignore[attr-defined]
        traced: list[str] = []
        conn.set_trace_callback(traced.append)
        ledger.recover_in_flight()
        conn.set_trace_callback(None)
        scan = next(sql for sql in traced if sql.startswith("SELECT"))
        plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + scan)]
    size_mb = path.stat().st_size / 1e6
    path.unlink()
    return {
        "rows": rows,
        "file_mb": round(size_mb, 1),
        "build_s": round(build_s, 2),
        "get_us": _spread([s * 1e6 for s in get_s]),
        "recover_in_flight_ms": _spread([s * 1e3 for s in recover_s]),
        "recover_query_plan": plan,
    }


def _markdown(result: dict[str, Any]) -> str:
    p = result["paths"]

    def fmt(d: dict[str, float], unit: str = "") -> str:
        return f"{d['median']:.2f}{unit} ({d['min']:.2f}-{d['max']:.2f})"

    lines = [
        "| measure | median (min-max over rounds) |",
        "|---|---|",
        f"| raw durable commit (WAL, FULL) | {fmt(p['floor_commit_ms'], ' ms')} |",
        f"| full ledger path (open, review, claim, result) | {fmt(p['full_path_ms'], ' ms')} |",
        f"| dispatch path (claim, result) | {fmt(p['dispatch_path_ms'], ' ms')} |",
        f"| full path / raw commit (paired) | {fmt(p['full_path_ratio'], 'x')} |",
        f"| dispatch path / raw commit (paired) | {fmt(p['dispatch_path_ratio'], 'x')} |",
        f"| commits per full path (of which NORMAL) | {p['commits_per_full_op']:.2f} "
        f"({p['normal_commits_per_full_op']:.2f}) |",
        f"| commits per dispatch path (of which NORMAL) | {p['commits_per_dispatch_op']:.2f} "
        f"({p['normal_commits_per_dispatch_op']:.2f}) |",
        "",
        "| rows | file MB | get by id, µs | recover_in_flight (10 in flight), ms |",
        "|---:|---:|---|---|",
    ]
    for s in result["scale"]:
        lines.append(
            f"| {s['rows']:,} | {s['file_mb']} | {fmt(s['get_us'])} | "
            f"{fmt(s['recover_in_flight_ms'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=50)
    parser.add_argument("--with-1m", action="store_true", help="also measure a 1M-row ledger")
    parser.add_argument("--dir", type=Path, default=RESULTS, help="where the scratch files go")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-ledger-", suffix=".tmp", dir=args.dir))
    started = time.perf_counter()
    try:
        paths = bench_paths(work, args.rounds, args.per_round)
        sizes = [1_000, 10_000, 100_000] + ([1_000_000] if args.with_1m else [])
        scale = [bench_scale(work, n) for n in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "scratch_dir": str(args.dir.resolve()),
        "seconds": round(time.perf_counter() - started, 1),
        "paths": paths,
        "scale": scale,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ledger.json").write_text(json.dumps(result, indent=2) + "\n")
    print(_markdown(result))
    print(f"\n{result['seconds']} s; JSON in {RESULTS / 'ledger.json'}")


if __name__ == "__main__":
    main()
