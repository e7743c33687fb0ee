"""A second SIGTERM to ``effectgate worker`` aborts at once, even inside a slow tool call (#37).

The first SIGTERM asks the worker to stop at the next step boundary; the
test waits until the worker has said so on stderr before sending the second
one (two signals sent back to back coalesce into one, which made an earlier
version of this test flaky). The ledger, read through the CLI, must then hold
the call as in flight or unknown, never as done without its effect.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from effectgate import StateDir, open_agent, submit
from effectgate.cli._workers import READY_LINE
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState
from tests.cli.conftest import eg, start, wait_for, write_script
from tests.recovery._kit import Lines

HOLD_S = 120
"""How long the shell call holds on its own (seconds): far past the test's bound."""

_HOLD = (
    # Says it started, then waits for ``go`` (the test's clean-up) or HOLD_S seconds.
    f"echo $$ > started; for i in $(seq {HOLD_S * 20}); do [ -f go ] && break; sleep 0.05; done; "
    "echo once >> done.txt"
)


def test_a_second_sigterm_aborts_a_worker_inside_a_slow_call(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """SIGTERM, its note, SIGTERM: exit 5 long before the call would end; the ledger is honest.

    Before, the worker's own handler only set its stop flag again: the second
    signal was ignored until the running call ended (here 120 s), although
    docs/cli.md says a second signal aborts at once.
    """
    calls = [{"name": "run_shell", "args": {"command": _HOLD}}]
    script = write_script(tmp_path / "hold.json", calls)
    model = f"scripted:{script}"
    with open_agent(state_dir, model=model) as agent:
        submit(agent, "hold the shell", thread_id="t")
    worker = start(
        "worker", "--state-dir", str(state_dir.root), "--model", model, "--approve", "all",
        "--json",
    )  # fmt: skip
    assert worker.stdout is not None and worker.stderr is not None
    out, err = Lines(worker.stdout), Lines(worker.stderr)
    started = state_dir.workspace / "started"
    try:
        wait_for(lambda: err.has(READY_LINE.split(" (")[0]), worker, "the worker is ready")
        wait_for(started.exists, worker, "the shell call runs")
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: err.has("SIGTERM: stopping"), worker, "the first SIGTERM was handled")
        worker.send_signal(signal.SIGTERM)
        # The bound is the call's own length: before, the worker outlived it.
        worker.wait(timeout=HOLD_S / 2)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the second SIGTERM did not abort the worker: {err.text()}") from None
    finally:
        if worker.poll() is None:
            worker.kill()
        (state_dir.workspace / "go").touch()  # ends the shell call if it still runs
    assert worker.returncode == 5, err.text()
    flat = " ".join(err.text().split())
    assert "aborted by a second SIGTERM" in flat and "Traceback" not in flat, flat
    last = json.loads(out.text().splitlines()[-1])
    assert last["exit_code"] == 5 and "aborted by a second SIGTERM" in last["error"], last
    listed = eg("ledger", "list", "--state-dir", str(state_dir.root), "--json")
    assert listed.code == 0, listed.stderr
    (op,) = listed.json["operations"]
    # Aborted inside the call: its outcome is not known, and it is not reported done.
    assert op["tool"] == "run_shell"
    assert op["state"] in ("IN_FLIGHT", "UNKNOWN"), op
    assert op["result"] is None and op["reference"] is None, op


def _in_flight(state_dir: StateDir) -> list[str]:
    ledger = state_dir.open_ledger()
    try:
        return [op.tool for op in ledger.list(states=[OpState.IN_FLIGHT])]
    finally:
        ledger.close()


def test_an_aborted_worker_names_the_thread_and_the_cut_off_call_and_resume_settles_it(
    state_dir: StateDir, services: DemoServices
) -> None:
    """Abort inside a slow create_ticket: the error names thread and call; resume: one ticket.

    Before, the JSON error said ``"thread_id": null`` and only "aborted by a
    second SIGTERM": nothing said which thread to resume nor that a call had
    been cut off with its outcome unknown.
    """
    root = str(state_dir.root)
    demo = eg("demo", "--state-dir", root, "--thread", "d1", "--json")
    assert demo.code == 4, demo.stderr[-2000:]
    services.set_fault("tickets", "slow", delay_s=6)
    worker = start("worker", "--state-dir", root, "--approve", "all", "--json")
    assert worker.stdout is not None and worker.stderr is not None
    out, err = Lines(worker.stdout), Lines(worker.stderr)
    try:
        wait_for(lambda: _in_flight(state_dir) == ["create_ticket"], worker, "the ticket call")
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: err.has("SIGTERM: stopping"), worker, "the first SIGTERM was handled")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 5, err.text()
    assert "Traceback" not in err.text()
    last = json.loads(out.text().splitlines()[-1])
    assert last["thread_id"] == "d1", last
    assert "in the middle of thread d1's call create_ticket" in last["error"], last
    assert f"effectgate resume --thread d1 --state-dir {root} settles it" in last["error"], last
    assert _in_flight(state_dir) == ["create_ticket"]  # the outcome stays unknown, not done

    # The slow request still commits (an HTTP server does not notice the hang-up).
    deadline = time.monotonic() + 30
    while not services.tickets() and time.monotonic() < deadline:
        time.sleep(0.1)
    services.set_fault("tickets", "normal")
    done = eg("resume", "--state-dir", root, "--thread", "d1", "--approve", "all", "--json")
    assert done.code == 0, done.stderr[-2000:]
    assert done.json["status"] == "done"
    assert [t["idempotency_key"] for t in services.tickets()] == ["ticket:orders-error-rate"]
    assert len(services.mails()) == 1
