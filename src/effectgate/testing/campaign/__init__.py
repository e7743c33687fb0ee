"""The kill campaign: effectgate, plain LangGraph and effect-ledger on the same workflow.

Each trial runs the incident workflow (get_error_rate -> create_ticket ->
send_email + write_file) in a fresh state directory with fresh demo
services, kills worker processes (SIGKILL at random moments, or at named
seams), starts new ones until the thread is done, and then counts, in the
external systems' own storage, duplicates, lost actions, operations left
unknown and invalid histories. ``benchmarks/campaign.py`` is the command
line; ``docs/campaign.md`` the method.

Example::

    specs = plan_trials([System.EFFECTGATE, System.BASELINE], 8)
    results = run_campaign(specs, tmp_path, jobs=2)
    print(render_markdown(summarize(results), {"trials_per_system": 8}))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from effectgate.testing.campaign._harness import (
    EFFECTGATE_SEAMS,
    FAULT_KINDS,
    PLAIN_SEAMS,
    SCENARIOS,
    TrialResult,
    TrialSpec,
    plan_trials,
    run_trial,
)
from effectgate.testing.campaign._report import render_markdown, summarize
from effectgate.testing.campaign._systems import System

__all__ = [
    "EFFECTGATE_SEAMS",
    "FAULT_KINDS",
    "PLAIN_SEAMS",
    "SCENARIOS",
    "System",
    "TrialResult",
    "TrialSpec",
    "plan_trials",
    "render_markdown",
    "run_campaign",
    "run_trial",
    "summarize",
]


def run_campaign(
    specs: Sequence[TrialSpec],
    workdir: Path,
    *,
    jobs: int = 1,
    fork_server: bool = True,
    keep: bool = False,
    on_result: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Run every trial, ``jobs`` at a time, each in its own directory under ``workdir``.

    Trials share nothing (own state directory, own services on their own
    ports; an ``effectgate-pg-faults`` trial has a private cluster to itself
    while it runs, reused by a later trial with a fresh schema), so running
    several at once changes timing only.

    Args:
        specs: the trials, e.g. from ``plan_trials``.
        workdir: where trial directories are created (and removed unless ``keep``).
        jobs: trials run concurrently (threads that wait on worker processes).
        fork_server: fork workers from one pre-imported server process (about
            2 s faster per worker); False: start each as ``python -m ...``.
        keep: keep every trial's state directory for inspection.
        on_result: called with each finished trial (progress output).

    Returns:
        The results in the order of ``specs``.
    """
    from effectgate.testing.campaign._pgworkers import ClusterPool
    from effectgate.testing.campaign._worker import PRELOAD
    from effectgate.testing.forkserver import ForkServer

    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(ForkServer(PRELOAD)) if fork_server else None
        # effectgate-pg-faults: one private cluster per trial running at once, reused.
        clusters = stack.enter_context(ClusterPool())

        def one(spec: TrialSpec) -> TrialResult:
            result = run_trial(spec, workdir, server=server, keep=keep, clusters=clusters)
            if on_result is not None:
                on_result(result)
            return result

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, specs))
