"""The reviewer process of a PostgreSQL workers trial: answer every review until settled.

It runs in its own process beside the ``effectgate worker`` processes
(``_pgworkers``), started by ``_worker --role reviewer``; it imports no part
of the harness, so the worker entry point reaches it without the harness.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from effectgate._app import StateDir
from effectgate.testing.campaign._systems import EXIT_DONE, EXIT_HELD

__all__ = ["LEASE_TTL_S", "review_until_settled", "verdict_for"]

LEASE_TTL_S = 2.0
"""``--lease-ttl`` of every worker and the reviewer, in seconds (a dead holder on this
host is taken over at once; the TTL matters only when its death cannot be proven)."""
_REVIEW_TIMEOUT_S = 150.0
_REVIEW_POLL_S = 0.05


def review_until_settled(
    state_dir: Path, lease_ttl_s: float = LEASE_TTL_S, *, verdicts: bool = False
) -> int:
    """The reviewer process: answer every pending review until every thread is settled.

    Each answer is bound to the interrupt it answers (``answers={interrupt_id:
    ...}``) and approves every call: each thread is meant to mail the on-call
    engineer, so the ``possible_duplicate_of`` flag that names another
    thread's identical mail is expected here (the external systems' own
    records judge duplicates, not the reviewer). Answering
    runs the thread on in this process, under its lease, as ``effectgate
    resume`` does; a thread another process holds is looked at again later.
    A database that does not answer within the retry budget
    (``LedgerBusyError``, what ``effectgate resume`` reports as exit 75) is
    tried again at the next look, as a person would run the command again.

    With ``verdicts`` it is also the person who settles reconciliations
    (``verdict_for``). Only for after every other process of the trial has
    ended: a stopped worker's late send could otherwise follow a ``retry``.

    Args:
        state_dir: the trial's state directory (bound to its PostgreSQL store).
        lease_ttl_s: the reviewer's thread lease, in seconds.
        verdicts: answer reconciliations too, from the services' own records.

    Returns:
        0 every thread done; 3 none left to run but some wait for a person
        (reconciliation); 5 not settled within the timeout.
    """
    from effectgate._app import open_agent
    from effectgate.cli._workers import report_line
    from effectgate.errors import LedgerBusyError, ThreadBusyError
    from effectgate.testing.campaign._systems import EXIT_UNFINISHED, _endpoints

    sd = StateDir.open(state_dir)
    deadline = time.monotonic() + _REVIEW_TIMEOUT_S
    with open_agent(sd, endpoints=_endpoints(sd), lease_ttl_s=lease_ttl_s) as agent:
        while time.monotonic() < deadline:
            done = held = 0
            try:
                threads = [r.thread_id for r in agent.ledger.list_threads()]
            except LedgerBusyError:
                time.sleep(_REVIEW_POLL_S)
                continue
            for thread_id in threads:
                try:
                    state = _review_one(agent, sd, thread_id, verdicts=verdicts)
                except (ThreadBusyError, LedgerBusyError):
                    continue
                done += state == "done"
                held += state == "held"
            if threads and done == len(threads):
                report_line({"status": "done", "threads": done})
                return EXIT_DONE
            if threads and done + held == len(threads):
                report_line({"status": "held", "threads": done, "held": held})
                return EXIT_HELD
            time.sleep(_REVIEW_POLL_S)
    report_line({"status": "unfinished", "error": "not settled in time"})
    return EXIT_UNFINISHED


def _review_one(agent: Any, sd: StateDir, thread_id: str, *, verdicts: bool) -> str:
    """Answer what ``thread_id`` waits for; ``done``, ``held`` (a verdict nobody gave) or ``""``."""
    from effectgate._queue import Readiness, readiness
    from effectgate.cli._workers import report_line

    if readiness(agent, thread_id) is Readiness.DONE:
        return "done"
    answers: dict[str, Any] = {}
    held = False
    for p in agent.status(thread_id).interrupts:
        kind = p.value.get("type") if isinstance(p.value, dict) else None
        if kind == "review":
            answers[p.id] = {
                "decisions": [{"type": "approve"} for _ in p.value["action_requests"]],
                "reviewer": "campaign",
            }
        elif kind == "reconciliation" and verdicts:
            answers[p.id] = verdict_for(sd, p.value)
            report_line({"thread_id": thread_id, "operation_id": p.value["operation_id"],
                         "verdict": answers[p.id]["verdict"]})  # fmt: skip
        else:
            held = True  # a reconciliation: a person's call, not the reviewer's
    if held and not answers:
        return "held"
    if not answers:
        return ""  # new or unfinished: a worker's job
    result = agent.resume(thread_id, answers=answers)
    report_line({"thread_id": thread_id, "reviewed": len(answers),
                 "status": result.status.value})  # fmt: skip
    return ""


def verdict_for(sd: StateDir, request: dict[str, Any]) -> dict[str, Any]:
    """A person's verdict on a reconciliation, from the ticket service's and mail sink's files.

    The mail is looked for by its Message-ID (``message_id_for`` the
    operation), the ticket by its ``Idempotency-Key`` (the operation id):
    found, ``succeeded`` with its reference; not found, ``retry`` (safe only
    because no process of the trial is left that could still send it).

    Args:
        sd: the trial's state directory (its ``services/`` hold both files).
        request: the ``ReconciliationRequest`` payload.

    Returns:
        A verdict for ``Agent.resume(answers={interrupt_id: verdict})``,
        bound to the request's attempt.
    """
    from effectgate.demo.services import read_mails, read_tickets
    from effectgate.tools.builtin.mail import message_id_for

    op_id = str(request["operation_id"])
    reference: str | None = None
    if request.get("tool") == "send_email":
        wanted = message_id_for(op_id)
        if any(m["message_id"] == wanted for m in read_mails(sd.services)):
            reference = wanted
    elif request.get("tool") == "create_ticket":
        found = [t for t in read_tickets(sd.services) if t["idempotency_key"] == op_id]
        if found:
            reference = f"TICKET-{found[0]['ticket_id']}"
    base = {"attempt": request["attempt"], "reviewer": "campaign-person"}
    if reference is not None:
        return {**base, "verdict": "succeeded", "reference": reference,
                "evidence": f"{reference} in the service's own records"}  # fmt: skip
    return {**base, "verdict": "retry", "acknowledge_duplicate_risk": True,
            "evidence": "not in the service's records; no process of the trial left"}  # fmt: skip
