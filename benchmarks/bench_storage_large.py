"""Storage growth per tool call when every tool result is large (200 KB), and the step time.

``bench_storage`` measures a thread whose tool returns a few bytes. Here the
same tool returns a 200 KB result, as a search or a file read would: a
checkpoint that holds the whole history then costs O(calls x 200 KB), so any
snapshot taken at a fixed cadence makes the thread's storage quadratic again.
Both systems (plain LangGraph: ``create_agent`` + ``HumanInTheLoopMiddleware``
+ ``SqliteSaver``; effectgate's ``Agent``) run one thread of ``N`` approved
calls (200 by default), taking turns call by call. Reported, per system: the
growth per call of the SQLite files (``page_count * page_size``) and of the
payload LangGraph stored, first quarter against last quarter (target for
effectgate: at most 1.5x, i.e. linear total size), the time per call, and
effectgate's time over plain LangGraph's, call by call.

Plain LangGraph stores the whole history in every checkpoint, so its run
writes tens of gigabytes at 200 calls; ``--baseline-calls`` (default: all)
stops it earlier, and the time ratio is then taken over the calls both ran.

Usage: ``python benchmarks/bench_storage_large.py [--calls N] [--baseline-calls M] [--kib K]``
(writes results/storage_large.json).
"""

from __future__ import annotations

import argparse
import shutil
from typing import Any

import _common as c
from bench_storage import _reading, summarize


def run(calls: int, baseline_calls: int, result_bytes: int) -> dict[str, Any]:
    """Run both threads side by side; return summaries, time ratios and snapshot counts."""
    root = c.work_dir("storage_large")
    script = c.make_script(calls + 2)

    class Baseline(c.Baseline):
        pass

    class Effectgate(c.Effectgate):
        pass

    Baseline.result_bytes = Effectgate.result_bytes = result_bytes
    limits = {"baseline": baseline_calls, "effectgate": calls}
    systems: dict[str, c.System] = {
        "baseline": Baseline(root / "baseline", script),
        "effectgate": Effectgate(root / "effectgate", script),
    }
    readings: dict[str, list[dict[str, int]]] = {n: [] for n in systems}
    times: dict[str, list[float]] = {n: [] for n in systems}
    try:
        for name, system in systems.items():
            system.start("t")
            readings[name].append(_reading(system))
        for i in range(calls):
            for name in c.rotated(list(systems), i):
                if i >= limits[name]:
                    continue
                system = systems[name]
                times[name].append(c.timed(lambda s=system: s.step("t")))  # type: ignore[misc]
                readings[name].append(_reading(system))
            if (i + 1) % 25 == 0:
                c.log(f"  {i + 1}/{calls} calls")
        effects = {n: len(s.sink) for n, s in systems.items()}
        snapshots = _snapshots(systems["effectgate"])
    finally:
        for system in systems.values():
            system.close()
    shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {n: summarize(readings[n], times[n]) for n in systems}
    both = min(calls, baseline_calls)
    pairs = [
        e / b for e, b in zip(times["effectgate"][:both], times["baseline"][:both], strict=True)
    ]
    q = max(1, both // 4)
    out["effectgate_over_baseline_time"] = {
        "calls_compared": both,
        "all": c.spread(pairs),
        "first_quarter": c.spread(pairs[:q]),
        "last_quarter": c.spread(pairs[-q:]),
        "mean_ms_per_call": {
            "effectgate": round(sum(times["effectgate"][:both]) / both, 2),
            "baseline": round(sum(times["baseline"][:both]) / both, 2),
        },
    }
    out["effects_run"] = effects
    out["effectgate_message_snapshots"] = snapshots
    return out


def _snapshots(system: c.System) -> int:
    """How many checkpoints of effectgate's thread hold a full snapshot of the messages."""
    from langgraph.checkpoint.serde.types import _DeltaSnapshot

    assert isinstance(system, c.Effectgate)
    saver = system.agent.graph.checkpointer
    assert saver is not None
    cfg: Any = {"configurable": {"thread_id": "t"}}
    return sum(
        isinstance(t.checkpoint["channel_values"].get("messages"), _DeltaSnapshot)
        for t in saver.list(cfg)
    )


def main() -> None:
    """Parse the sizes, run, write ``results/storage_large.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12 if c.quick() else 200)
    parser.add_argument("--baseline-calls", type=int, default=None)
    parser.add_argument("--kib", type=int, default=200, help="tool result size, KiB")
    ns = parser.parse_args()
    baseline_calls = ns.calls if ns.baseline_calls is None else min(ns.baseline_calls, ns.calls)
    c.log(f"storage_large: {ns.calls}-call threads, {ns.kib} KiB tool results")
    results = run(ns.calls, baseline_calls, ns.kib * 1024)
    params = {
        "calls": ns.calls,
        "baseline_calls": baseline_calls,
        "result_kib": ns.kib,
        "tool": "no-op IDEMPOTENT record(key, value) returning a padded result",
    }
    c.log(f"wrote {c.write_result('storage_large', params, results)}")


if __name__ == "__main__":
    main()
