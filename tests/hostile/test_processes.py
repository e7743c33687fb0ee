"""The few hostile cases that need a real ``effectgate`` process.

A FIFO that would block an ``open`` for ever, and a secret inherited from the
real environment of the process: both are only honest in a process of their
own. Each has a timeout well under the old behaviour (blocking for ever).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from effectgate import StateDir, open_agent, submit
from tests.hostile.conftest import SECRET

CLI = [sys.executable, "-m", "effectgate.cli"]


def _eg(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env.update({"OPENAI_API_KEY": SECRET, "GITHUB_TOKEN": SECRET, "NO_COLOR": "1"})
    return subprocess.run(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _model(tmp_path: Path, calls: list[dict[str, Any]]) -> str:
    path = tmp_path / "model.json"
    turns = [{"tool_calls": calls}]
    path.write_text(json.dumps({"name": "p", "final": "done", "turns": turns}))
    return f"scripted:{path}"


def _no_secret(state: Path) -> None:
    for path in state.glob("*.sqlite3*"):
        assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_fifo_in_workspace_neither_blocks_read_nor_review(tmp_path: Path) -> None:
    """read_file on a FIFO is refused at once; a write_file preview onto it returns."""
    state = tmp_path / "state"
    os.mkfifo(StateDir.open(state).workspace / "pipe")
    calls = [
        {"name": "read_file", "args": {"path": "pipe"}},
        {"name": "write_file", "args": {"path": "pipe", "content": "x"}},
    ]
    ran = _eg("run", "t", "--model", _model(tmp_path, calls), "--state-dir", str(state), "--json")
    assert ran.returncode == 4, ran.stderr  # waiting for review of the write
    out = json.loads(ran.stdout)
    (review,) = out["interrupts"]
    preview = review["value"]["action_requests"][0]["preview"]
    assert "not a regular file" in preview
    _no_secret(state)


def test_decisions_fifo_does_not_hang(tmp_path: Path) -> None:
    """``--decisions FIFO`` is refused in the time it takes to open it without blocking."""
    fifo = tmp_path / "decisions.json"
    os.mkfifo(fifo)
    model = _model(tmp_path, [{"name": "read_file", "args": {"path": "a"}}])
    state = str(tmp_path / "state")
    ran = _eg("run", "t", "--model", model, "--state-dir", state, "--decisions", str(fifo))
    assert ran.returncode == 2
    assert "not a regular file" in ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.slow
def test_inherited_secret_is_not_stored_by_run_shell(tmp_path: Path) -> None:
    """OPENAI_API_KEY and GITHUB_TOKEN in the real environment never reach a state file."""
    state = tmp_path / "state"
    calls = [{"name": "run_shell", "args": {"command": "env; printenv OPENAI_API_KEY"}}]
    model = _model(tmp_path, calls)
    ran = _eg("run", "t", "--model", model, "--state-dir", str(state), "--approve", "all")
    assert ran.returncode == 0, ran.stderr
    assert SECRET not in ran.stdout + ran.stderr
    _no_secret(state)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_worker_pool_keeps_the_store_password_off_argv(tmp_path: Path, postgres_url: str) -> None:
    """``worker --processes 2``: no child's /proc/PID/cmdline holds the store URL's password."""
    scheme, rest = postgres_url.split("://", 1)
    user, host = rest.split("@", 1)
    password = "pw-hostile-7c2e91"
    url = f"{scheme}://{user.split(':')[0]}:{password}@{host}"  # trust auth: accepted, unused
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    env.update({"EFFECTGATE_STORE": url, "NO_COLOR": "1"})
    state = tmp_path / "state"
    cmd = [*CLI, "worker", "--state-dir", str(state), "--processes", "2"]
    parent = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        seen: dict[int, bytes] = {}
        while len(seen) < 2 and parent.poll() is None:  # wait for both children to exist
            for child in _children(parent.pid):
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                except FileNotFoundError:
                    continue
                if b"--processes\x001" in cmdline:  # exec'd: a worker child, not the fork
                    seen[child] = cmdline
        assert parent.poll() is None, parent.communicate(timeout=30)
        for cmdline in seen.values():
            assert password.encode() not in cmdline, cmdline
        assert password.encode() not in Path(f"/proc/{parent.pid}/cmdline").read_bytes()
    finally:  # only argv is under test: kill the pool outright, parent first (no replacing)
        children = _children(parent.pid)
        parent.kill()
        for child in children:
            os.kill(child, signal.SIGKILL)
        out, err = parent.communicate(timeout=60)
    assert password.encode() not in out + err, (out + err)[-2000:]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("how", ["run", "worker"])
def test_run_shell_dies_with_the_process_that_dispatched_it(tmp_path: Path, how: str) -> None:
    """``kill -9`` of the process inside an approved ``run_shell``: its whole command goes too.

    Before, the command ran in a session of its own and outlived the worker:
    ``after`` was written 4 s later by a process nothing in the ledger named.
    Now a watchdog kills the command's process group when the dispatching
    process ends; the operation is left for a verdict, as any unsafe call
    interrupted mid-way.
    """
    state = tmp_path / "state"
    workspace = StateDir.open(state).workspace
    command = "echo $$ > pgid; (sleep 4; echo late > after) & sleep 4; echo late > after2"
    model = _model(tmp_path, [{"name": "run_shell", "args": {"command": command}}])
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if how == "run":
        args = ["run", "t", "--model", model, "--approve", "all"]
    else:
        with open_agent(StateDir.open(state), model=model) as agent:
            submit(agent, "hold the shell", thread_id="t")
        args = ["worker", "--model", model, "--approve", "all"]
    proc = subprocess.Popen(
        [*CLI, *args, "--state-dir", str(state)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pgid_file = workspace / "pgid"
    try:
        for _ in range(600):
            if pgid_file.exists() and pgid_file.read_text().strip():
                break
            assert proc.poll() is None, f"{how} ended before the command started"
            time.sleep(0.05)
        else:
            raise AssertionError("the shell command never started")
        pgid = int(pgid_file.read_text())
        assert _group_alive(pgid)
        proc.kill()
        proc.wait(timeout=30)
        for _ in range(100):  # the watchdog kills the group within moments
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        assert not _group_alive(pgid), "the command's process group outlived the dispatcher"
        time.sleep(5)  # past the moment the command would have written its files
        assert not (workspace / "after").exists()
        assert not (workspace / "after2").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
    shown = _eg("ledger", "list", "--state-dir", str(state), "--json")
    assert shown.returncode == 0, shown.stderr
    (op,) = json.loads(shown.stdout)["operations"]
    assert op["tool"] == "run_shell" and op["state"] in ("IN_FLIGHT", "UNKNOWN"), op
    # What the user then gets (docs/security.md): resume parks the call for a
    # verdict, exit 3; the command is not run again.
    thread = str(op["thread_id"])
    args = ["--thread", thread, "--model", model, "--approve", "all", "--state-dir", str(state)]
    resumed = _eg("resume", *args)
    assert resumed.returncode == 3, (resumed.stdout, resumed.stderr)
    shown = _eg("ledger", "list", "--state-dir", str(state), "--json")
    (op,) = json.loads(shown.stdout)["operations"]
    assert (op["state"], op["attempt"]) == ("NEEDS_RECONCILIATION", 1), op
    assert not (workspace / "after").exists()


_KILLED_AFTER_POPEN = """
import os, signal, subprocess, sys
from pathlib import Path
from effectgate.tools.builtin import shell

