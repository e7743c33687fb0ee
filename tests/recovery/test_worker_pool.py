"""``effectgate worker --processes N`` replaces a worker that was killed, and says so."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from effectgate import StateDir
from effectgate.cli._workers import READY_LINE
from tests.cli.conftest import catches, start, wait_for
from tests.recovery._kit import Lines


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(t) for t in text}
    return found


def _wait_for(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_killed_worker_is_replaced_and_a_stop_ends_the_pool(state_dir: StateDir) -> None:
    """kill -9 of one child: another starts, one stderr line; SIGTERM then ends all, exit 5.

    Before, the pool ran on with one worker fewer, and when the last child
    was killed it exited 247 (the raw -9) with nothing said (found by a
    fresh user).
    """
    pool = start("worker", "--processes", "2", "--state-dir", str(state_dir.root), "--json")
    try:
        _wait_for(lambda: len(_children(pool.pid)) == 2)
        first = _children(pool.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        _wait_for(
            lambda: len(_children(pool.pid) - first) == 1 and victim not in _children(pool.pid)
        )
        assert len(_children(pool.pid)) == 2
        time.sleep(1.0)  # let the new child install its signal handlers
        pool.send_signal(signal.SIGTERM)
        _, err = pool.communicate(timeout=60)
    finally:
        if pool.poll() is None:  # a failed test must not leave workers behind
            for child in _children(pool.pid):
                os.kill(child, signal.SIGKILL)
            pool.kill()
    assert pool.returncode == 5, err  # stopped by SIGTERM: incomplete, as documented
    assert f"worker {victim} was killed (SIGKILL); started another" in err
    assert "Traceback" not in err


def _summary(out: str) -> dict[str, object]:
    """The worker's last stdout line: its JSON summary (fails if anything else is there)."""
    *_, last = out.splitlines()
    summary = json.loads(last)
    assert set(summary) == {"worker", "runs", "stopped"}, summary
    return summary


def test_a_worker_stopped_between_runs_exits_5_as_documented(state_dir: StateDir) -> None:
    """SIGTERM to an idle worker: exit 5 (stopped by a signal), not 0 (a fresh user saw 0).

    The signal goes once the worker said it is ready (its documented stderr
    line), not after a fixed sleep: on a loaded machine 2 s was sometimes
    still start-up, which then ended in an error line instead of the summary.
    """
    worker = start("worker", "--state-dir", str(state_dir.root), "--json")
    assert worker.stdout is not None and worker.stderr is not None
    out, err = Lines(worker.stdout), Lines(worker.stderr)
    try:
        wait_for(lambda: err.has(READY_LINE.split(" (")[0]), worker, "the worker is ready")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 5, err.text()
    summary = _summary(out.text())
    assert summary["runs"] == 0 and summary["stopped"] is True
    assert "SIGTERM: stopping" in err.text()


def test_a_worker_stopped_during_start_up_ends_with_its_summary(state_dir: StateDir) -> None:
    """SIGTERM the moment the CLI handles signals (long before the store is open): summary, exit 5.

    Before, a stop before the worker had opened its agent ended in
    ``error (incomplete, exit 5): stopped by SIGTERM`` and, with ``--json``,
    an error object instead of the worker's ``{"worker", "runs", "stopped"}``
    line; a script reading the summary found none.
    """
    worker = start("worker", "--state-dir", str(state_dir.root), "--json")
    try:
        wait_for(lambda: catches(worker.pid, signal.SIGTERM), worker, "the handler is installed")
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 5, err
    assert "error" not in err and "Traceback" not in err, err
    summary = _summary(out)
    assert summary["runs"] == 0 and summary["stopped"] is True
    assert len(out.splitlines()) == 1, out


def test_a_pool_stopped_as_it_starts_its_workers_ends_each_with_its_summary(
    state_dir: StateDir,
) -> None:
    """SIGTERM to a pool while its children are still starting Python: each ends with exit 5.

    The children start with SIGINT / SIGTERM blocked until their handler is
    in place, so the stop the pool passes on is never a death by SIGTERM
    (the pool said exit 1 for such a child, a signal it counts as a crash).
    """
    pool = start("worker", "--processes", "2", "--state-dir", str(state_dir.root), "--json")
    try:
        _wait_for(lambda: len(_children(pool.pid)) == 2)
        pool.send_signal(signal.SIGTERM)
        out, err = pool.communicate(timeout=60)
    finally:
        if pool.poll() is None:
            for child in _children(pool.pid):
                os.kill(child, signal.SIGKILL)
            pool.kill()
    assert pool.returncode == 5, err
    assert "Traceback" not in err and "error" not in err, err
    summaries = [json.loads(line) for line in out.splitlines()]
    assert len(summaries) == 2, out
    assert all(s["stopped"] is True and s["runs"] == 0 for s in summaries), summaries


def test_a_worker_stopped_inside_a_run_counts_that_run(state_dir: StateDir, tmp_path: Path) -> None:
    """SIGINT while an approved ``run_shell`` runs: the command ends once, the summary says 1 run.

    The run stops at the next step boundary after the command ended (its
    effect happened). Before, that run was taken for a held thread and the
    summary said ``runs 0`` (found by a break test). The command's own bytes
    show it ran once, and a second worker finishes the thread without
    running it again.
    """
    from effectgate import open_agent, submit

    command = "echo start >> log; sleep 2; echo end >> log"
    script = {
        "name": "p",
        "final": "done",
        "turns": [{"tool_calls": [{"name": "run_shell", "args": {"command": command}}]}],
    }
    model_path = tmp_path / "model.json"
    model_path.write_text(json.dumps(script))
    model = f"scripted:{model_path}"
    with open_agent(state_dir, model=model) as agent:
        submit(agent, "run the shell", thread_id="t")
    args = ("worker", "--model", model, "--approve", "all", "--state-dir", str(state_dir.root))
    log = state_dir.workspace / "log"
    worker = start(*args, "--json")
    try:
        _wait_for(lambda: log.exists() and log.read_text().startswith("start"))
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 5, err
    assert log.read_text() == "start\nend\n"
    summary = _summary(out)
    assert summary["runs"] == 1 and summary["stopped"] is True, out
    lines = [json.loads(line) for line in out.splitlines()]
    assert sum(1 for line in lines if line.get("status") == "incomplete") == 1, out
    again = start(*args, "--until-idle", "--json")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert log.read_text() == "start\nend\n"  # the command did not run twice
    assert any(json.loads(line).get("status") == "done" for line in out.splitlines()), out
