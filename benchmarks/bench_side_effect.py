"""Per approved side effect (model → review → effect → model): wall time and durable commits.

Part A, time: the systems run side by side, one thread each, and take turns
step by step (the order rotates every step), so each effectgate step is paired
with the baseline step taken just before or after it. Per repeat: the median
step time of each system and the median of the paired ratios, for wall time
and for this process's CPU time (``time.process_time``: all its threads, no
waits; ``cpu_ms_per_effect``, ``cpu_pair_ratio_vs_baseline``). Reported:
median and min-max over repeats.

Part B, commits: one more run with every connection probed (see ``_common``):
commits per side effect, by file and kind (fsync'd, NORMAL, empty).

Part C, fsyncs: the same steps in a child process under ``strace -f -c``:
``fsync``/``fdatasync`` calls per side effect, from the difference between a
short and a long run (start-up cancels out). Skipped when strace is missing.

Usage: ``python benchmarks/bench_side_effect.py`` (writes results/side_effect.json).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as c


class EffectgateGraph(c.Effectgate):
    """effectgate's compiled graph driven directly: no lease, no recovery scan, no status read."""

    name = "effectgate_graph"

    def __init__(self, root: Path, script: dict[str, Any], sink: list[str] | None = None) -> None:
        super().__init__(root, script, sink)
        self.pending: dict[str, str] = {}

    def _stream(self, value: Any, thread_id: str) -> None:
        cfg: Any = {"configurable": {"thread_id": thread_id}, "recursion_limit": 100}
        self.pending.pop(thread_id, None)
        for chunk in self.agent.graph.stream(value, cfg, stream_mode="updates", durability="sync"):
            for item in chunk.get("__interrupt__", ()):
                self.pending[thread_id] = item.id

    def start(self, thread_id: str) -> None:
        from langchain_core.messages import HumanMessage

        self._stream({"messages": [HumanMessage(c.TASK)]}, thread_id)

    def step(self, thread_id: str) -> None:
        from langgraph.types import Command

        self._stream(Command(resume={self.pending[thread_id]: c.APPROVE}), thread_id)


c.SYSTEMS["effectgate_graph"] = EffectgateGraph
VARIANTS = ["baseline", "effectgate", "effectgate_graph"]


