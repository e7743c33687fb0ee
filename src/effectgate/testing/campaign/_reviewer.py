"""The reviewer process of a PostgreSQL workers trial: answer every review until settled.

It runs in its own process beside the ``effectgate worker`` processes
(``_pgworkers``), started by ``_worker --role reviewer``; it imports no part
of the harness, so the worker entry point reaches it without the harness.
"""

from __future__ import annotations

import time
from pathlib import Path

from effectgate._app import StateDir
from effectgate.testing.campaign._systems import EXIT_DONE, EXIT_HELD

__all__ = ["LEASE_TTL_S", "review_until_settled"]

LEASE_TTL_S = 2.0
"""``--lease-ttl`` of every worker and the reviewer, in seconds (a dead holder on this
host is taken over at once; the TTL matters only when its death cannot be proven)."""
_REVIEW_TIMEOUT_S = 150.0
_REVIEW_POLL_S = 0.05


def review_until_settled(state_dir: Path, lease_ttl_s: float = LEASE_TTL_S) -> int:
    """The reviewer process: answer every pending review until every thread is settled.

    Each answer is bound to the interrupt it answers (``answers={interrupt_id:
    ...}``) and approves every call: each thread is meant to mail the on-call
    engineer, so the ``possible_duplicate_of`` flag that names another
    thread's identical mail is expected here (the external systems' own
    records judge duplicates, not the reviewer). Answering
    runs the thread on in this process, under its lease, as ``effectgate
    resume`` does; a thread another process holds is looked at again later.

    Args:
        state_dir: the trial's state directory (bound to its PostgreSQL store).
        lease_ttl_s: the reviewer's thread lease, in seconds.

    Returns:
        0 every thread done; 3 none left to run but some wait for a person
        (reconciliation); 5 not settled within the timeout.
    """
    from effectgate._app import open_agent
    from effectgate._queue import Readiness, readiness
    from effectgate.cli._workers import report_line
    from effectgate.errors import ThreadBusyError
    from effectgate.testing.campaign._systems import EXIT_UNFINISHED, _endpoints

    sd = StateDir.open(state_dir)
    deadline = time.monotonic() + _REVIEW_TIMEOUT_S
    with open_agent(sd, endpoints=_endpoints(sd), lease_ttl_s=lease_ttl_s) as agent:
        while time.monotonic() < deadline:
            done = held = 0
            threads = [r.thread_id for r in agent.ledger.list_threads()]
            for thread_id in threads:
                if readiness(agent, thread_id) is Readiness.DONE:
                    done += 1
                    continue
                pending = agent.status(thread_id).interrupts
                answers = {
                    p.id: {
                        "decisions": [{"type": "approve"} for _ in p.value["action_requests"]],
                        "reviewer": "campaign",
                    }
                    for p in pending
                    if isinstance(p.value, dict) and p.value.get("type") == "review"
                }
                if pending and not answers:
                    held += 1  # a reconciliation: a person's call, not the reviewer's
                    continue
                if not answers:
                    continue  # new or unfinished: a worker's job
                try:
                    result = agent.resume(thread_id, answers=answers)
                except ThreadBusyError:
                    continue
                report_line({"thread_id": thread_id, "reviewed": len(answers),
                             "status": result.status.value})  # fmt: skip
            if threads and done == len(threads):
                report_line({"status": "done", "threads": done})
                return EXIT_DONE
            if threads and done + held == len(threads):
                report_line({"status": "held", "threads": done, "held": held})
                return EXIT_HELD
            time.sleep(_REVIEW_POLL_S)
    report_line({"status": "unfinished", "error": "not settled in time"})
    return EXIT_UNFINISHED
