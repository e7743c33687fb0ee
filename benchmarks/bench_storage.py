"""Storage growth per tool call over one long thread, and how step time follows it.

Both systems run one thread of ``N`` approved side effects (200 by default),
taking turns call by call. After every call the benchmark reads, for each
system, the logical size of its SQLite files (``page_count * page_size``;
checkpoints, plus the ledger for effectgate) and the payload bytes LangGraph
stored (checkpoint and metadata blobs, pending writes). Growth per call is the
difference between consecutive readings; reported are the means over the first
and the last quarter of the thread and their ratio (target for effectgate:
at most 1.5x, i.e. linear total size). Step times come from the same run, so
the quarter ratios show the O(history) CPU cost as well.

The finished threads, paused at the review of call ``N + 1``, are kept as
templates for ``bench_resume`` when run from ``run_all.py``.

Usage: ``python benchmarks/bench_storage.py`` (writes results/storage.json).
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import _common as c

SYSTEMS = ["baseline", "effectgate"]


def db_bytes(path: Path) -> int:
    """Logical size of an SQLite file: ``page_count * page_size`` (WAL included); 0 if absent."""
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, factory=sqlite3.Connection)
    try:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(pages) * int(size)
    finally:
        conn.close()


def payload_bytes(path: Path) -> int:
    """Bytes of checkpoint blobs, metadata and pending writes LangGraph stored in ``path``."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, factory=sqlite3.Connection)
    try:
        (ckpt,) = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
        ).fetchone()
        (writes,) = conn.execute("SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes").fetchone()
        return int(ckpt) + int(writes)
    finally:
        conn.close()


def _reading(system: c.System) -> dict[str, int]:
    files = system.checkpoint_files()
    return {
        "checkpoints": db_bytes(files[0]),
        "ledger": db_bytes(files[1]) if len(files) > 1 else 0,
        "payload": payload_bytes(files[0]),
    }


def _quarters(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return statistics.fmean(values[:q]), statistics.fmean(values[-q:])


def _growth(readings: list[dict[str, int]], key: str) -> list[float]:
    return [float(b[key] - a[key]) for a, b in itertools.pairwise(readings)]


def summarize(readings: list[dict[str, int]], times: list[float]) -> dict[str, Any]:
    """Per-call growth and time, first vs last quarter."""
    total = [
        {"total": r["checkpoints"] + r["ledger"], **r} for r in readings
    ]  # reading 0 is before call 1
    out: dict[str, Any] = {}
    for key in ("total", "checkpoints", "ledger", "payload"):
        first, last = _quarters(_growth(total, key))
        out[f"{key}_kib_per_call"] = {
            "first_quarter": round(first / 1024, 2),
            "last_quarter": round(last / 1024, 2),
            "ratio": round(last / first, 2) if first else None,
        }
    first_t, last_t = _quarters(times)
    out["ms_per_call"] = {
        "first_quarter": round(first_t, 2),
        "last_quarter": round(last_t, 2),
        "ratio": round(last_t / first_t, 2),
    }
    final = total[-1]
    out["final_mib"] = {
        "checkpoints": round(final["checkpoints"] / 2**20, 2),
        "ledger": round(final["ledger"] / 2**20, 2),
    }
    return out


def run(calls: int, names: list[str] = SYSTEMS) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Run the threads side by side; return the summaries and the raw step times."""
    root = c.work_dir("storage")
    script = c.make_script(calls + 2)
    systems = {name: c.SYSTEMS[name](root / name, script) for name in names}
    readings: dict[str, list[dict[str, int]]] = {n: [] for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        for name, system in systems.items():
            system.start("t")
            readings[name].append(_reading(system))
        for i in range(calls):
            for name in c.rotated(names, i):
                system = systems[name]
                times[name].append(c.timed(lambda s=system: s.step("t")))  # type: ignore[misc]
                readings[name].append(_reading(system))
            if (i + 1) % 50 == 0:
                c.log(f"  {i + 1}/{calls} calls")
    finally:
        for system in systems.values():
            system.close()
    keep = c.template_dir()
    for name in names:
        if keep is not None:
            shutil.copytree(root / name, keep / f"{name}-{calls}", dirs_exist_ok=True)
    out: dict[str, Any] = {n: summarize(readings[n], times[n]) for n in names}
    if "effectgate" in names:
        out["effectgate_checks"] = check_long_thread(root / "effectgate", calls)
    shutil.rmtree(root, ignore_errors=True)
    return out, times


def check_long_thread(state: Path, calls: int) -> dict[str, Any]:
    """Read the long effectgate thread back after reopening it.

    The messages channel stores deltas with a full snapshot whenever the bytes
    since the last one reach half its size, so a 200-call thread crosses
    several snapshots: every sampled earlier
    checkpoint must read back as a prefix of the latest history (time travel),
    the history must pass ``history_problems``, and one more resume after
    reopening must run exactly one effect.
    """
    from langgraph.checkpoint.serde.types import _DeltaSnapshot

    from effectgate.graph import history_problems

    system = c.SYSTEMS["effectgate"](state, c.make_script(calls + 2))
    try:
        assert isinstance(system, c.Effectgate)
        graph = system.agent.graph
        saver = graph.checkpointer
        assert saver is not None
        cfg: Any = {"configurable": {"thread_id": "t"}}
        latest = [m.id for m in graph.get_state(cfg).values["messages"]]
        history = list(graph.get_state_history(cfg))
        sampled = history[:: max(1, len(history) // 16)]
        ids = [[m.id for m in snap.values.get("messages", [])] for snap in sampled]
        prefixes = all(got == latest[: len(got)] for got in ids)
        snapshots = sum(
            isinstance(t.checkpoint["channel_values"].get("messages"), _DeltaSnapshot)
            for t in saver.list(cfg)
        )
        before = len(system.sink)
        system.step("t")
        return {
            "messages_latest": len(latest),
            "expected_messages": 1 + 2 * calls + 1,
            "checkpoints": len(history),
            "message_snapshots": snapshots,
            "sampled_checkpoints": len(sampled),
            "sampled_checkpoints_are_prefixes": prefixes,
            "history_problems": history_problems(graph.get_state(cfg).values["messages"]),
            "effects_of_one_resume_after_reopen": len(system.sink) - before,
        }
    finally:
        system.close()


def main() -> None:
    calls = 12 if c.quick() else 200
    c.log(f"storage: {calls}-call threads")
    results, times = run(calls)
    q = max(1, calls // 4)
    pairs = [a / b for a, b in zip(times["effectgate"], times["baseline"], strict=True)]
    results["effectgate_over_baseline_time"] = {
        "first_quarter": c.spread(pairs[:q]),
        "last_quarter": c.spread(pairs[-q:]),
    }
    params = {"calls": calls, "systems": SYSTEMS, "tool": "no-op IDEMPOTENT record(key, value)"}
    c.log(f"wrote {c.write_result('storage', params, results)}")


if __name__ == "__main__":
    main()