real, calls = subprocess.Popen, []
def popen_then_die(*args, **kwargs):
    proc = real(*args, **kwargs)
    calls.append(proc)
    if len(calls) == 2:  # the command's shell (the first is the watchdog)
        Path(sys.argv[2]).write_text(str(proc.pid))
        os.kill(os.getpid(), signal.SIGKILL)  # before run_shell can name its group
    return proc
shell.subprocess.Popen = popen_then_die
shell._Shell(Path(sys.argv[1]), 30.0).run(
    shell.RunShellArgs(command="sleep 0.5; echo ran > ran"), None)
"""


def test_run_shell_killed_right_after_popen_runs_nothing(tmp_path: Path) -> None:
    """``kill -9`` between ``Popen`` and the watchdog learning the group: nothing runs.

    Before, the command started at once in a session of its own; a worker
    killed in that gap (8 of 67 trials of a tight kill loop) left it running
    with nothing to kill it, and ``ran`` appeared. Now the command's shell
    waits at a gate that opens only after the watchdog knows its group.
    """
    pid_file = tmp_path / "pid"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_POPEN, str(tmp_path), str(pid_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(pid_file.read_text())
    time.sleep(2.0)  # well past the moment the command would have written ``ran``
    try:
        assert not (tmp_path / "ran").exists(), "the command ran after its worker died"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