def _time_repeat(
    r: int, steps: int, warmup: int, variants: list[str]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    root = c.work_dir("side_effect")
    script = c.make_script(warmup + steps + 1)
    systems = {name: c.SYSTEMS[name](root / name, script) for name in variants}
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for system in systems.values():
            system.start("t")
            for _ in range(warmup):
                system.step("t")
        for i in range(steps):
            for name in c.rotated(variants, i + r):
                system = systems[name]
                wall, cpu = c.timed_cpu(lambda s=system: s.step("t"))  # type: ignore[misc]
                times[name].append(wall)
                cpus[name].append(cpu)
        for name, system in systems.items():
            if len(system.sink) != warmup + steps:
                raise RuntimeError(f"{name}: {len(system.sink)} effects for {warmup + steps} steps")
    finally:
        for system in systems.values():
            system.close()
        shutil.rmtree(root, ignore_errors=True)
    return times, cpus


def part_time(
    repeats: int, steps: int, warmup: int, variants: list[str] = VARIANTS
) -> dict[str, Any]:
    """Paired step times, ``repeats`` fresh runs of ``steps`` interleaved steps.

    ``variants`` are names in ``_common.SYSTEMS``; the first is the reference.
    """
    ref = variants[0]
    med: dict[str, list[float]] = {n: [] for n in variants}
    ratio: dict[str, list[float]] = {n: [] for n in variants}
    pair: dict[str, list[float]] = {n: [] for n in variants}
    added: dict[str, list[float]] = {n: [] for n in variants}
    cpu_med: dict[str, list[float]] = {n: [] for n in variants}
    cpu_pair: dict[str, list[float]] = {n: [] for n in variants}
    for r in range(repeats):
        times, cpus = _time_repeat(r, steps, warmup, variants)
        base = times[ref]
        for name in variants:
            cpu_med[name].append(statistics.median(cpus[name]))
            cpu_pair[name].append(
                statistics.median(a / b for a, b in zip(cpus[name], cpus[ref], strict=True))
            )
            med[name].append(statistics.median(times[name]))
            ratio[name].append(med[name][-1] / med[ref][-1])
            pair[name].append(
                statistics.median(a / b for a, b in zip(times[name], base, strict=True))
            )
            added[name].append(med[name][-1] - med[ref][-1])
        c.log(
            f"  repeat {r + 1}/{repeats}: "
            + ", ".join(f"{n} {med[n][-1]:.2f} ms (CPU {cpu_med[n][-1]:.2f})" for n in variants)
        )
    return {
        "ms_per_effect": {n: c.spread(med[n]) for n in variants},
        "ratio_vs_baseline": {n: c.spread(ratio[n]) for n in variants},
        "pair_ratio_vs_baseline": {n: c.spread(pair[n]) for n in variants},
        "added_ms_vs_baseline": {n: c.spread(added[n]) for n in variants},
        "cpu_ms_per_effect": {n: c.spread(cpu_med[n]) for n in variants},
        "cpu_pair_ratio_vs_baseline": {n: c.spread(cpu_pair[n]) for n in variants},
    }


def part_commits(steps: int, variants: list[str] = VARIANTS) -> dict[str, Any]:
    """Commits per side effect by file and kind, from probed connections."""
    out: dict[str, Any] = {}
    root = c.work_dir("side_effect_commits")
    with c.probed_sqlite():
        for name in variants:
            system = c.SYSTEMS[name](root / name, c.make_script(steps + 3))
            try:
                system.start("t")
                system.step("t")
                before = system.commits()
                for _ in range(steps):
                    system.step("t")
                after = system.commits()
            finally:
                system.close()
            per: dict[str, dict[str, float]] = {}
            for f, kinds in after.items():
                per[f] = {k: (v - before.get(f, {}).get(k, 0)) / steps for k, v in kinds.items()}
            out[name] = {
                "by_file": per,
                "durable": sum(k["durable"] for k in per.values()),
                "all": sum(sum(k.values()) for k in per.values()),
            }
    shutil.rmtree(root, ignore_errors=True)
    return out


def _strace_fsyncs(name: str, steps: int) -> int:
    with tempfile.TemporaryDirectory(prefix="effectgate-bench-strace-") as tmp:
        out = Path(tmp) / "strace.txt"
        cmd = [
            "strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(out),
            sys.executable, __file__, "--fsync-child", name, str(steps), tmp,
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        total = 0
        for line in out.read_text().splitlines():
            parts = line.split()
            if parts and parts[-1] in ("fsync", "fdatasync"):
                total += int(parts[3])
        return total


def part_fsyncs(short: int, long: int) -> dict[str, Any] | None:
    """fsync/fdatasync system calls per side effect, counted by strace."""
    if shutil.which("strace") is None:
        return None
    out: dict[str, Any] = {}
    for name in VARIANTS:
        lo, hi = _strace_fsyncs(name, short), _strace_fsyncs(name, long)
        out[name] = round((hi - lo) / (long - short), 2)
    return out


def fsync_child(name: str, steps: int, tmp: str) -> None:
    """Run ``steps`` side effects of one system (under strace, in a child process)."""
    system = c.SYSTEMS[name](Path(tmp) / name, c.make_script(steps + 2))
    try:
        system.start("t")
        for _ in range(steps):
            system.step("t")
    finally:
        system.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsync-child", nargs=3, metavar=("SYSTEM", "STEPS", "DIR"))
    args = parser.parse_args()
    if args.fsync_child:
        name, steps, tmp = args.fsync_child
        fsync_child(name, int(steps), tmp)
        return
    q = c.quick()
    params: dict[str, Any] = {
        "repeats": 1 if q else 5,
        "steps": 4 if q else 50,
        "warmup": 1 if q else 5,
        "commit_steps": 3 if q else 10,
        "strace_steps": [2, 4] if q else [2, 12],
        "variants": VARIANTS,
        "tool": "no-op IDEMPOTENT record(key, value)",
    }
    c.log("side effect: time (interleaved)")
    results: dict[str, Any] = part_time(params["repeats"], params["steps"], params["warmup"])
    c.log("side effect: commits (probed)")
    results["commits_per_effect"] = part_commits(params["commit_steps"])
    c.log("side effect: fsyncs (strace)")
    results["fsyncs_per_effect"] = part_fsyncs(*params["strace_steps"])
    path = c.write_result("side_effect", params, results)
    c.log(f"wrote {path}")


if __name__ == "__main__":
    main()
