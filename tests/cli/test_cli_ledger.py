"""``ledger``, ``threads``, ``pending`` and ``reconcile``, and a second runner on a busy thread."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from effectgate.ledger import OpState, SqliteLedger
from tests.answers._bind import bound
from tests.cli.conftest import CLI, Ran, cli_env, eg, world, write_script


def test_ledger_commands_read_the_finished_demo(finished_demo: tuple[Path, Ran]) -> None:
    """list / show / stats / events / threads agree with the demo's receipts."""
    state, demo = finished_demo
    sd = ["--state-dir", str(state)]
    listed = eg("ledger", "list", *sd, "--json").json["operations"]
    assert [(o["id"], o["state"]) for o in listed] == [
        (o["id"], o["state"]) for o in demo.json["operations"]
    ]
    assert [
        o["id"]
        for o in eg("ledger", "list", *sd, "--tool", "write_file", "--json").json["operations"]
    ] == [o["id"] for o in listed if o["tool"] == "write_file"]
    shown = eg("ledger", "show", "ticket:orders-error-rate", *sd, "--json").json
    assert shown["operation"]["reference"] == "TICKET-1"
    assert [(e["src"], e["dst"]) for e in shown["events"]] == [
        (None, "PROPOSED"),
        ("PROPOSED", "APPROVED"),
        ("APPROVED", "IN_FLIGHT"),
        ("IN_FLIGHT", "SUCCEEDED"),
    ]
    assert shown["approvals"][0]["reviewer"] == "ci"
    stats = eg("ledger", "stats", *sd, "--json").json["stats"]
    assert stats["by_state"]["SUCCEEDED"] == 3
    assert stats["first_attempt_success_rate"] == 1.0
    events = eg("ledger", "events", *sd, "--thread", "demo-1", "--json").json["events"]
    assert sum(e["dst"] == "SUCCEEDED" for e in events) == 3
    threads = eg("threads", *sd, "--json").json["threads"]
    assert [(t["thread_id"], t["status"], t["metadata"]["kind"]) for t in threads] == [
        ("demo-1", "done", "demo")
    ]
    human = eg("ledger", "list", *sd)
    assert "ticket:orders-error-rate" in human.stdout and "TICKET-1" in human.stdout
    missing = eg("ledger", "show", "nope", *sd)
    assert missing.code == 2 and "unknown operation 'nope'" in missing.stderr


def test_unknown_outcome_of_unsafe_call_waits_for_reconcile(tmp_path: Path) -> None:
    """Killed after IN_FLIGHT, an unsafe call parks (exit 3) until ``reconcile`` settles it.

    ``--approve all`` approves the unsafe call and says so; the human verdict is
    recorded with its evidence; a later ``resume`` finishes without running it.
    """
    state = tmp_path / "state"
    script = write_script(
        tmp_path / "shell.json", [{"name": "run_shell", "args": {"command": "echo ran >> ran.txt"}}]
    )
    sd = ["--state-dir", str(state)]
    crashed = eg(
        "run",
        "append a line",
        "--model",
        f"scripted:{script}",
        *sd,
        "--thread",
        "s",
        "--approve",
        "all",
        "--crash-at",
        "AFTER_IN_FLIGHT_COMMIT",
    )
    assert crashed.code == 137, crashed.stderr
    assert "approving UNSAFE call run_shell" in crashed.stderr
    parked = eg("resume", *sd, "--thread", "s", "--approve", "all", "--json")
    assert parked.code == 3, parked.stderr
    assert parked.json["status"] == "waiting_reconciliation"
    [op] = parked.json["operations"]
    assert op["state"] == "NEEDS_RECONCILIATION"
    [interrupt] = parked.json["interrupts"]
    assert interrupt["kind"] == "reconciliation"
    assert interrupt["value"]["operation_id"] == op["id"]
    pending = eg("pending", *sd, "--json").json
    assert [o["id"] for o in pending["operations"]] == [op["id"]]

    wrong = eg("reconcile", op["id"], *sd)
    assert wrong.code == 2 and "exactly one of" in wrong.stderr
    settled = eg(
        "reconcile",
        op["id"],
        "--failed",
        "--evidence",
        "ran.txt is absent",
        "--reviewer",
        "erin",
        *sd,
        "--json",
    )
    assert settled.code == 0, settled.stderr
    assert settled.json["operation"]["state"] == "FAILED"
    assert eg("reconcile", op["id"], "--failed", *sd).code == 0  # idempotent
    assert eg("reconcile", op["id"], "--succeeded", "X", *sd).code == 2
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        last = ledger.events(operation_id=op["id"])[-1]
        assert (last.src, last.dst) == (OpState.NEEDS_RECONCILIATION, OpState.FAILED)
        assert last.detail["reviewer"] == "erin"
        assert last.detail["evidence"] == "ran.txt is absent"
    finally:
        ledger.close()

    done = eg("resume", *sd, "--thread", "s", "--json")
    assert done.code == 0, done.stderr
    assert [o["state"] for o in done.json["operations"]] == ["FAILED"]
    assert world(state)["files"] == {}  # the command never ran


