"""Where one approved side effect spends its CPU: effectgate against plain LangGraph, on SQLite.

Both systems (``_common.Baseline`` and ``_common.Effectgate``) are opened in
this process, warmed up, then run ``--steps`` approved side effects each,
taking turns. Written to ``results/profile_side_effect.txt``:

1. CPU time (``time.process_time``) and wall time per step, medians and
   min-max, and the median of the paired ratios;
2. per step: checkpoints written (``put``, one per superstep under
   ``durability="sync"``), task writes (``put_writes``), checkpoint reads
   (``get_tuple``, ``list``, delta-channel history), ledger store calls by
   name, each with its CPU cost, and SQLite statements executed;
3. a ``cProfile`` of effectgate's steps (and of the baseline's), the CPU
   self time grouped by package, and the top functions by cumulative time.

Usage: ``python benchmarks/profile_side_effect.py [--steps 60]``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import shutil
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import _common as c

COUNTS: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
"""Per system: per instrumented call name, the CPU ms of each call."""
_ACTIVE: list[str] = []


def _wrap(cls: Any, name: str, label: str) -> Callable[[], None]:
    original = getattr(cls, name)

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return original(*args, **kwargs)
        t0 = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            COUNTS[_ACTIVE[-1]][label].append(1000 * (time.process_time() - t0))

    setattr(cls, name, run)
    if isinstance(cls, type):
        return lambda: setattr(cls, name, original)
    return lambda: delattr(cls, name)


def _wrap_iter(cls: Any, name: str, label: str) -> Callable[[], None]:
    original = getattr(cls, name)

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return original(*args, **kwargs)
        t0 = time.process_time()
        try:
            return list(original(*args, **kwargs))
        finally:
            COUNTS[_ACTIVE[-1]][label].append(1000 * (time.process_time() - t0))

    setattr(cls, name, run)
    if isinstance(cls, type):
        return lambda: setattr(cls, name, original)
    return lambda: delattr(cls, name)


@contextmanager
def instrumented(savers: list[Any]) -> Iterator[None]:
    """Count and time checkpoint and ledger store calls while installed.

    The savers are wrapped per instance (the outermost call only: a subclass
    calling ``super()`` is not counted twice); the ledger's store, reader and
    transaction classes per method.
    """
    from effectgate.ledger import SqliteLedgerStore
    from effectgate.ledger._sqlite import _Reader, _Transaction

    undo: list[Callable[[], None]] = []
    for saver in savers:
        for meth in ("put", "put_writes", "get_tuple", "get_delta_channel_history"):
            undo.append(_wrap(saver, meth, f"checkpoint.{meth}"))
        undo.append(_wrap_iter(saver, "list", "checkpoint.list"))
    from effectgate.dispatch import Dispatcher
    from effectgate.graph._state import SizedDeltaChannel
    from effectgate.ledger import Ledger
    from effectgate.models import ScriptedChatModel

    for cls, meth, label in (
        (SizedDeltaChannel, "_settle", "messages: snapshot-size estimate (approx_bytes)"),
        (Dispatcher, "dispatch", "dispatch (claim + tool + result), whole"),
        (Ledger, "record_review", "ledger: record_review, whole"),
        (ScriptedChatModel, "_generate", "model: scripted reply, whole"),
    ):
        undo.append(_wrap(cls, meth, label))
    for cls, prefix in (
        (SqliteLedgerStore, "ledger"),
        (_Reader, "ledger.read"),
        (_Transaction, "ledger.txn"),
    ):
        for meth, value in list(vars(cls).items()):
            if callable(value) and not meth.startswith("_"):
                undo.append(_wrap(cls, meth, f"{prefix}.{meth}"))
    try:
        yield
    finally:
        for u in reversed(undo):
            u()


class _Statements:
    """Counts statements on every sqlite3 connection via a trace callback, per system."""

    def __init__(self) -> None:
        self.n: dict[str, int] = defaultdict(int)

    def attach(self, conn: sqlite3.Connection) -> None:
        def trace(_sql: str) -> None:
            if _ACTIVE:
                self.n[_ACTIVE[-1]] += 1

        conn.set_trace_callback(trace)


def _group(stats: pstats.Stats) -> dict[str, float]:
    """Self (tottime) seconds by package, from a cProfile's stats."""
    out: dict[str, float] = defaultdict(float)
    for (file, _line, fn), row in stats.stats.items():  # type: ignore[attr-defined]
        tottime = row[2]
        if "/effectgate/" in file:
            part = file.split("/effectgate/", 1)[1]
            key = "effectgate/" + part.split("/", 1)[0].removesuffix(".py")
        elif "site-packages/" in file:
            key = file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
        elif file == "~":
            if "sqlite3" in fn or "execute" in fn or "commit" in fn or "fetch" in fn:
                key = "builtin: sqlite3"
            else:
                key = "builtin: " + fn.split(" of ")[0].strip("<>").split(" ")[-1][:40]
        else:
            key = "stdlib: " + file.rsplit("/", 1)[-1]
        out[key] += tottime
    return out


