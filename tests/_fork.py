"""Run ``python -m MODULE`` for a test: forked from a warm image, or as a fresh interpreter.

Most of a CLI or worker process's CPU is spent importing LangChain and
LangGraph. Each pytest process therefore keeps one
``effectgate.testing.forkserver.ForkServer`` and forks every short-lived
``python -m effectgate.cli ...`` / ``python -m effectgate.testing.worker ...``
from it: still a separate OS process with its own pid, environment, working
directory, stdin, stdout, stderr and exit status (SIGKILL and failpoints
behave as in a fresh interpreter), minus the start-up imports.

A fresh interpreter is used instead when ``EFFECTGATE_TEST_FORK=0``, when
the fork server cannot start, or when the call changes a variable Python
reads only at start-up (``PYTHON*``, ``LANG``, ``LC_*``), which a forked
child would not see. Tests that signal a process, talk to it while it runs
or test start-up itself keep using ``subprocess`` directly.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from effectgate.testing.forkserver import ForkServer

__all__ = ["python_m"]

_lock = threading.Lock()
_server: ForkServer | None = None
_broken = False


def _startup_vars(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"}


def _fork_server() -> ForkServer | None:
    global _server, _broken
    if os.environ.get("EFFECTGATE_TEST_FORK") == "0":
        return None
    with _lock:
        if _server is not None and not _server.alive():
            _server = None
        if _server is None and not _broken:
            try:
                _server = ForkServer()
            except (OSError, RuntimeError):
                _broken = True  # fall back to fresh interpreters for this pytest process
                return None
            atexit.register(_server.close)
        return _server


def python_m(
    module: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    cwd: Path | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, module, *argv], capture_output, text)``, stdin /dev/null.

    Raises:
        subprocess.TimeoutExpired: the process outlived ``timeout`` seconds (it was killed).
    """
    server = _fork_server()
    if server is not None and _startup_vars(env) == _startup_vars(server.start_env):
        return server.run(module, argv, env, timeout=timeout, cwd=cwd, input=input)
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        stdin=None if input is not None else subprocess.DEVNULL,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env),
        check=False,
        cwd=cwd,
    )
