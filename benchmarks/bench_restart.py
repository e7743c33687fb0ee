"""Time from process start to the first dispatched effect after a kill.

Setup, once per system: a child process runs a thread through ``K`` approved
calls and dies (``os._exit(137)``, no clean-up, like ``kill -9``) inside the
tool of call ``K``: for effectgate after its IN_FLIGHT commit, for the
baseline inside its tools node. The directory it leaves is the template.

Measurement, per repeat: copy the template, record ``time.monotonic()`` (a
system-wide clock on Linux) and spawn a fresh interpreter that recovers the
thread: effectgate ``Agent.resume(thread)`` (take over the dead owner's lease,
IN_FLIGHT -> UNKNOWN, the idempotent tool's contract allows a retry, claim
attempt 2, call the tool); baseline ``stream(None)`` (re-runs the tools node).
The tool writes the clock on its first call and exits. Reported: spawn →
first effect, split into interpreter start, imports + open, and recovery up to
the effect. The systems take turns, the order rotating by repeat.

Both systems start from bytecode, as installed packages do (pip compiles a
wheel's modules when it installs them): effectgate's sources are compiled
once before the runs (``compile_sources``). Without that step, under
``PYTHONDONTWRITEBYTECODE=1`` an editable checkout compiles every effectgate
module in every child, while LangChain's modules load from the ``.pyc`` files
pip wrote, which charges effectgate (and the baseline, for the
``effectgate.models`` and ``effectgate.tools`` modules it imports) for
compilation no installed deployment does.

Usage: ``python benchmarks/bench_restart.py`` (writes results/restart.json).
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c

SYSTEMS = ["baseline", "effectgate"]


class Tripwire(list[str]):
    """The tool's sink: on the armed call it runs ``action`` instead of returning."""

    def __init__(self, arm_at: int, action: Any) -> None:
        super().__init__()
        self.arm_at = arm_at
        self.action = action

    def append(self, item: str) -> None:
        super().append(item)
        if len(self) == self.arm_at:
            self.action()


def child_crash(system: str, root: Path, calls: int) -> None:
    """Run ``calls`` approved calls; die inside the tool of the last one."""
    sink = Tripwire(calls, lambda: os._exit(137))
    sys_ = c.SYSTEMS[system](root, c.make_script(calls + 2), sink)
    sys_.start("t")
    for _ in range(calls):
        sys_.step("t")
    raise SystemExit("the tripwire did not fire")


def child_recover(system: str, root: Path, calls: int, out: Path) -> None:
    """Recover the killed thread; write the clock at start, after open, at the first effect."""
    t_main = time.monotonic()
    marks: dict[str, float] = {"main": t_main}

    def first_effect() -> None:
        marks["effect"] = time.monotonic()
        out.write_text(json.dumps(marks))
        os._exit(0)

    sys_ = c.SYSTEMS[system](root, c.make_script(calls + 2), Tripwire(1, first_effect))
    marks["opened"] = time.monotonic()
    sys_.recover("t")  # type: ignore[attr-defined]
    raise SystemExit("recovery dispatched no effect")


def compile_sources() -> bool:
    """Byte-compile the ``effectgate`` package in place (``__pycache__``, as pip does at install).

    Returns:
        ``True`` if every module compiled (or its bytecode was already up to date).
    """
    spec = importlib.util.find_spec("effectgate")
    if spec is None or not spec.submodule_search_locations:
        return False
    ok = True
    for where in spec.submodule_search_locations:
        ok = bool(compileall.compile_dir(where, quiet=1)) and ok
    return ok


def _template(system: str, calls: int) -> Path:
    path = c.work_dir("restart_templates") / system
    cmd = [sys.executable, __file__, "--crash", system, str(path), str(calls)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 137:
        raise RuntimeError(f"{system} setup exited {done.returncode}: {done.stderr[-2000:]}")
    return path


def _measure(src: Path, system: str, calls: int) -> dict[str, float]:
    dst = c.work_dir("restart") / "state"
    shutil.copytree(src, dst)
    out = dst.parent / "marks.json"
    cmd = [sys.executable, __file__, "--recover", system, str(dst), str(calls), str(out)]
    t_spawn = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{system} recovery exited {done.returncode}: {done.stderr[-2000:]}")
    marks = json.loads(out.read_text())
    shutil.rmtree(dst.parent, ignore_errors=True)
    return {
        "total_ms": (marks["effect"] - t_spawn) * 1e3,
        "interpreter_ms": (marks["main"] - t_spawn) * 1e3,
        "imports_and_open_ms": (marks["opened"] - marks["main"]) * 1e3,
        "recover_to_effect_ms": (marks["effect"] - marks["opened"]) * 1e3,
    }


def run(calls: int, repeats: int) -> dict[str, Any]:
    """Spawn-to-first-effect per system, interleaved, plus the paired ratio."""
    if not compile_sources():
        c.log("  could not byte-compile effectgate: its children compile it at every start")
    sources = {s: _template(s, calls) for s in SYSTEMS}
    got: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    for r in range(repeats):
        for s in c.rotated(SYSTEMS, r):
            got[s].append(_measure(sources[s], s, calls))
        c.log(f"  repeat {r + 1}/{repeats}: " + ", ".join(
            f"{s} {got[s][-1]['total_ms']:.0f} ms" for s in SYSTEMS))  # fmt: skip
    out: dict[str, Any] = {
        s: {k: c.spread([m[k] for m in got[s]], 1) for k in got[s][0]} for s in SYSTEMS
    }
    out["effectgate_over_baseline"] = c.spread(
        [
            e["total_ms"] / b["total_ms"]
            for e, b in zip(got["effectgate"], got["baseline"], strict=True)
        ],
        2,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash", nargs=3, metavar=("SYSTEM", "DIR", "CALLS"))
    parser.add_argument("--recover", nargs=4, metavar=("SYSTEM", "DIR", "CALLS", "OUT"))
    args = parser.parse_args()
    if args.crash:
        child_crash(args.crash[0], Path(args.crash[1]), int(args.crash[2]))
        return
    if args.recover:
        s, d, n, o = args.recover
        child_recover(s, Path(d), int(n), Path(o))
        return
    params = {"calls_before_kill": 5 if c.quick() else 20, "repeats": 2 if c.quick() else 5}
    c.log(f"restart: kill at call {params['calls_before_kill']}, time to first effect")
    results = run(params["calls_before_kill"], params["repeats"])
    c.log(f"wrote {c.write_result('restart', params, results)}")


if __name__ == "__main__":
    main()
