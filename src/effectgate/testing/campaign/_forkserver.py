"""A fork server: import LangGraph once, then fork each worker process from that image.

A campaign worker spends about 2 s importing LangChain/LangGraph and well
under 1 s running. The server (``python -m effectgate.testing.campaign._forkserver``)
pays the imports once and stays single-threaded; each request forks a
child that resets its environment, reseeds ``random``, redirects its
output to files and runs ``_worker.main``. The child is an ordinary
separate OS process: it is SIGKILLed, exits 137 at failpoints and leaves
its files behind exactly as ``python -m ...`` would. The server reaps every
child at once, so a killed worker never lingers as a zombie (a zombie would
look alive to effectgate's lease takeover).

Protocol, one JSON object per line. Requests on stdin:
``{"op": "spawn", "id", "argv", "env", "stdout", "stderr"}`` and
``{"op": "kill", "pid"}`` (ignored once the child was reaped, so a reused
pid is never hit). Replies on stdout: ``{"id", "pid"}`` after a fork and
``{"pid", "code"}`` when a child ends (``code`` as ``Popen.returncode``:
negative for a signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

__all__ = ["ForkServer", "ForkedProcess", "serve"]

_POLL_S = 0.005


# --- server side --------------------------------------------------------------------------


def _child(request: dict[str, Any]) -> None:
    """Become the worker: fresh environment and output files, run, exit; never returns."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # the forked image shares the server's random state
        from effectgate.testing.campaign._worker import main

        code = main(list(request["argv"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must report and exit, never return
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
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
            os.kill(request["pid"], signal.SIGKILL)
        return
    pid = os.fork()
    if pid == 0:
        _child(request)
    live.add(pid)
    _reply({"id": request["id"], "pid": pid})


def serve() -> int:
    """Import everything, say READY, fork workers on request until stdin closes."""
    from effectgate.testing.campaign._worker import import_everything

    import_everything()
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
    """A worker forked by the server; its output is in files."""

    def __init__(self, server: ForkServer, pid: int, stdout: Path) -> None:
        self.server = server
        self.pid = pid
        self.stdout = stdout
        self.done = threading.Event()
        self.returncode: int | None = None

    def kill(self) -> None:
        """SIGKILL the worker unless it has already ended."""
        self.server.send({"op": "kill", "pid": self.pid})

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the end; return the exit code, or None on timeout."""
        self.done.wait(timeout)
        return self.returncode


class ForkServer:
    """Start the server process and hand out ``ForkedProcess``es; thread-safe."""

    def __init__(self, ready_timeout_s: float = 120.0) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "effectgate.testing.campaign._forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
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

    def send(self, message: dict[str, Any]) -> None:
        """Write one request line."""
        stdin: IO[bytes] | None = self._proc.stdin
        assert stdin is not None
        with self._lock:
            stdin.write((json.dumps(message) + "\n").encode())
            stdin.flush()

    def spawn(
        self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path
    ) -> ForkedProcess:
        """Fork a worker running ``_worker.main(argv)`` with exactly ``env``."""
        with self._lock:
            self._next += 1
            rid = self._next
            self._spawned[rid] = threading.Event()
        self.send(
            {"op": "spawn", "id": rid, "argv": argv, "env": env,
             "stdout": str(stdout), "stderr": str(stderr)}
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
        """Stop the server (it SIGKILLs any worker still running)."""
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
    sys.exit(serve())
