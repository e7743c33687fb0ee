"""A fork server: import LangGraph once, then fork each ``python -m`` process from that image.

A process that builds an effectgate graph spends 1-2 s importing LangChain
and LangGraph and often well under 1 s running. The server
(``python -m effectgate.testing.forkserver [PRELOAD ...]``) pays the imports
once and stays single-threaded; each request forks a child that becomes
``python -m MODULE ARGV...``: it resets its environment and working
directory, reseeds ``random``, reads its stdin from a file (default
``/dev/null``), writes its output to files, runs the module as
``__main__`` with ``runpy`` and ends the way an interpreter ends (non-daemon
threads joined, ``atexit`` handlers run, ``SystemExit`` codes as Python maps
them, an uncaught exception printed with its traceback and exit 1).

The child is an ordinary separate OS process: it is SIGKILLed, exits 137 at
failpoints and leaves its files behind exactly as ``python -m ...`` would.
What it does not redo is interpreter start-up, so variables read only at
start-up (``PYTHON*``, the locale) are the server's: a caller that changes
them must start a real process instead (``ForkServer.start_env`` is what the
server started with). The server reaps every child at once, so a killed
worker never lingers as a zombie (a zombie would look alive to effectgate's
lease takeover).

The kill campaign forks its workers here (docs/campaign.md), and the test
suite its CLI and worker processes (``tests/conftest.py``): the model is
the zygote of Android and the ``forkserver`` start method of
``multiprocessing``.

Protocol, one JSON object per line. Requests on stdin:
``{"op": "spawn", "id", "module", "argv", "env", "stdout", "stderr",
"stdin"?, "cwd"?}`` and ``{"op": "kill", "pid", "signal"?}`` (ignored once
the child was reaped, so a reused pid is never hit). Replies on stdout:
``{"id", "pid"}`` after a fork and ``{"pid", "code"}`` when a child ends
(``code`` as ``Popen.returncode``: negative for a signal).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["DEFAULT_PRELOAD", "ForkServer", "ForkedProcess", "serve"]

_POLL_S = 0.005

#: What a server imports before it says ready: the CLI, the graph and the test worker.
DEFAULT_PRELOAD: tuple[str, ...] = (
    "effectgate.cli._app",
    "effectgate.graph",
    "effectgate.retention",
    "effectgate.testing.worker",
    "langgraph.checkpoint.sqlite",
)


# --- server side --------------------------------------------------------------------------


def _exit_code(exc: SystemExit) -> int:
    """The status Python's own start-up code gives a ``SystemExit`` that reached the top."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any]) -> None:
    """Become ``python -m MODULE ARGV``: fresh environment and files, run, exit; never returns."""
    code = 1
    try:
        stdin = os.open(request.get("stdin") or os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # TZ is read once per process: read the child's
        if request.get("cwd"):
            os.chdir(request["cwd"])
        # ``python -m`` puts the working directory first on sys.path (the
        # server's own start did so for the server's directory)
        sys.path[0] = os.getcwd()
        random.seed()  # the forked image shares the server's random state
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException:  # noqa: BLE001 - what the interpreter does with it
            traceback.print_exc()
            code = 1
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the child must report and exit, never return
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reply(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _reap(live: set[int]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        _reply({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _handle(line: bytes, live: set[int]) -> None:
    request = json.loads(line)
    if request["op"] == "kill":
        if request["pid"] in live:
            os.kill(request["pid"], int(request.get("signal", signal.SIGKILL)))
        return
    pid = os.fork()
    if pid == 0:
        _child(request)
    live.add(pid)
    _reply({"id": request["id"], "pid": pid})


def serve(preload: Sequence[str] = DEFAULT_PRELOAD) -> int:
    """Import ``preload``, say READY, fork processes on request until stdin closes.

    Args:
        preload: module names to import before READY (what the children would
            otherwise import at start).

    Returns:
        0 once stdin closed (every child still running is SIGKILLed).
    """
    for name in preload:
        importlib.import_module(name)
    _reply({"event": "ready"})
    live: set[int] = set()
    buffer = b""
    while True:
        readable, _, _ = select.select([0], [], [], _POLL_S)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    _handle(line, live)
        _reap(live)
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return 0


# --- client side --------------------------------------------------------------------------


class ForkedProcess:
    """A process forked by the server; its output is in files.

    Attributes:
        pid: the child's process id (a child of the server, not of the caller).
        stdout: the file its standard output goes to.
        returncode: ``None`` while it runs, then as ``Popen.returncode``.
    """

    def __init__(self, server: ForkServer, pid: int, stdout: Path) -> None:
        self.server = server
        self.pid = pid
        self.stdout = stdout
        self.done = threading.Event()
        self.returncode: int | None = None

    def kill(self) -> None:
        """SIGKILL the process unless it has already ended."""
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` unless the process has already ended (the server checks)."""
        self.server.send({"op": "kill", "pid": self.pid, "signal": int(signum)})

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds (None: for ever); the exit code, or None on timeout."""
        self.done.wait(timeout)
        return self.returncode


class ForkServer:
    """Start the server process and hand out ``ForkedProcess``es; thread-safe.

    Args:
        preload: modules the server imports before it is ready.
        ready_timeout_s: how long to wait for READY, in seconds.
        env: the server's environment (default: this process's).

    Raises:
        RuntimeError: the server did not say READY in time.
    """

    def __init__(
        self,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        ready_timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.start_env: dict[str, str] = dict(os.environ if env is None else env)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "effectgate.testing.forkserver", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.start_env,
        )
        self._lock = threading.Lock()
        self._next = 0
        self._spawned: dict[int, threading.Event] = {}
        self._pids: dict[int, int] = {}
        self._by_pid: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()
        if not self._ready.wait(ready_timeout_s):
            self.close()
            raise RuntimeError("fork server not ready")

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self._proc.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        """Write one request line."""
        stdin: IO[bytes] | None = self._proc.stdin
        assert stdin is not None
        with self._lock:
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdout: Path,
        stderr: Path,
        *,
        module: str,
        stdin: Path | None = None,
        cwd: Path | None = None,
    ) -> ForkedProcess:
        """Fork ``python -m MODULE ARGV`` with exactly ``env``; output appended to the files.

        Raises:
            RuntimeError: the server did not answer within 30 s.
        """
        with self._lock:
            self._next += 1
            rid = self._next
            self._spawned[rid] = threading.Event()
        self.send(
            {"op": "spawn", "id": rid, "module": module, "argv": list(argv), "env": dict(env),
             "stdout": str(stdout), "stderr": str(stderr),
             "stdin": str(stdin) if stdin else None, "cwd": str(cwd) if cwd else None}
        )  # fmt: skip
        if not self._spawned[rid].wait(30.0):
            raise RuntimeError("fork server did not answer")
        with self._lock:
            pid = self._pids.pop(rid)
            del self._spawned[rid]
            proc = ForkedProcess(self, pid, stdout)
            self._by_pid[pid] = proc
            early = self._early.pop(pid, None)
        if early is not None:
            self._finish(proc, early)
        return proc

    def run(
        self,
        module: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout: float | None = None,
        cwd: Path | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Fork ``python -m MODULE ARGV``, wait, return it as ``subprocess.run`` would (text).

        Args:
            module: the module to run as ``__main__``.
            argv: its arguments (``sys.argv[1:]``).
            env: its whole environment.
            cwd: its working directory (default: the server's).
            timeout: seconds to wait before the child is SIGKILLed.
            input: text for its stdin (default: ``/dev/null``).

        Raises:
            subprocess.TimeoutExpired: the child outlived ``timeout`` (it was killed).
        """
        with tempfile.TemporaryDirectory(prefix="eg-fork-") as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            stdin = None
            if input is not None:
                stdin = Path(tmp, "in")
                stdin.write_text(input)
            proc = self.spawn(argv, env, out, err, module=module, stdin=stdin, cwd=cwd)
            code = proc.wait(timeout)
            if code is None:
                proc.kill()
                proc.wait(30)
                raise subprocess.TimeoutExpired(
                    [sys.executable, "-m", module, *argv], timeout or 0.0,
                    out.read_bytes() if out.exists() else b"",
                    err.read_bytes() if err.exists() else b"",
                )  # fmt: skip
            stdout = out.read_text(errors="replace") if out.exists() else ""
            stderr = err.read_text(errors="replace") if err.exists() else ""
        return subprocess.CompletedProcess(
            [sys.executable, "-m", module, *argv], code, stdout, stderr
        )

    @staticmethod
    def _finish(proc: ForkedProcess, code: int) -> None:
        proc.returncode = code
        proc.done.set()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            message = json.loads(raw)
            if message.get("event") == "ready":
                self._ready.set()
            elif "id" in message:
                with self._lock:
                    self._pids[message["id"]] = message["pid"]
                    event = self._spawned[message["id"]]
                event.set()
            else:
                with self._lock:
                    proc = self._by_pid.pop(message["pid"], None)
                    if proc is None:  # ended before spawn() registered it
                        self._early[message["pid"]] = message["code"]
                if proc is not None:
                    self._finish(proc, message["code"])

    def close(self) -> None:
        """Stop the server (it SIGKILLs any child still running)."""
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:] or DEFAULT_PRELOAD))
