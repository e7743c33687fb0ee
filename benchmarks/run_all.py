"""Run the whole benchmark suite and write results/*.json and results/summary.md.

    python benchmarks/run_all.py            # the full suite, about 10 minutes on 2 cores
    python benchmarks/run_all.py --quick    # tiny sizes: checks that everything runs
                                            # (skips bench_ledger.py, which has no quick mode)

Each benchmark runs in its own process (so no patch or import state leaks
from one to the next), in this order: floor, side_effect, storage (leaves the
long threads for resume), resume, restart, concurrency, async, storage_large
(200 KiB tool results), answers (the answer protocol's own cost), postgres
(needs the PostgreSQL server of ``EFFECTGATE_TEST_POSTGRES``, default the local
one), recovery, ledger. All
scratch files go to one work directory on the same disk (``--work-dir``,
default a new directory under the system temp dir), removed at the end unless
``--keep-work``. ``make bench`` runs the full suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as c

BENCHES = [
    "floor",
    "side_effect",
    "storage",
    "resume",
    "restart",
    "concurrency",
    "async",
    "storage_large",
    "answers",
    "postgres",
    "recovery",
    "ledger",
]


def _command(name: str, quick: bool, work: Path) -> list[str]:
    script = str(c.BENCH_DIR / f"bench_{name}.py")
    if name != "ledger":
        return [sys.executable, script]
    # bench_ledger.py has its own flags; it writes results/ledger.json itself.
    ledger_dir = work / "ledger"
    ledger_dir.mkdir(parents=True, exist_ok=True)
    sizes = ["--rounds", "3", "--per-round", "10"] if quick else ["--rounds", "8", "--with-1m"]
    return [sys.executable, script, *sizes, "--dir", str(ledger_dir)]


def run_benches(names: list[str], quick: bool, work: Path) -> dict[str, Any]:
    """Run each benchmark in a child process; return their exit codes and durations."""
    env = dict(os.environ, **{c.WORK_ENV: str(work), c.QUICK_ENV: "1" if quick else "0"})
    runs: dict[str, Any] = {}
    for name in names:
        cmd = _command(name, quick, work)
        # A failed benchmark must leave no stale result for the summary to quote.
        (c.RESULTS_DIR / f"{name}.json").unlink(missing_ok=True)
        c.log(f"== {name}: {shlex.join(cmd[1:])}")
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=c.BENCH_DIR, check=False)
        runs[name] = {"exit": done.returncode, "seconds": round(time.perf_counter() - t0, 1)}
        c.log(f"== {name}: exit {done.returncode} in {runs[name]['seconds']} s")
    return runs


# ----------------------------------------------------------------------- summary.md


def _load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _f(s: dict[str, Any] | None, unit: str = "", digits: int = 2) -> str:
    """``median (min-max)`` of a spread, or a dash."""
    if not s or s.get("median") is None:
        return "-"
    m, lo, hi = (s[k] for k in ("median", "min", "max"))
    return f"{m:.{digits}f}{unit} ({lo:.{digits}f}-{hi:.{digits}f})"


def _verdict(value: float | None, bound: float) -> str:
    if value is None:
        return "not measured"
    return "**met**" if value <= bound else "**NOT met**"


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(x) for x in cells) + " |"


def _target_time_commits(se: dict[str, Any]) -> list[str]:
    r = se["results"]
    ratio = r["ratio_vs_baseline"]["effectgate"]
    eg, base = r["commits_per_effect"]["effectgate"], r["commits_per_effect"]["baseline"]
    cpu = (r.get("cpu_pair_ratio_vs_baseline") or {}).get("effectgate")
    cpu_ms = r.get("cpu_ms_per_effect") or {}
    cpu_rows = []
    if cpu:
        cpu_rows.append(
            _row(
                "CPU time (this process, all threads) per approved side effect / baseline "
                "(SQLite, sync; median of paired step ratios)",
                "<= 0.80x", f"{_f(cpu, 'x')}; {_f(cpu_ms.get('effectgate'), ' ms')}",
                _verdict(cpu["median"], 0.80), _f(cpu_ms.get("baseline"), " ms"),
            )
        )  # fmt: skip
    return [
        _row(
            "time per approved side effect / baseline (SQLite, sync)", "<= 0.90x", _f(ratio, "x"),
            _verdict(ratio["median"], 0.90), "1.00x",
        ),
        *cpu_rows,
        _row(
            "durable (fsync'd) commits per side effect", "<= 8",
            f"{eg['durable']:g} ({eg['all']:g} commits in all)", _verdict(eg["durable"], 8),
            f"{base['durable']:g}",
        ),
    ]  # fmt: skip


def _target_async(doc: dict[str, Any]) -> list[str]:
    # bench_async reports side effects per second; time per effect is its inverse.
    rate = doc["results"]["ratio_effectgate_over_baseline"]
    time_ratio = {
        "median": 1 / rate["median"], "min": 1 / rate["max"], "max": 1 / rate["min"],
    }  # fmt: skip
    return [
        _row(
            "time per approved side effect / baseline (async, "
            f"{doc['params']['threads']} threads at once)",
            "<= 1.00x",
            _f(time_ratio, "x"),
            _verdict(time_ratio["median"], 1.00),
            "1.00x",
        )
    ]


def _target_postgres(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    ratio = (r.get("ratio_effectgate_over_langgraph_time_per_effect") or {}).get("1")
    if ratio is None:
        return []
    when = f"{doc.get('when', '?')[:10]}, commit {doc['machine'].get('commit')}"
    if not isinstance(ratio, dict):  # a ratio of the rounds' medians
        ratio = {"median": float(ratio)}
    text = _f(ratio, "x") if "min" in ratio else f"{ratio['median']:.2f}x (of medians)"
    return [
        _row(
            "time per approved side effect / LangGraph + PostgresSaver (one worker; "
            f"bench_postgres.py, {when}, load {doc['machine'].get('load_avg_1m')})",
            "<= 1.00x",
            text,
            _verdict(ratio["median"], 1.00),
            "1.00x",
        ),
        *_target_postgres_scaling(doc),
    ]


def _target_postgres_scaling(doc: dict[str, Any]) -> list[str]:
    """4 workers / 1 on PostgreSQL, with the ceiling this machine's cores put on it.

    One worker already keeps a share ``b`` of all cores busy (its client and
    the PostgreSQL backends serving it, ``machine_busy`` from /proc/stat), so
    N workers can do at most ``1 / b`` times its side effects per second
    however little they wait on each other.
    """
    r = doc["results"]
    scaling = (r.get("scaling_over_one_worker") or {}).get("effectgate_pg", {}).get("4")
    busy = (((r.get("cost") or {}).get("effectgate_pg") or {}).get("1") or {}).get("machine_busy")
    if scaling is None:
        return []
    when = f"{doc.get('when', '?')[:10]}, commit {doc['machine'].get('commit')}"
    lg = (r.get("scaling_over_one_worker") or {}).get("langgraph_pg", {}).get("4")
    verdict = "**met**" if scaling >= 3.0 else "**NOT met**"
    ceiling = ""
    if busy and busy.get("median"):
        b = busy["median"]
        ceiling = (
            f"; one worker keeps {b:.0%} of the {doc['machine'].get('cpus')} cores busy, "
            f"so no number of workers can exceed {1 / b:.2f}x here"
        )
        if 1 / b < 3.0:
            verdict += " (out of reach on this machine)"
    return [
        _row(
            f"side effects per second, 4 workers / 1 on PostgreSQL (bench_postgres.py, {when}"
            f"{ceiling})",
            ">= 3x", f"{scaling:.2f}x", verdict, "-" if lg is None else f"{lg:.2f}x",
        )
    ]  # fmt: skip


def _target_postgres_paired(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]["ratio_effectgate_over_langgraph"]
    when = f"{doc.get('when', '?')[:10]}, commit {doc['machine'].get('commit')}"
    load = doc["results"].get("load_1m_after", doc["machine"].get("load_avg_1m"))
    where = (
        f"one thread each, {doc['params']['pairs']} effects long, alternating in one process; "
        f"bench_postgres.py --paired, {when}, load {load}"
    )
    rows = [
        _row(
            f"time per approved side effect / LangGraph + PostgresSaver ({where})",
            "<= 1.00x", _f(r["wall"], "x"), _verdict(r["wall"]["median"], 1.00), "1.00x",
        ),
        _row(
            f"CPU time (this process) per approved side effect / LangGraph + PostgresSaver "
            f"({where}; median of paired ratios)",
            "<= 0.80x", _f(r["cpu"], "x"), _verdict(r["cpu"]["median"], 0.80), "1.00x",
        ),
    ]  # fmt: skip
    floor = doc["results"].get("ratio_floor_over_langgraph")
    if floor:
        ms = doc["results"]["protocol_floor"]["wall_ms"]
        rows.append(
            _row(
                "the protocol floor (review + claim + result, one round trip each, raw "
                "psycopg) / LangGraph + PostgresSaver per effect (same pairs)",
                "reported", f"{_f(floor['wall'], 'x')}; {_f(ms, ' ms')}", "reported", "-",
            )
        )  # fmt: skip
    return rows


ROUND_TRIP_FLOOR = 3
"""Round trips one approved side effect cannot do without on PostgreSQL (``ProtocolFloor``)."""


def _target_postgres_roundtrips(doc: dict[str, Any]) -> list[str]:
    """PostgreSQL round trips per side effect against the protocol's floor (3), bound 2x it."""
    r = doc["results"]
    eg, lg = r.get("effectgate_pg"), r.get("langgraph_pg")
    if not eg:
        return []
    when = (
        f"{doc.get('when', '?')[:10]}, commit {doc['machine'].get('commit')}, "
        f"load {doc['machine'].get('load_avg_1m')}"
    )
    n = eg["round_trips_per_effect"]
    return [
        _row(
            f"PostgreSQL round trips per approved side effect (bench_postgres.py --count, {when}; "
            f"{eg['statements_per_effect']:g} statements); the floor is {ROUND_TRIP_FLOOR} "
            "(review + claim + result, one round trip each)",
            f"<= {2 * ROUND_TRIP_FLOOR} (2x the floor)",
            f"{n:g} ({n / ROUND_TRIP_FLOOR:.2f}x the floor)",
            _verdict(n, 2 * ROUND_TRIP_FLOOR),
            "-" if not lg else f"{lg['round_trips_per_effect']:g} (LangGraph + PostgresSaver)",
        )
    ]


