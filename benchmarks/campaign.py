"""Kill campaign: effectgate vs plain LangGraph (create_agent + HITL) vs effect-ledger.

Usage (the full campaign, >= 1,000 trials per system)::

    .venv/bin/python benchmarks/campaign.py --trials 1000 \
        --systems effectgate,baseline,effect-ledger \
        --out benchmarks/results/campaign.json

writes ``campaign.json`` (every trial) and ``campaign.md`` (the tables) next
to it. ``--systems effectgate-pg-workers`` runs 4 ``effectgate worker``
processes and a reviewer on PostgreSQL (``EFFECTGATE_TEST_POSTGRES``, default
the local server; a fresh schema per trial). ``--systems effectgate-pg-faults`` runs
them on a private cluster (``initdb``, one per job) behind a TCP proxy and injects
database, network and process faults (``make campaign-pg-faults``). See
docs/campaign.md for the method.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from effectgate.testing.campaign import (
    SCENARIOS,
    System,
    TrialResult,
    plan_trials,
    render_markdown,
    run_campaign,
    summarize,
)

PACKAGES = (
    "effectgate",
    "langgraph",
    "langchain",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "effect-ledger",
)


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _indexes(text: str) -> set[int]:
    """``"535,700-702"`` -> ``{535, 700, 701, 702}``."""
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=1000, help="trials per system (default 1000)")
    p.add_argument("--systems", default="effectgate,baseline,effect-ledger")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/campaign.json"))
    p.add_argument("--md", type=Path, help="Markdown output (default: --out with .md)")
    p.add_argument("--jobs", type=int, default=2, help="trials at once (default 2)")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument(
        "--mix",
        default="kill-random,kill-random,kill-random,kill-random,kill-seam,kill-seam,"
        "concurrent-start,replay-fork",
        help=f"scenario cycle; trial i plays mix[i %% len]; known: {', '.join(SCENARIOS)}",
    )
    p.add_argument("--max-kills", type=int, default=3, help="most SIGKILLs per kill-random trial")
    p.add_argument("--kill-span", type=float, default=0.8, help="kill moment bound after READY, s")
    p.add_argument("--service-delay", type=float, default=0.1, help="per-write service delay, s")
    p.add_argument("--workdir", type=Path, help="trial directories (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep every trial's state directory")
    p.add_argument(
        "--only",
        help="run only these trial indexes of the plan (e.g. 535,685,700-720): a finding's "
        "trials again, with the same seeds",
    )
    p.add_argument(
        "--no-fork-server", action="store_true", help="start each worker as python -m (slower)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    systems = [System(s.strip()) for s in args.systems.split(",") if s.strip()]
    mix = tuple(s.strip() for s in args.mix.split(",") if s.strip())
    specs = plan_trials(
        systems,
        args.trials,
        seed=args.seed,
        mix=mix,
        max_kills=args.max_kills,
        kill_span_s=args.kill_span,
        service_delay_s=args.service_delay,
    )
    if args.only:
        wanted = _indexes(args.only)
        specs = [s for s in specs if s.index in wanted]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="effectgate-campaign-"))
    total, lock, done = len(specs), threading.Lock(), [0]

    started = time.monotonic()
    finished: list[TrialResult] = []

    def write(results: list[TrialResult], *, complete: bool) -> Path:
        """Write the JSON and Markdown of ``results`` (rewritten after every trial)."""
        meta: dict[str, Any] = {
            "command": shlex.join(["python", "benchmarks/campaign.py", *(argv or sys.argv[1:])]),
            "trials_per_system": args.trials,
            "trials_completed": len(results),
            "complete": complete,
            "systems": [s.value for s in systems],
            "mix": list(mix),
            "seed": args.seed,
            "jobs": args.jobs,
            "fork_server": not args.no_fork_server,
            "kill_span_s": args.kill_span,
            "service_delay_s": args.service_delay,
            "max_kills": args.max_kills,
            "elapsed_s": round(time.monotonic() - started, 1),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "versions": versions(),
        }
        summary = summarize(results)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"meta": meta, "summary": summary, "trials": [r.as_dict() for r in results]}
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
        md = args.md or args.out.with_suffix(".md")
        md.write_text(render_markdown(summary, meta))
        return md

    def progress(r: TrialResult) -> None:
        with lock:
            done[0] += 1
            finished.append(r)
            flags = [
                f"dup_t={r.duplicate_tickets}" if r.duplicate_tickets else "",
                f"dup_m={r.duplicate_mails}" if r.duplicate_mails else "",
                f"lost={r.lost_actions}" if r.lost_actions else "",
                f"unknown={r.left_unknown}" if r.left_unknown else "",
                "INVALID-HISTORY" if r.history_problems else "",
                "" if r.finished or r.held else "UNFINISHED",
            ]
            print(
                f"[{done[0]}/{total}] {r.system:<13} {r.scenario:<16} {r.seam or '':<38} "
                f"kills={r.kills} codes={r.exit_codes} {' '.join(f for f in flags if f)}",
                file=sys.stderr,
                flush=True,
            )
            # An interrupted campaign keeps what it measured ("complete": false).
            write(finished, complete=False)

    results = run_campaign(
        specs,
        workdir,
        jobs=args.jobs,
        fork_server=not args.no_fork_server,
        keep=args.keep,
        on_result=progress,
    )
    if args.workdir is None and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    md = write(results, complete=True)
    elapsed = round(time.monotonic() - started, 1)
    print(md.read_text())
    print(f"wrote {args.out} and {md} in {elapsed} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
