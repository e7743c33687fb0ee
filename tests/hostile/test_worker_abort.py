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
from pathlib import Path

from effectgate._app import StateDir, open_agent
from effectgate._workers import READY_LINE, submit
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
