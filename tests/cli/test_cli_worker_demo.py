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
import socket
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
        "(no services/endpoints.json that names answering ones)"
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_stale_endpoints_file_is_taken_as_absent_and_nothing_is_sent(tmp_path: Path) -> None:
    """``endpoints.json`` left by services that are gone: the worker leaves the thread, says why.

    An ``effectgate services`` killed with ``kill -9`` (or stopped on another
    machine) leaves its file naming ports nothing listens on. Before, the
    worker trusted it and ran the thread's approved calls against them. Now
    it probes the servers, notes on stderr that they do not answer, and
    leaves the thread with the usual line; once ``effectgate services`` runs
    again (it writes over the stale file), a worker takes the thread to
    one ticket and one mail.
    """
    state = tmp_path / "state"
    _stopped_at_review(state, "d3")
    sd = ["--state-dir", str(state)]
    endpoints = state / "services" / "endpoints.json"
    stale = {
        "ticket_url": f"http://127.0.0.1:{_closed_port()}",
        "smtp_host": "127.0.0.1",
        "smtp_port": _closed_port(),
        "mail_url": f"http://127.0.0.1:{_closed_port()}",
    }
    endpoints.write_text(json.dumps(stale))

    ran = eg("worker", "--approve", "all", "--until-idle", "--json", *sd)
    lines = _lines(ran)
    why = (
        "it runs with the demo ticket and mail services and none runs for this worker "
        "(no services/endpoints.json that names answering ones)"
    )
    assert lines[:-1] == [{"thread_id": "d3", "skipped": _skip(state, "d3", why, "a worker")}]
    assert lines[-1]["runs"] == 0
    notes = [line for line in ran.stderr.splitlines() if "do not answer" in line]
    assert len(notes) == 1 and str(endpoints) in notes[0] and stale["ticket_url"] in notes[0]
    assert "Traceback" not in ran.stderr
    assert world(state)["tickets"] == [] and world(state)["mails"] == []
    assert _status(state, "d3") == "waiting_review"
    # A pool probes in each worker process; each leaves the thread the same way.
    pool = _lines(eg("worker", "--processes", "2", "--until-idle", "--json", *sd))
    skips = [line for line in pool if "skipped" in line]
    assert skips and all(line == lines[0] for line in skips), pool
    assert world(state)["tickets"] == []

    services = start("services", *sd)
    try:
        wait_for(lambda: json.loads(endpoints.read_text()) != stale, services, "a fresh file")
        done = _lines(eg("worker", "--approve", "all", "--until-idle", "--json", *sd))
        assert done[:-1] == [{"thread_id": "d3", "was": "review", "status": "done"}]
    finally:
        services.send_signal(signal.SIGINT)
        finish(services)
    _one_of_each(state)