def test_second_resume_while_one_runs_is_busy(tmp_path: Path) -> None:
    """While one process runs a thread, ``resume`` of it exits 75 and runs nothing."""
    state = tmp_path / "state"
    script = write_script(
        tmp_path / "slow.json",
        [
            # Holds the thread until the test has seen the second runner refused.
            {
                "name": "run_shell",
                "args": {
                    "command": (
                        "for i in $(seq 600); do [ -f go ] && break; sleep 0.05; done; "
                        "echo once >> slept.txt"
                    )
                },
            }
        ],
    )
    first = subprocess.Popen(
        [
            *CLI,
            "run",
            "sleep",
            "--model",
            f"scripted:{script}",
            "--state-dir",
            str(state),
            "--thread",
            "b",
            "--approve",
            "all",
            "--json",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _in_flight(state / "ledger.sqlite3"):
            assert time.monotonic() < deadline, "the shell call never started"
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        busy = eg(
            "resume", "--state-dir", str(state), "--thread", "b", "--approve", "all", "--json"
        )
        assert busy.code == 75, busy.stderr
        assert busy.json["error_type"] == "ThreadBusyError"
        assert "is busy" in busy.stderr
        (state / "workspace" / "go").touch()
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert (state / "workspace" / "slept.txt").read_bytes() == b"once\n"


def _in_flight(path: Path) -> bool:
    if not path.exists():
        return False
    ledger = SqliteLedger(path)
    try:
        return bool(ledger.list(states=[OpState.IN_FLIGHT]))
    finally:
        ledger.close()


def test_sigterm_stops_at_a_step_boundary_and_resume_finishes(tmp_path: Path) -> None:
    """SIGTERM mid-effect: the effect completes and is recorded, exit 5, resume finishes."""
    state = tmp_path / "state"
    script = write_script(
        tmp_path / "hold.json",
        [
            {
                "name": "run_shell",
                "args": {
                    "command": (
                        "for i in $(seq 600); do [ -f go ] && break; sleep 0.05; done; "
                        "echo once >> done.txt"
                    )
                },
            }
        ],
    )
    args = ["run", "hold", "--model", f"scripted:{script}", "--state-dir", str(state)]
    first = subprocess.Popen(
        [*CLI, *args, "--thread", "g", "--approve", "all", "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _in_flight(state / "ledger.sqlite3"):
            assert time.monotonic() < deadline, "the shell call never started"
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        (state / "workspace" / "go").touch()
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 5, err
    assert "SIGTERM: stopping at the next step boundary" in err
    stopped = json.loads(out)
    assert stopped["status"] == "incomplete"
    assert [(o["state"], o["attempt"]) for o in stopped["operations"]] == [("SUCCEEDED", 1)]
    resumed = eg("resume", "--state-dir", str(state), "--thread", "g", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json["final_message"] == "Done."
    assert (state / "workspace" / "done.txt").read_bytes() == b"once\n"


def test_reconcile_of_a_settled_operation_with_another_reference_is_refused(
    tmp_path: Path,
) -> None:
    """Repeating a verdict is a no-op; a different reference is not silently ignored."""
    from effectgate import StateDir
    from effectgate.testing import FakeClock
    from effectgate.testing.ledger_conformance import make_approval, make_receipt, make_request

    sd = StateDir.open(tmp_path / "state")
    clock = FakeClock()
    with SqliteLedger(sd.ledger, clock=clock) as ledger:
        req = make_request("t1:c1")
        ledger.record_review([req], [make_approval(req, clock)])
        op = ledger.claim("t1:c1", attempt=1, worker="w")
        ledger.record_result(
            "t1:c1", attempt=1, state=OpState.SUCCEEDED, receipt=make_receipt(op, clock)
        )
    args = ("reconcile", "t1:c1", "--state-dir", str(sd.root))
    assert eg(*args, "--succeeded", "ref-t1:c1").code == 0  # the same verdict: a no-op
    other = eg(*args, "--succeeded", "other-ref")
    assert other.code == 2 and "already SUCCEEDED with reference 'ref-t1:c1'" in other.stderr
    with SqliteLedger(sd.ledger) as ledger:
        settled = ledger.get("t1:c1")
    assert settled is not None and settled.receipt is not None
    assert settled.receipt.reference == "ref-t1:c1"


def _park_a_delivered_mail(sd: Any, svc: Any) -> Any:
    """Run the demo incident on ``svc`` until its mail, which arrives while its reply
    and its lookup fail, is parked NEEDS_RECONCILIATION; return that operation."""
    from effectgate import open_agent

    approve = {"decisions": [{"type": "approve"}]}
    with open_agent(sd, endpoints=svc.endpoints) as agent:
        svc.set_error_rate("orders", 0.12)
        agent.start("Check the order service and handle any incident.", thread_id="p1")
        result = agent.resume("p1", decisions=bound(agent, "p1", approve))
        svc.set_fault("mail", "timeout-after-commit", lookups="unavailable", delay_s=8)
        n = len(result.interrupts[0].value["action_requests"])
        result = agent.resume(
            "p1", decisions=bound(agent, "p1", {"decisions": approve["decisions"] * n})
        )
    (mail,) = [op for op in result.operations if op.tool == "send_email"]
    assert mail.state is OpState.NEEDS_RECONCILIATION
    return mail


def test_reconcile_failed_is_refused_when_the_lookup_finds_the_mail(tmp_path: Path) -> None:
    """A mail parked as unknown (its lookup was down) that did arrive: ``reconcile
    --failed`` looks first and refuses (exit 2); the operation stays parked."""
    from effectgate import StateDir
    from effectgate.demo import DemoServices
    from effectgate.ledger import OpState

    sd = StateDir.open(tmp_path / "state")
    with DemoServices(sd.services) as svc:
        mail = _park_a_delivered_mail(sd, svc)
        svc.set_fault("mail", "normal")  # the lookup is back; the mail had arrived
        assert len(svc.mails()) == 1
    ran = eg("reconcile", mail.operation_id, "--failed", "--state-dir", str(sd.root))
    assert ran.code == 2, ran.stderr
    assert "the lookup now finds the effect" in " ".join(ran.stderr.split())
    with SqliteLedger(sd.ledger) as ledger:
        still = ledger.get(mail.operation_id)
    assert still is not None and still.state is OpState.NEEDS_RECONCILIATION


def test_reconcile_failed_asks_the_services_that_sent_the_mail_or_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served state directory whose mail went to services run elsewhere
    (``EFFECTGATE_SERVICES``): ``reconcile --failed`` never asks new, empty
    services of its own (which would say "no such mail" and let the thread
    send it again). Without the addresses it refuses; with them it finds the
    mail and refuses; with them down it refuses; the operation stays parked
    and no service data is made in the state directory."""
    from effectgate import StateDir
    from effectgate.demo import DemoServices

    sd = StateDir.open(tmp_path / "state")
    with DemoServices(tmp_path / "elsewhere") as svc:
        mail = _park_a_delivered_mail(sd, svc)
        svc.set_fault("mail", "normal")
        assert len(svc.mails()) == 1  # the mail did arrive, elsewhere
        args = ("reconcile", mail.operation_id, "--failed", "--state-dir", str(sd.root))
        monkeypatch.delenv("EFFECTGATE_SERVICES", raising=False)
        unknown = eg(*args)
        assert unknown.code == 2, unknown.stderr
        assert "no demo services are known" in " ".join(unknown.stderr.split())
        e = svc.endpoints
        addresses = {
            "ticket_url": e.ticket_url,
            "smtp_host": e.smtp_host,
            "smtp_port": e.smtp_port,
            "mail_url": e.mail_url,
        }
        monkeypatch.setenv("EFFECTGATE_SERVICES", json.dumps(addresses))
        found = eg(*args)
        assert found.code == 2, found.stderr
        assert "the lookup now finds the effect" in " ".join(found.stderr.split())
    down = eg(*args)
    assert down.code == 2, down.stderr
    assert "do not answer" in " ".join(down.stderr.split())
    assert not (sd.services / "mail.sqlite3").exists()
    with SqliteLedger(sd.ledger) as ledger:
        still = ledger.get(mail.operation_id)
    assert still is not None and still.state is OpState.NEEDS_RECONCILIATION


def test_reconcile_failed_is_refused_while_the_lookup_cannot_answer(tmp_path: Path) -> None:
    """A mail parked because its lookup was down, which did arrive: while the lookup
    still cannot answer, ``--failed`` records nothing (exit 2, the operation stays
    parked), since "not applied" recorded unchecked lets the model send it again;
    ``--failed --unchecked`` records it, the risk accepted (break test of #32)."""
    from effectgate import StateDir
    from effectgate.demo import DemoServices

    sd = StateDir.open(tmp_path / "state")
    with DemoServices(sd.services) as svc:
        mail = _park_a_delivered_mail(sd, svc)
        assert len(svc.mails()) == 1  # it did arrive; the lookup still cannot say so
        args = ("reconcile", mail.operation_id, "--failed", "--state-dir", str(sd.root))
        refused = eg(*args)
        assert refused.code == 2, refused.stderr
        assert "the lookup cannot tell now" in " ".join(refused.stderr.split())
        with SqliteLedger(sd.ledger) as ledger:
            still = ledger.get(mail.operation_id)
        assert still is not None and still.state is OpState.NEEDS_RECONCILIATION
        assert eg("reconcile", mail.operation_id, "--succeeded", "X", "--unchecked",
                  "--state-dir", str(sd.root)).code == 2  # fmt: skip
        accepted = eg(*args, "--unchecked", "--evidence", "not in the inbox")
        assert accepted.code == 0, accepted.stderr
    with SqliteLedger(sd.ledger) as ledger:
        settled = ledger.get(mail.operation_id)
    assert settled is not None and settled.state is OpState.FAILED


def test_pending_shows_a_served_threads_call_and_does_not_send_it_to_resume(
    tmp_path: Path,
) -> None:
    """A thread a LangGraph server ran has no thread record, only operations: ``pending
    --thread`` lists its call (it said "unknown thread", exit 2), and the hint sends
    the user to the server's client, not to ``effectgate resume`` (which exits 2 there)."""
    from effectgate import StateDir
    from effectgate.testing import FakeClock
    from effectgate.testing.ledger_conformance import make_approval, make_request

    sd = StateDir.open(tmp_path / "state")
    clock = FakeClock()
    with SqliteLedger(sd.ledger, clock=clock) as ledger:
        req = make_request("s1:c1")
        ledger.record_review([req], [make_approval(req, clock)])
        ledger.claim("s1:c1", attempt=1, worker="w")
        thread = ledger.get("s1:c1").thread_id  # type: ignore[union-attr]
    ran = eg("pending", "--thread", thread, "--state-dir", str(sd.root))
    assert ran.code == 0, ran.stderr
    text = " ".join(ran.stdout.split())
    assert "s1:c1" in text and "not a thread effectgate runs" in text
    assert f"resume --thread {thread}" not in text
    assert eg("pending", "--thread", "nope", "--state-dir", str(sd.root)).code == 2
