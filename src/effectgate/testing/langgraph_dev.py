"""Start and stop ``langgraph dev`` serving the effectgate agent, for tests and notebooks.

``LangGraphDev`` runs the LangGraph development server (the in-memory runtime
of ``langgraph-cli[inmem]``, the ``server`` extra) as a child process on
127.0.0.1 and a free port, in its own working directory with its own
``langgraph.json``, against a state directory and demo services you name. It
is what ``tests/server`` and the served notebook use, so both drive the same
setup only through ``langgraph_sdk``:

```python
with DemoServices(sd.services) as svc, LangGraphDev(workdir, sd.root, svc.endpoints) as srv:
    client = get_sync_client(url=srv.url)
```

The server runs in its own session (process group); ``stop`` ends that group
(SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``), at the end of a ``with``
block and, failing that, at the owner's interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from effectgate.demo.services import ServiceEndpoints

__all__ = ["GRAPH", "STOP_TIMEOUT_S", "LangGraphDev", "free_port"]

GRAPH = "effectgate.server:make_graph"
"""The graph factory ``langgraph.json`` names (assistant id ``effectgate``)."""
START_TIMEOUT_S = 90.0
"""Seconds to wait for ``GET /ok`` after starting the server (it imports LangGraph first)."""
STOP_TIMEOUT_S = 20.0
"""Seconds ``stop`` waits after SIGTERM before it sends SIGKILL."""


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LangGraphDev:
    """One ``langgraph dev`` process serving the effectgate agent; restartable on the same state.

    Args:
        workdir: the server's working directory (created if missing): its
            ``langgraph.json``, ``server.log`` and the runtime's ``.langgraph_api``.
        state_dir: the effectgate state directory (``EFFECTGATE_STATE_DIR``).
        endpoints: the demo services the agent's ticket and mail tools reach
            (``EFFECTGATE_SERVICES``); ``None``: file and shell tools only.
        dependencies: ``langgraph.json`` dependencies (paths added for the
            graph's import); effectgate itself must be importable already.
        executable: the ``langgraph`` script; default: beside ``sys.executable``.
        graphs: more graphs to serve, assistant id -> ``module:factory`` (as
            ``langgraph.json`` names them), beside ``effectgate``.

    Raises:
        FileNotFoundError: at ``start``, when the ``langgraph`` script is missing
            (install the ``server`` extra).
    """

    def __init__(
        self,
        workdir: Path,
        state_dir: Path,
        endpoints: ServiceEndpoints | None = None,
        *,
        dependencies: Sequence[str] = (".",),
        executable: Path | None = None,
        graphs: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = Path(state_dir)
        self.endpoints = endpoints
        self.executable = executable or Path(sys.executable).with_name("langgraph")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        served = {"effectgate": GRAPH, **(graphs or {})}
        config = {"dependencies": list(dependencies), "graphs": served}
        (self.workdir / "langgraph.json").write_text(json.dumps(config))
        atexit.register(self.stop)  # no server outlives its owner's interpreter

    @property
    def url(self) -> str:
        """The server's base URL, for ``langgraph_sdk.get_client(url=...)``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, **env: str) -> None:
        """Start the server and wait until it answers ``GET /ok``.

        Args:
            env: extra environment variables (e.g. ``EFFECTGATE_FAILPOINT``);
                an inherited ``EFFECTGATE_FAILPOINT`` is dropped unless given here.

        Raises:
            FileNotFoundError: the ``langgraph`` script is missing.
            RuntimeError: the server exited, or did not answer within
                ``START_TIMEOUT_S``; the message ends with its log's tail.
        """
        if not self.executable.exists():
            raise FileNotFoundError(
                f"{self.executable} is missing: install the server extra (langgraph-cli[inmem])"
            )
        full = {
            **os.environ,
            "EFFECTGATE_STATE_DIR": str(self.state_dir),
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGSMITH_TRACING": "false",
        }
        full.pop("EFFECTGATE_FAILPOINT", None)
        full.pop("EFFECTGATE_SERVICES", None)
        if self.endpoints is not None:
            full["EFFECTGATE_SERVICES"] = json.dumps(
                {
                    "ticket_url": self.endpoints.ticket_url,
                    "smtp_host": self.endpoints.smtp_host,
                    "smtp_port": self.endpoints.smtp_port,
                    "mail_url": self.endpoints.mail_url,
                }
            )
        full.update(env)
        with (self.workdir / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.executable),
                    "dev",
                    "--no-browser",
                    "--no-reload",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                cwd=self.workdir,
                env=full,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"langgraph dev exited: {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"langgraph dev did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        """Return what the server printed so far (all starts, appended)."""
        path = self.workdir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_dead(self, timeout: float = 60) -> int:
        """Wait for the server to exit on its own (a failpoint) and return its exit status.

        Raises:
            subprocess.TimeoutExpired: it still runs after ``timeout`` seconds.
        """
        assert self.proc is not None, "the server was never started"
        code = self.proc.wait(timeout=timeout)
        self._reap()
        return code

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reap()

    def _reap(self) -> None:
        # Whatever is left of the server's process group (children it started).
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def __enter__(self) -> LangGraphDev:
        """Start the server (``start()`` with no extra environment)."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()
