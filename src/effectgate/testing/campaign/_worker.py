"""One campaign worker process: import everything, say READY, then run one system's thread.

``python -m effectgate.testing.campaign._worker --system S --state-dir D --thread T``
prints ``{"event": "ready"}`` once the heavy imports are done (so the
harness's random kill lands in the run, not in the interpreter start-up),
optionally waits for a go-file (three processes starting one thread at
once), runs, and prints one JSON summary line. For effectgate with the
default deterministic model it runs ``effectgate.testing.worker.main``
itself, i.e. exactly ``python -m effectgate.testing.worker``.

Exit codes: 0 done, 3 held for a human, 5 not finished, 75 busy, 137 killed
at a failpoint or seam.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from effectgate.testing.campaign._systems import DriveOptions, System, drive
from effectgate.testing.forkserver import DEFAULT_PRELOAD

__all__ = ["PRELOAD", "main"]

_GO_TIMEOUT_S = 60.0
_GO_POLL_S = 0.002


#: What a campaign worker imports before READY (and its fork server before it forks).
PRELOAD: tuple[str, ...] = (
    *DEFAULT_PRELOAD,
    "effectgate.testing.campaign._tools",
    "effectgate.testing.campaign._worker",
)


def import_everything() -> None:
    """Pay every import before READY; they take most of a worker's lifetime."""
    for name in PRELOAD:
        importlib.import_module(name)


def _wait_for(go_file: Path) -> None:
    deadline = time.monotonic() + _GO_TIMEOUT_S
    while not go_file.exists() and time.monotonic() < deadline:
        time.sleep(_GO_POLL_S)


def _pg_role(role: str, state_dir: Path, lease_ttl_s: float) -> int:
    """``effectgate worker`` itself (its command line, in this process), or a reviewer.

    The ``person`` is the reviewer who also gives reconciliation verdicts.
    """
    if role in ("reviewer", "person"):
        from effectgate.testing.campaign._reviewer import review_until_settled

        return review_until_settled(state_dir, lease_ttl_s, verdicts=role == "person")
    from effectgate.cli import main as cli

    try:
        cli(["worker", "--state-dir", str(state_dir), "--json", "--lease-ttl", str(lease_ttl_s)])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, say READY, run; see the module docstring for exit codes."""
    parser = argparse.ArgumentParser(prog="python -m effectgate.testing.campaign._worker")
    parser.add_argument("--system", choices=[s.value for s in System], required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--fresh-ids", action="store_true")
    parser.add_argument("--fork", action="store_true")
    parser.add_argument("--kill-after-result", action="store_true")
    parser.add_argument("--go-file", type=Path)
    parser.add_argument("--role", choices=["worker", "reviewer", "person"], default="worker")
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    args = parser.parse_args(argv)
    import_everything()
    print(json.dumps({"event": "ready"}), flush=True)
    if args.go_file is not None:
        _wait_for(args.go_file)
    system = System(args.system)
    if system in (System.PG_WORKERS, System.PG_FAULTS):
        return _pg_role(args.role, args.state_dir, args.lease_ttl)
    if system is System.EFFECTGATE and not (args.fresh_ids or args.fork):
        from effectgate.testing import worker

        return worker.main(["--state-dir", str(args.state_dir), "--thread", args.thread])
    options = DriveOptions(
        state_dir=args.state_dir,
        thread_id=args.thread,
        fresh_ids=args.fresh_ids,
        fork=args.fork,
        kill_after_result=args.kill_after_result,
    )
    code, summary = drive(system, options)
    print(json.dumps(summary, default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