def _target_restart(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    eg, base = r["effectgate"], r["baseline"]
    rec = r.get("recover_ratio") or {
        "median": eg["recover_to_effect_ms"]["median"] / base["recover_to_effect_ms"]["median"],
        "min": None,
    }
    rec_text = _f(rec, "x") if rec.get("min") is not None else f"{rec['median']:.2f}x (medians)"
    total = r["effectgate_over_baseline"]
    return [
        _row(
            "restart after a kill: recovery -> first effect / baseline's",
            "<= 1.5x", f"{rec_text}; {_f(eg['recover_to_effect_ms'], ' ms', 1)}",
            _verdict(rec["median"], 1.5), _f(base["recover_to_effect_ms"], " ms", 1),
        ),
        _row(
            "restart after a kill: process start -> first effect / baseline's", "<= 1.05x",
            f"{_f(total, 'x')}; {_f(eg['total_ms'], ' ms', 0)}", _verdict(total["median"], 1.05),
            _f(base["total_ms"], " ms", 0),
        ),
    ]  # fmt: skip


def _target_open_resume(rs: dict[str, Any]) -> list[str]:
    r = rs["results"]
    out = []
    for n in rs["params"]["sizes"]:
        ratio = r.get(f"effectgate_over_baseline_at_{n}")
        if ratio is None:
            continue
        out.append(
            _row(
                f"open + resume at review after {n} call(s) / baseline",
                "<= 1.10x",
                _f(ratio, "x"),
                _verdict(ratio["median"], 1.10),
                "1.00x",
            )
        )
    return out


def _target_answers(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    checks, nothing = r["checks"], r["answers_that_run_nothing"]
    return [
        _row(
            "answer protocol's checks (binding, read-back of recorded decisions) per review",
            "reported", f"{_f(checks['checks_ms_per_review'], ' ms', 3)}, "
            f"{_f(checks['checks_share_of_step'], '', 3)} of the step", "reported", "-",
        ),
        _row(
            "an answer repeated / refused (refusal written to the ledger), per call",
            "reported", f"{_f(nothing['repeat'], ' ms')} / {_f(nothing['refusal'], ' ms')}",
            "reported", "-",
        ),
    ]  # fmt: skip


def _target_storage(st: dict[str, Any]) -> list[str]:
    g = st["results"]["effectgate"]["total_kib_per_call"]
    b = st["results"]["baseline"]["total_kib_per_call"]
    size = st["params"].get("result_kib")
    kind = f"{size} KiB tool results" if size else "small messages"
    return [
        _row(
            f"storage growth per call, last 1/4 / first 1/4 of {st['params']['calls']} calls "
            f"({kind})",
            "<= 1.5x", f"{g['ratio']}x ({g['first_quarter']} -> {g['last_quarter']} KiB)",
            _verdict(g["ratio"], 1.5), f"{b['ratio']}x",
        )
    ]  # fmt: skip


def _target_resume(rs: dict[str, Any]) -> list[str]:
    hi = rs["params"]["sizes"][1]
    key = f"ratio_{hi}_over_1"
    e, b = rs["results"]["effectgate"][key], rs["results"]["baseline"][key]
    return [
        _row(
            f"resume at review after {hi} vs 1 calls (open + resume)", "<= 3x", _f(e, "x"),
            _verdict(e["median"], 3), _f(b, "x"),
        )
    ]  # fmt: skip


def _target_ledger(lg: dict[str, Any]) -> list[str]:
    scale = {s["rows"]: s for s in lg.get("scale", [])}
    if 1000 not in scale or len(scale) < 2:
        return []
    top = max(scale)
    get = scale[top]["get_us"]["median"] / scale[1000]["get_us"]["median"]
    rec_top = scale[top]["recover_in_flight_ms"]["median"]
    rec = rec_top / scale[1000]["recover_in_flight_ms"]["median"]
    label = f"{top // 1000}k" if top < 1_000_000 else f"{top // 1_000_000}M"
    # Sizes one after the other, each right after its file was built: drift
    # between them shows as growth (benchmarks/README.md, 5). The target is
    # judged on the interleaved rows of bench_recovery.py above.
    seq = "sequential: indicative only, see the interleaved row"
    return [
        _row(
            f"bench_ledger.py: recover_in_flight, {label} / 1k rows (medians, sequential)",
            "<= 1.5x", f"{rec:.2f}x", seq, "-",
        ),
        _row(
            f"bench_ledger.py: get by id, {label} / 1k rows (medians, sequential)", "<= 3x",
            f"{get:.2f}x", seq, "-",
        ),
    ]  # fmt: skip


def _target_recovery(rc: dict[str, Any]) -> list[str]:
    lo, hi = rc["params"]["sizes"]
    label = f"{hi // 1000}k" if hi < 1_000_000 else f"{hi // 1_000_000}M"
    r = rc["results"]
    scan = r[f"scan_ms_ratio_{hi}_over_{lo}"]
    rec = r[f"recover_ms_ratio_{hi}_over_{lo}"]
    get = r[f"get_us_ratio_{hi}_over_{lo}"]
    return [
        _row(
            f"ledger recovery scan, {label} / 1k operations (interleaved, paired)", "<= 1.5x",
            f"{_f(scan, 'x')}; with its writes: {_f(rec, 'x')}", _verdict(scan["median"], 1.5),
            "-",
        ),
        _row(
            f"ledger get by id, {label} / 1k operations (interleaved, paired)", "<= 3x",
            _f(get, "x"), _verdict(get["median"], 3), "-",
        ),
    ]  # fmt: skip


def _targets(docs: dict[str, Any]) -> list[str]:
    """The targets safety must meet at no cost, each with its verdict (or "not measured")."""
    rows = [
        "| target | bound | effectgate, median (min-max) | verdict | baseline |",
        "|---|---|---|---|---|",
    ]
    parts = [
        ("side_effect", _target_time_commits),
        ("async", _target_async),
        ("postgres", _target_postgres),
        ("postgres_paired", _target_postgres_paired),
        ("postgres_paired_long", _target_postgres_paired),
        ("postgres_roundtrips", _target_postgres_roundtrips),
        ("resume", _target_open_resume),
        ("restart", _target_restart),
        ("storage", _target_storage),
        ("storage_large", _target_storage),
        ("answers", _target_answers),
    ]
    for name, part in parts:
        if docs.get(name):
            rows += part(docs[name])
        else:
            rows.append(_row(f"({name}: no results/{name}.json)", "-", "-", "not measured", "-"))
    return rows


def _earlier_targets(docs: dict[str, Any]) -> list[str]:
    """Scaling targets set before (still checked on every run)."""
    rows = [
        "| target | bound | effectgate, median (min-max) | verdict | baseline |",
        "|---|---|---|---|---|",
    ]
    if docs.get("resume"):
        rows += _target_resume(docs["resume"])
    if docs.get("recovery"):
        rows += _target_recovery(docs["recovery"])
    if docs.get("ledger"):
        rows += _target_ledger(docs["ledger"])
    return rows


def _floor_ms(docs: dict[str, Any]) -> float | None:
    fl = docs.get("floor")
    return None if not fl else float(fl["results"]["us_per_commit"]["wal_full"]["median"]) / 1e3


def _per_effect(docs: dict[str, Any], name: str) -> list[str]:
    doc = docs.get(name)
    if not doc:
        return []
    r, floor = doc["results"], _floor_ms(docs)
    fs = r.get("fsyncs_per_effect") or {}
    out = [
        "| variant | ms per side effect | / floor commit | ratio to baseline (per repeat) "
        "| paired step ratio | durable commits (ckpt + ledger) | NORMAL | empty "
        "| fsyncs (strace) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, ms in r["ms_per_effect"].items():
        cm = r["commits_per_effect"][v]
        files = cm["by_file"]
        dur = " + ".join(
            f"{files[f]['durable']:g}" for f in ("checkpoints", "ledger") if f in files
        )
        out.append(
            _row(
                v, _f(ms), f"{ms['median'] / floor:.1f}x" if floor else "-",
                _f(r["ratio_vs_baseline"][v], "x"), _f(r["pair_ratio_vs_baseline"][v], "x"),
                f"{cm['durable']:g} ({dur})", f"{sum(k['normal'] for k in files.values()):g}",
                f"{sum(k['empty'] for k in files.values()):g}", fs.get(v, "-"),
            )
        )  # fmt: skip
    return out


def _floor(docs: dict[str, Any]) -> list[str]:
    fl = docs.get("floor")
    if not fl:
        return []
    r = fl["results"]
    out = ["| mode | commits/s | us per commit |", "|---|---|---|"]
    for mode in r["commits_per_s"]:
        out.append(
            _row(mode, _f(r["commits_per_s"][mode], "", 0), _f(r["us_per_commit"][mode], "", 0))
        )
    return out


def _storage(doc: dict[str, Any] | None, names: list[str]) -> list[str]:
    if not doc:
        return []
    r = doc["results"]
    out = [
        "| system | total KiB/call first 1/4 -> last 1/4 (ratio) | checkpoints | ledger "
        "| LangGraph payload | ms/call first 1/4 -> last 1/4 | final size MiB (ckpt + ledger) |",
        "|---|---|---|---|---|---|---|",
    ]

    def q(d: dict[str, Any]) -> str:
        ratio = "-" if d["ratio"] is None else f"{d['ratio']}x"
        return f"{d['first_quarter']} -> {d['last_quarter']} ({ratio})"

    for n in names:
        s = r[n]
        fin = s["final_mib"]
        out.append(
            _row(
                n, q(s["total_kib_per_call"]), q(s["checkpoints_kib_per_call"]),
                q(s["ledger_kib_per_call"]), q(s["payload_kib_per_call"]), q(s["ms_per_call"]),
                f"{fin['checkpoints']} + {fin['ledger']}",
            )
        )  # fmt: skip
    return out


def _resume(doc: dict[str, Any] | None) -> list[str]:
    if not doc:
        return []
    r, sizes = doc["results"], doc["params"]["sizes"]
    names = [k for k in r if isinstance(r[k], dict) and "open_ms" in r[k]]
    out = [
        "| system | calls before | open ms | resume ms | open + resume ms |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        for size in sizes:
            k = str(size)
            out.append(
                _row(
                    n, size, _f(r[n]["open_ms"][k]), _f(r[n]["resume_ms"][k]),
                    _f(r[n]["open_plus_resume_ms"][k]),
                )
            )  # fmt: skip
    for key, value in r.items():
        if "_over_" in key:
            out.append(f"\n`{key}`: {_f(value, 'x')}")
    return out


def _restart(doc: dict[str, Any] | None) -> list[str]:
    if not doc:
        return []
    r = doc["results"]
    out = [
        "| system | spawn -> first effect ms | interpreter | imports + open | recovery -> effect |",
        "|---|---|---|---|---|",
    ]
    for n in ("baseline", "effectgate"):
        s = r[n]
        out.append(
            _row(
                n, _f(s["total_ms"], "", 0), _f(s["interpreter_ms"], "", 0),
                _f(s["imports_and_open_ms"], "", 0), _f(s["recover_to_effect_ms"], "", 1),
            )
        )  # fmt: skip
    out.append(f"\neffectgate / baseline, paired: {_f(r['effectgate_over_baseline'], 'x')}")
    return out


def _concurrency(doc: dict[str, Any] | None) -> list[str]:
    if not doc:
        return []
    r = doc["results"]
    out = [
        "| system | workers | side effects/s | lock wait p50 / p99 / max ms (checkpoints) "
        "| lock wait p50 / p99 / max ms (ledger) |",
        "|---|---|---|---|---|",
    ]

    def w(d: dict[str, Any] | None) -> str:
        if not d or not d["n"]:
            return "-"
        return f"{d['p50_ms']} / {d['p99_ms']} / {d['max_ms']} (n={d['n']})"

    for n, by_workers in r.items():
        for workers, s in by_workers.items():
            lw = s["lock_wait"]
            out.append(
                _row(
                    n, workers, _f(s["effects_per_s"], "", 1), w(lw.get("checkpoints")),
                    w(lw.get("ledger")),
                )
            )  # fmt: skip
    return out


def _recovery(doc: dict[str, Any] | None) -> list[str]:
    if not doc:
        return []
    r, sizes = doc["results"], doc["params"]["sizes"]
    out = ["| operations | scan ms | recover_in_flight ms | get by id us |", "|---|---|---|---|"]
    for n in sizes:
        k = str(n)
        out.append(
            _row(f"{n:,}", _f(r["scan_ms"][k], "", 3), _f(r["recover_ms"][k]), _f(r["get_us"][k]))
        )
    return out


def _ledger(doc: dict[str, Any] | None) -> list[str]:
    if not doc:
        return []
    p = doc["paths"]
    out = [
        "| ledger path (bench_ledger.py) | median (min-max over rounds) |",
        "|---|---|",
        _row("raw durable commit (WAL, FULL)", _f(p["floor_commit_ms"], " ms")),
        _row("open + review + claim + result", _f(p["full_path_ms"], " ms")),
        _row("dispatch path (claim + result)", _f(p["dispatch_path_ms"], " ms")),
        _row("dispatch path / raw commit, paired", _f(p["dispatch_path_ratio"], "x")),
        "",
        "| rows | file MB | get by id, us | recover_in_flight (10 in flight), ms |",
        "|---|---|---|---|",
    ]
    for s in doc["scale"]:
        out.append(
            _row(f"{s['rows']:,}", s["file_mb"], _f(s["get_us"]), _f(s["recover_in_flight_ms"]))
        )
    return out


def _checks(docs: dict[str, Any]) -> list[str]:
    st = docs.get("storage")
    checks = st["results"].get("effectgate_checks") if st else None
    if not checks:
        return []
    calls = st["params"]["calls"] if st else "?"
    return [
        f"The {calls}-call effectgate thread read back after reopening (bench_storage.py): "
        + json.dumps(checks, sort_keys=True)
    ]


def render(results: Path, meta: dict[str, Any]) -> str:
    """The Markdown summary of whatever results/*.json exist."""
    names = [b for b in BENCHES if b != "ledger"]
    extra = ["ledger", "postgres_paired", "postgres_paired_long", "postgres_roundtrips"]
    docs: dict[str, Any] = {n: _load(results, n) for n in [*names, *extra]}
    sections = [
        ("Targets", _targets(docs)),
        ("Earlier targets (scaling)", _earlier_targets(docs)),
        ("Per approved side effect", _per_effect(docs, "side_effect")),
        ("Raw floor: durable SQLite commits on this disk", _floor(docs)),
        ("Storage over one long thread", _storage(docs.get("storage"), ["baseline", "effectgate"])),
        (
            "Storage over one long thread, 200 KiB tool results",
            _storage(docs.get("storage_large"), ["baseline", "effectgate"]),
        ),
        ("Resume a thread paused at review", _resume(docs.get("resume"))),
        ("Restart after a kill: process start to first effect", _restart(docs.get("restart"))),
        (
            "Worker processes on distinct threads, one state dir",
            _concurrency(docs.get("concurrency")),
        ),
        ("Ledger scaling, sizes interleaved (bench_recovery.py)", _recovery(docs.get("recovery"))),
        ("Ledger scaling (bench_ledger.py)", _ledger(docs.get("ledger"))),
        ("Checks", _checks(docs)),
    ]
    body: list[str] = []
    for title, lines in sections:
        if lines:
            body += ["", f"## {title}", "", *lines]
    return "\n".join(_head(meta) + body) + "\n"


def _head(meta: dict[str, Any]) -> list[str]:
    m = meta["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return [
        "# effectgate benchmarks: latest results",
        "",
        f"Command: `{meta['command']}` ({meta['seconds']} s). Machine: {m['cpus']} x {m['cpu']}, "
        f"load average {m['load_avg_1m']} at the end, Python {m['python']}, SQLite {m['sqlite']}, "
        f"{m['platform']}; {versions}; commit {m['commit']}.",
        "",
        "Medians with min-max over repeats; ratios are paired (both systems in the same repeat, "
        "taking turns step by step). Same offline scripted model, same no-op tool, same disk. "
        "benchmarks/README.md explains the method and the diagnosis.",
        *(
            f"Rerun since, alone: {', '.join(r['only'])} (commit {r['machine']['commit']}, "
            f"{r['seconds']} s, load average {r['machine'].get('load_avg_1m')} at its end); "
            "a row naming a date and commit is from that run."
            for r in meta.get("partial_runs", [])
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--only", nargs="+", choices=BENCHES, help="run only these")
    parser.add_argument("--work-dir", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument("--keep-work", action="store_true", help="keep the scratch files")
    parser.add_argument(
        "--summary-only", action="store_true", help="rewrite summary.md from existing JSON"
    )
    args = parser.parse_args()
    # bench_ledger.py always writes benchmarks/results/ledger.json and has no small
    # scale sizes, so a quick run leaves it out unless asked for by name.
    names = args.only or [b for b in BENCHES if not (args.quick and b == "ledger")]
    started = time.perf_counter()
    runs: dict[str, Any] = {}
    if not args.summary_only:
        work = args.work_dir or Path(tempfile.mkdtemp(prefix="effectgate-bench-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            runs = run_benches(names, args.quick, work)
        finally:
            if not args.keep_work:
                shutil.rmtree(work, ignore_errors=True)
    total = round(time.perf_counter() - started, 1)
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    meta = {"command": command, "seconds": total, "runs": runs, "machine": c.machine_info()}
    previous = _load(c.RESULTS_DIR, "run")
    if previous and (args.summary_only or args.only):
        # The header describes the last full run; a partial run's rows name
        # their own date and commit, and the partial run is listed below it.
        if runs:
            previous.setdefault("partial_runs", []).append(
                {"only": names, "seconds": total, "runs": runs, "machine": meta["machine"]}
            )
            previous["runs"].update(runs)
        meta = previous
    if runs:
        c.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (c.RESULTS_DIR / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    summary = render(c.RESULTS_DIR, meta)
    (c.RESULTS_DIR / "summary.md").write_text(summary)
    c.log(f"wrote {c.RESULTS_DIR / 'summary.md'} ({total} s in total)")
    failed = [n for n, r in runs.items() if r["exit"] != 0]
    if failed:
        c.log(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
