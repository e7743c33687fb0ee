"""``effectgate worker`` and the threads ``effectgate demo`` started (issue #36).

A demo thread runs with the demo ticket and mail services. A worker that
cannot reach them (no ``effectgate services`` running: ``demo`` stops its own
when it ends) or that runs another agent leaves the thread, and its one line
names what takes the thread to its end: ``effectgate resume`` (which starts
the services), or a worker while ``effectgate services`` runs. Before, the
worker without services said the thread needed tools "this agent does not
have" and to rebuild it with ``--agent MODULE:FACTORY`` or ``resume
--with-services``; the worker with ``--agent`` said "a worker without --agent
takes it", and that worker did not.
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path
from typing import Any

from tests.cli.conftest import EXPECTED_NOTE, NOTE, Ran, eg, finish, start, wait_for, world

AGENT = "tests.conversations._custom_agent:build"
ROOT = Path(__file__).resolve().parents[2]


def _stopped_at_review(state: Path, thread: str) -> None:
    """``effectgate demo`` as a newcomer runs it without answering: it stops at the first review."""
    ran = eg("demo", "--state-dir", str(state), "--thread", thread)
    assert ran.code == 4, (ran.stdout, ran.stderr)
    assert f"continue with: effectgate resume --thread {thread}" in ran.stdout + ran.stderr


def _lines(ran: Ran) -> list[dict[str, Any]]:
    assert ran.code == 0, (ran.stdout, ran.stderr)
    return [json.loads(line) for line in ran.stdout.splitlines()]


def _skip(state: Path, thread: str, why: str, worker: str) -> str:
    resume = shlex.join(["effectgate", "resume", "--thread", thread, "--state-dir", str(state)])
    services = shlex.join(["effectgate", "services", "--state-dir", str(state)])
    return f"{why}: {resume} takes it (it starts them), or {worker} while {services} runs"


def _status(state: Path, thread: str) -> str:
    listed = eg("threads", "--state-dir", str(state), "--json").json["threads"]
    return str({t["thread_id"]: t for t in listed}[thread]["status"])


def _one_of_each(state: Path) -> None:
    seen = world(state)
    assert [t["idempotency_key"] for t in seen["tickets"]] == ["ticket:orders-error-rate"]
    assert len(seen["mails"]) == 1 and "TICKET-1" in seen["mails"][0]["subject"]
    assert seen["files"] == {NOTE.as_posix(): EXPECTED_NOTE}


def test_a_worker_without_the_demo_services_names_resume_which_finishes_the_thread(
    tmp_path: Path,
) -> None:
    """The skip line names `effectgate resume --thread T`; run, it takes the demo to its end."""
    state = tmp_path / "state"
    _stopped_at_review(state, "d1")
    sd = ["--state-dir", str(state)]

    plain = _lines(eg("worker", "--approve", "all", "--until-idle", "--json", *sd))
    why = (
        "it runs with the demo ticket and mail services and none runs for this worker "
        "(no services/endpoints.json)"
    )
    assert plain[:-1] == [{"thread_id": "d1", "skipped": _skip(state, "d1", why, "a worker")}]
    assert plain[-1]["runs"] == 0
    text = eg("worker", "--until-idle", *sd)  # the same line without --json, key=value
    assert text.code == 0, text.stderr
    assert f"thread_id=d1 skipped={_skip(state, 'd1', why, 'a worker')}" in text.stdout
    recipe = _lines(eg("worker", "--agent", AGENT, "--until-idle", "--json", *sd, cwd=ROOT))
    why = "it runs with the built-in tools and the demo ticket and mail services"
    worker = "a worker without --agent"
    assert recipe[:-1] == [{"thread_id": "d1", "skipped": _skip(state, "d1", why, worker)}]
    assert world(state)["tickets"] == [] and world(state)["mails"] == []

    # pending and threads agree: it waits at its review, for `resume`.
    assert _status(state, "d1") == "waiting_review"
    assert "review thread d1: create_ticket" in eg("pending", *sd).stdout

    # The command the line names, answering its reviews, takes the thread to its end.
    command = plain[0]["skipped"].split(": ", 1)[1].split(" takes it", 1)[0]
    assert command == f"effectgate resume --thread d1 --state-dir {state}"
    done = eg(*shlex.split(command)[1:], "--approve", "all", "--json")
    assert done.code == 0, (done.stdout, done.stderr)
    assert done.json["status"] == "done"
    _one_of_each(state)
    assert _status(state, "d1") == "done"
    assert _lines(eg("worker", "--until-idle", "--json", *sd))[:-1] == []  # nothing left to say


def test_a_worker_while_effectgate_services_runs_takes_the_demo_thread(tmp_path: Path) -> None:
    """The line's other way: `effectgate services` running, a worker without --agent finishes it."""
    state = tmp_path / "state"
    _stopped_at_review(state, "d2")
    sd = ["--state-dir", str(state)]
    services = start("services", *sd)
    try:
        endpoints = state / "services" / "endpoints.json"
        wait_for(endpoints.exists, services, "effectgate services wrote endpoints.json")
        recipe = _lines(eg("worker", "--agent", AGENT, "--until-idle", "--json", *sd, cwd=ROOT))
        why = "it runs with the built-in tools and the demo ticket and mail services"
        worker = "a worker without --agent"
        assert recipe[:-1] == [{"thread_id": "d2", "skipped": _skip(state, "d2", why, worker)}]
        ran = _lines(eg("worker", "--approve", "all", "--until-idle", "--json", *sd))
        assert ran[:-1] == [{"thread_id": "d2", "was": "review", "status": "done"}]
        assert ran[-1]["runs"] == 1
    finally:
        services.send_signal(signal.SIGINT)
        finish(services)
    _one_of_each(state)
    assert _status(state, "d2") == "done"