def main() -> None:
    """Run the profile and write results/profile_side_effect.txt."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default=str(c.RESULTS_DIR / "profile_side_effect.txt"))
    args = parser.parse_args()
    names = ["baseline", "effectgate"]
    root = c.work_dir("profile")
    script = c.make_script(args.warmup + 2 * args.steps + 2)
    stmts = _Statements()
    real_connect = sqlite3.connect

    def connect(*a: Any, **k: Any) -> sqlite3.Connection:
        conn = real_connect(*a, **k)
        stmts.attach(conn)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        systems = {n: c.SYSTEMS[n](root / n, script) for n in names}
    finally:
        sqlite3.connect = real_connect
    cpu: dict[str, list[float]] = {n: [] for n in names}
    wall: dict[str, list[float]] = {n: [] for n in names}
    profs = {n: cProfile.Profile() for n in names}
    try:
        for s in systems.values():
            s.start("t")
            for _ in range(args.warmup):
                s.step("t")
        savers = [
            systems["baseline"].graph.checkpointer,
            systems["effectgate"].agent.graph.checkpointer,
        ]
        with instrumented(savers):
            for i in range(args.steps):
                for n in c.rotated(names, i):
                    _ACTIVE.append(n)
                    t0, p0 = time.perf_counter(), time.process_time()
                    profs[n].enable()
                    systems[n].step("t")
                    profs[n].disable()
                    cpu[n].append(1000 * (time.process_time() - p0))
                    wall[n].append(1000 * (time.perf_counter() - t0))
                    _ACTIVE.pop()
        # unprofiled, uninstrumented: the true CPU per step
        clean_cpu: dict[str, list[float]] = {n: [] for n in names}
        clean_wall: dict[str, list[float]] = {n: [] for n in names}
        for i in range(args.steps):
            for n in c.rotated(names, i):
                t0, p0 = time.perf_counter(), time.process_time()
                systems[n].step("t")
                clean_cpu[n].append(1000 * (time.process_time() - p0))
                clean_wall[n].append(1000 * (time.perf_counter() - t0))
    finally:
        for s in systems.values():
            s.close()
        shutil.rmtree(root, ignore_errors=True)
    steps = args.steps
    out = io.StringIO()
    m = c.machine_info()
    w = out.write
    w("# profile of one approved side effect, SQLite (benchmarks/profile_side_effect.py)\n")
    w(f"# commit {m['commit']}, load {m['load_avg_1m']}, {steps} steps each, alternating\n\n")
    w("## 1. time per step, without the profiler (paired: same index, taking turns)\n\n")
    for label, data in (("CPU", clean_cpu), ("wall", clean_wall)):
        for n in names:
            w(f"{label:4} {n:11} {c.spread(data[n], 2)}\n")
        ratios = [a / b for a, b in zip(data["effectgate"], data["baseline"], strict=True)]
        w(f"{label:4} ratio effectgate/baseline, median of pairs: {c.spread(ratios)}\n\n")
    w("## 2. calls per step (instrumented run), and their CPU ms per step\n\n")
    for n in names:
        st = stmts.n[n] / steps
        w(f"{n}: {st:.1f} SQLite statements per step\n")
        for label, vals in sorted(COUNTS[n].items()):
            w(f"  {label:42} {len(vals) / steps:5.2f} calls  {sum(vals) / steps:6.3f} ms CPU\n")
        w("\n")
    for n in names:
        stats = pstats.Stats(profs[n])
        total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
        per = 1000 * total / steps
        w(f"## 3. {n}: profiled CPU per step {per:.2f} ms; self time by package\n\n")
        for key, sec in sorted(_group(stats).items(), key=lambda kv: -kv[1])[:22]:
            w(f"  {key:44} {1000 * sec / steps:6.3f} ms  {sec / total:5.1%}\n")
        w(f"\n## 3. {n}: top functions by cumulative time (ms per step)\n\n")
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])  # type: ignore[attr-defined]
        for (file, line, fn), row in top[:60]:
            short = file.split("site-packages/", 1)[-1].split("/src/", 1)[-1]
            w(f"  {1000 * row[3] / steps:7.3f}  {row[0] / steps:6.1f}x  {short}:{line}:{fn}\n")
        w("\n")
    text = out.getvalue()
    with open(args.out, "w") as fh:
        fh.write(text)
    c.log(text[:3000])
    c.log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
