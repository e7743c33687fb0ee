"""Ledger scaling with the sizes interleaved: recovery scan and get by id, 1k vs 1M operations.

``bench_ledger.py`` (the ledger's own benchmark) measures each size in turn,
right after building its file. This one builds both ledgers first (with
``bench_ledger._bulk_ledger``: finished operations plus 10 IN_FLIGHT), then
alternates the sizes round by round, so drift and page-cache state hit both.
Per round and size:

- ``scan``: ``ledger.list(states=[IN_FLIGHT])``, the query recovery runs
  (partial index on unfinished states);
- ``recover``: ``recover_in_flight()``: the scan plus ten compare-and-set
  updates, ten events and one durable commit (the rows are put back in flight
  afterwards, not timed);
- ``get``: 200 ``ledger.get`` of distinct random existing ids on a freshly
  opened ledger (mean per call): cold reads, none served by the memo of
  decoded rows.

Ratios large/small are paired per round. Targets: recovery scan at
most 1.5x, get by id at most 3x.

Usage: ``python benchmarks/bench_recovery.py`` (writes results/recovery.json).
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import _common as c
import bench_ledger

from effectgate.ledger import OpState, SqliteLedger


def _round(ledger: SqliteLedger, path: Path, ids: list[str], rng: random.Random) -> list[float]:
    t0 = time.perf_counter()
    found = ledger.list(states=[OpState.IN_FLIGHT])
    scan = time.perf_counter() - t0
    t0 = time.perf_counter()
    recovered = ledger.recover_in_flight()
    recover = time.perf_counter() - t0
    if len(found) != 10 or len(recovered) != 10:
        raise RuntimeError(f"{path.name}: {len(found)} in flight, {len(recovered)} recovered")
    bench_ledger.put_back_in_flight(path)
    # Cold reads: distinct ids, on a ledger opened for them, so no row comes
    # from the process's memo of decoded rows (which serves repeats in O(1)).
    sample = rng.sample(ids, 200)
    with SqliteLedger(path) as fresh:
        t0 = time.perf_counter()
        for op_id in sample:
            fresh.get(op_id)
        get = (time.perf_counter() - t0) / len(sample)
    return [scan * 1e3, recover * 1e3, get * 1e6]


def run(sizes: list[int], rounds: int) -> dict[str, Any]:
    """Build both ledgers, then alternate them round by round."""
    root = c.work_dir("recovery")
    paths = {n: root / f"ledger-{n}.sqlite3" for n in sizes}
    ids = {n: bench_ledger._bulk_ledger(paths[n], n) for n in sizes}
    ledgers = {n: SqliteLedger(paths[n]) for n in sizes}
    rng = random.Random(8)
    got: dict[int, list[list[float]]] = {n: [] for n in sizes}
    try:
        for r in range(rounds):
            for n in c.rotated(sizes, r):
                got[n].append(_round(ledgers[n], paths[n], ids[n], rng))
    finally:
        for ledger in ledgers.values():
            ledger.close()
        shutil.rmtree(root, ignore_errors=True)
    lo, hi = sizes
    out: dict[str, Any] = {}
    for k, name in enumerate(["scan_ms", "recover_ms", "get_us"]):
        out[name] = {str(n): c.spread([row[k] for row in got[n]], 3) for n in sizes}
        out[f"{name}_ratio_{hi}_over_{lo}"] = c.spread(
            [b[k] / a[k] for a, b in zip(got[lo], got[hi], strict=True)], 2
        )
    return out


def main() -> None:
    q = c.quick()
    params: dict[str, Any] = {
        "sizes": [1_000, 10_000] if q else [1_000, 1_000_000],
        "rounds": 3 if q else 15,
        "in_flight": 10,
    }
    c.log(f"recovery: ledgers of {params['sizes']} operations, interleaved")
    results = run(params["sizes"], params["rounds"])
    c.log(f"wrote {c.write_result('recovery', params, results)}")


if __name__ == "__main__":
    main()
