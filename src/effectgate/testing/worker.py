"""A worker process that runs one thread to the end, for crash tests and campaigns.

``python -m effectgate.testing.worker --state-dir DIR --thread ID`` opens the
agent on ``DIR`` (services already running; their addresses are read from
``DIR/services/endpoints.json``), starts the thread if it is new or resumes it
otherwise (after ``--go-file`` appears, if given), answers every review with
the chosen decisions, and prints one JSON line with the outcome. ``--api async``
drives the same agent through
``astart``/``aresume``. Killing it (``EFFECTGATE_FAILPOINT`` or SIGKILL)
and starting it again is how tests prove that nothing happens twice.

Exit codes are the CLI's (``effectgate.cli._exit``): 0 done, 3 waiting for
reconciliation, 4 waiting for review, 5 incomplete, 75 thread busy, 137 killed
at a failpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from effectgate._app import StateDir, open_agent
from effectgate.cli._exit import ExitCode, code_for_status
from effectgate.errors import ConfigError, ThreadBusyError

if TYPE_CHECKING:
    from effectgate.graph import Agent, RunResult

__all__ = ["main"]

DEFAULT_TASK = "Check the order service's error rate and handle any incident."


def _endpoints(sd: StateDir) -> Any:
    from effectgate.demo.services import published_endpoints

    return published_endpoints(sd.services)


def _decisions(request: dict[str, Any], mode: str) -> dict[str, Any]:
    kind = "approve" if mode == "all" else "reject"
    return {
        "decisions": [{"type": kind} for _ in request["action_requests"]],
        "reviewer": "worker",
    }


def _caller(agent: Agent, api: str) -> Callable[..., RunResult]:
    """``call("start", ...)``: the agent's sync method, or its async twin run to completion."""

    def call(method: str, *args: Any, **kwargs: Any) -> RunResult:
        if api == "sync":
            return cast("RunResult", getattr(agent, method)(*args, **kwargs))
        return cast("RunResult", asyncio.run(getattr(agent, f"a{method}")(*args, **kwargs)))

    return call


def _wait_for(go_file: Path | None) -> None:
    """Block until ``go_file`` exists (``None``: return at once).

    Lets a test start the process (imports, agent opened: seconds on a busy
    machine) ahead of time and make it run at a moment of its choosing.
    """
    while go_file is not None and not go_file.exists():
        time.sleep(0.02)


def run(args: argparse.Namespace) -> int:
    """Run or resume the thread; return the process exit code."""
    sd = StateDir.open(args.state_dir)
    with open_agent(
        sd,
        model=args.model,
        endpoints=_endpoints(sd),
        store=args.store,
        lease_ttl_s=args.lease_ttl,
    ) as agent:
        call = _caller(agent, args.api)
        _wait_for(args.go_file)
        try:
            result = call("start", args.task, thread_id=args.thread, metadata={"model": args.model})
        except ConfigError:  # the thread exists: continue it
            result = call("resume", args.thread)
        reviews = 0
        while result.status == "waiting_review" and reviews < args.max_reviews:
            reviews += 1
            pending = result.interrupts[0]
            answer = _decisions(dict(pending.value), args.approve)
            result = call("resume", args.thread, answers={pending.id: answer})
        summary = {
            "thread_id": result.thread_id,
            "status": result.status.value,
            "operations": [
                {
                    "operation_id": o.operation_id,
                    "tool": o.tool,
                    "state": o.state.value,
                    "attempt": o.attempt,
                }
                for o in result.operations
            ],
            "error": result.error,
        }
        print(json.dumps(summary), flush=True)
        return int(code_for_status(result.status))


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run; see the module docstring for exit codes."""
    parser = argparse.ArgumentParser(prog="python -m effectgate.testing.worker")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--model", default="scripted:incident")
    parser.add_argument("--task", default=DEFAULT_TASK)
    parser.add_argument("--approve", choices=["all", "none"], default="all")
    parser.add_argument("--max-reviews", type=int, default=20)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: SQLite)")
    parser.add_argument("--api", choices=["sync", "async"], default="sync")
    parser.add_argument(
        "--lease-ttl", type=float, default=30.0, help="seconds a thread lease lasts unrenewed"
    )
    parser.add_argument(
        "--go-file", type=Path, default=None, help="open the agent, then wait for this file"
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ThreadBusyError as exc:
        print(json.dumps({"status": "busy", "error": str(exc)}), flush=True)
        return int(ExitCode.BUSY)


if __name__ == "__main__":
    sys.exit(main())
