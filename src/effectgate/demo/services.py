"""Start, fault and inspect the demo's external systems from tests, notebooks and the CLI.

``DemoServices`` runs the ticket service and the mail sink as subprocesses
(``sys.executable -m ...``) bound to loopback, with their SQLite files and
logs under one ``data_dir``; restarting on the same ``data_dir`` sees the
same world (only the ports change). ``read_tickets`` / ``read_mails`` read
those files directly: they are the oracle for "did it happen?" and work while
a server is down.

Example::

    with DemoServices(tmp_path) as services:
        endpoints = services.endpoints
        services.set_fault("tickets", "timeout-after-commit", delay_s=1)
        ...
        assert len(services.tickets()) == 1
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import httpx

from effectgate._process import new_worker_id, owner_is_gone
from effectgate._untrusted import parse_json, read_regular_file
from effectgate.demo._faults import ADMIN_TOKEN_HEADER, bind_address, write_ready_file
from effectgate.errors import ConfigError, ServiceStartError

__all__ = [
    "DemoServices",
    "ServiceEndpoints",
    "answering",
    "endpoints_from_env",
    "published_endpoints",
    "read_mails",
    "read_tickets",
    "running_endpoints",
    "serving",
]

Service = Literal["tickets", "mail"]

DEMO_ERROR_RATE = 0.12
"""The orders error rate a fresh demo world starts with (above the incident's 5% threshold)."""
TICKETS_DB = "tickets.sqlite3"
MAIL_DB = "mail.sqlite3"
ENDPOINTS_FILE = "endpoints.json"
SERVICES_ENV = "EFFECTGATE_SERVICES"
"""Names the demo services a served graph uses: ``demo`` or a JSON object of addresses."""
_OWNER = "owner"  # endpoints.json: the worker id of the process that started the servers
_MODULES: dict[str, str] = {
    "tickets": "effectgate.demo.ticket_service",
    "mail": "effectgate.demo.mail_sink",
}
_DBS: dict[str, str] = {"tickets": TICKETS_DB, "mail": MAIL_DB}
_STOP_GRACE_S = 5.0
_POLL_S = 0.02
_ADMIN_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceEndpoints:
    """Where the running demo services listen."""

    ticket_url: str
    """Base URL of the ticket service, e.g. ``"http://127.0.0.1:PORT"``."""
    smtp_host: str
    """Host of the mail sink's SMTP server (loopback)."""
    smtp_port: int
    """TCP port of the mail sink's SMTP server."""
    mail_url: str
    """Base URL of the mail sink's HTTP API, e.g. ``"http://127.0.0.1:PORT"``."""


ServiceEndpoints.__module__ = "effectgate.demo"


def read_tickets(data_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every ticket from the ticket service's own SQLite file under ``data_dir``.

    Returns:
        Tickets ordered by id, as the API shapes them; ``[]`` before the first start.
    """
    from effectgate.demo.ticket_service import read_tickets_db

    return read_tickets_db(Path(data_dir) / TICKETS_DB)


def service_data_exists(data_dir: str | os.PathLike[str], service: Service) -> bool:
    """Whether ``service`` ("tickets" or "mail") has ever stored anything under ``data_dir``."""
    return (Path(data_dir) / _DBS[service]).is_file()


def read_error_rate(data_dir: str | os.PathLike[str], service_name: str) -> float | None:
    """Read the error rate stored for ``service_name`` in the ticket service's own file.

    Returns:
        The fraction, or ``None`` if none was ever stored (the service then reports 0.0).
    """
    from effectgate.demo.ticket_service import read_error_rate_db

    return read_error_rate_db(Path(data_dir) / TICKETS_DB, service_name)


def read_mails(data_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every delivered message from the mail sink's own SQLite file under ``data_dir``.

    Returns:
        Messages oldest first, as ``GET /messages`` shapes them; ``[]`` before the first start.
    """
    from effectgate.demo.mail_sink import read_mails_db

    return read_mails_db(Path(data_dir) / MAIL_DB)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(slots=True)
class _Running:
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    ready: dict[str, Any]


class DemoServices:
    """The ticket service and the mail sink, as child processes on loopback.

    Children also exit when this process dies (they watch their parent pid),
    and ``stop`` runs at interpreter exit, so tests never leak servers.

    Args:
        data_dir: directory for ``tickets.sqlite3``, ``mail.sqlite3``, ``*.log``
            and ``endpoints.json``; created if missing.
        host: loopback address both servers bind.
        startup_timeout: seconds to wait for each server's ready file.

    Raises:
        ConfigError: ``host`` is not loopback.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        startup_timeout: float = 15.0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = bind_address(host)
        self.startup_timeout = startup_timeout
        self._running: dict[str, _Running] = {}
        self._endpoints: ServiceEndpoints | None = None

    def start(self) -> ServiceEndpoints:
        """Start both servers, wait until they listen, and write ``endpoints.json``.

        Returns:
            The endpoints of the running servers.

        Raises:
            RuntimeError: a server exited or did not get ready within ``startup_timeout``.
        """
        if self._endpoints is not None:
            return self._endpoints
        self.data_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            for service in _MODULES:
                self._running[service] = self._launch(service)
        except BaseException:
            self.stop()
            raise
        return self._publish()

    def stop(self) -> None:
        """Terminate both servers (SIGTERM, then SIGKILL after a grace period); idempotent.

        ``endpoints.json`` is removed only while it still names these servers
        (a stale one would point people at ports nobody listens on); one that
        names another instance's servers is left alone.
        """
        for service in list(self._running):
            self._halt(service)
        if self._endpoints is not None:
            path = self.data_dir / ENDPOINTS_FILE
            if _read_endpoints(path) == self._endpoints:
                path.unlink(missing_ok=True)
        self._endpoints = None
        atexit.unregister(self.stop)

    def __enter__(self) -> DemoServices:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def endpoints(self) -> ServiceEndpoints:
        """The running servers' endpoints.

        Raises:
            RuntimeError: the services are not started.
        """
        if self._endpoints is None:
            raise RuntimeError("DemoServices is not started; call start() first")
        return self._endpoints

    def restart(self, service: Service) -> ServiceEndpoints:
        """Start ``service`` again on the same data (after a crash, or stopping it first).

        Returns:
            The new endpoints (the restarted server listens on a new port).

        Raises:
            RuntimeError: the services are not started, or the server did not get ready.
        """
        self.endpoints  # noqa: B018 - raises when not started
        self._halt(service)
        self._running[service] = self._launch(service)
        return self._publish()

    def alive(self, service: Service) -> bool:
        """Return whether ``service``'s process is running."""
        running = self._running.get(service)
        return running is not None and running.process.poll() is None

    def set_fault(
        self,
        service: Service,
        mode: str = "normal",
        *,
        lookups: str = "ok",
        delay_s: float | None = None,
        retry_after_s: int | None = None,
        times: int | None = None,
    ) -> None:
        """Replace ``service``'s fault at runtime (``POST /_admin/fault``); None = default.

        Args:
            service: ``"tickets"`` or ``"mail"``.
            mode: a ``FaultMode`` value, e.g. ``"timeout-after-commit"``.
            lookups: ``"ok"`` or ``"unavailable"``.
            delay_s: seconds for ``slow`` and the hold of ``timeout-after-commit`` (default 10).
            retry_after_s: seconds announced in ``Retry-After`` (default 1).
            times: requests an ``-after-commit`` / ``transient-once`` fault lasts (default 1).

        Raises:
            httpx.HTTPStatusError: the server refused the fault (unknown mode, bad value).
        """
        payload: dict[str, Any] = {"mode": str(mode), "lookups": lookups}
        optional = {"delay_s": delay_s, "retry_after_s": retry_after_s, "times": times}
        payload.update({key: value for key, value in optional.items() if value is not None})
        self._admin("POST", service, "/_admin/fault", payload)

    def set_error_rate(self, service_name: str, rate: float) -> None:
        """Set the error rate the ticket service reports for ``service_name`` (fraction 0..1)."""
        body = {"service": service_name, "error_rate": rate}
        self._admin("PUT", "tickets", "/metrics/error_rate", body)

    def tickets(self) -> list[dict[str, Any]]:
        """Read every ticket from the ticket service's own SQLite file (works while down)."""
        return read_tickets(self.data_dir)

    def mails(self) -> list[dict[str, Any]]:
        """Read every delivered message from the sink's own SQLite file (works while down)."""
        return read_mails(self.data_dir)

    def stats(self, service: Service) -> dict[str, Any]:
        """Return ``GET /_admin/stats`` of ``service``.

        Tickets: ``{"create_requests", "tickets"}``; mail: ``{"data_commands", "messages"}``.
        """
        result: dict[str, Any] = self._admin("GET", service, "/_admin/stats", None)
        return result

    def _admin(self, method: str, service: Service, path: str, body: Any) -> Any:
        endpoints = self.endpoints
        base = endpoints.ticket_url if service == "tickets" else endpoints.mail_url
        token = str(self._running[service].ready.get("admin_token", ""))
        response = httpx.request(
            method,
            base + path,
            json=body,
            headers={ADMIN_TOKEN_HEADER: token},
            timeout=_ADMIN_TIMEOUT_S,
        )
        response.raise_for_status()
        return response.json()

    def _launch(self, service: str) -> _Running:
        # Each launch waits on its own ready file: two processes starting the
        # services on one data dir (two `effectgate resume` at once) must not
        # delete or overwrite each other's. ``<service>.ready.json`` is then
        # published as a copy, for people and tests, by ``_publish``.
        ready_file = self.data_dir / f".{service}.{os.getpid()}.{uuid.uuid4().hex[:8]}.ready.json"
        ports = (
            ["--port", "0"] if service == "tickets" else ["--smtp-port", "0", "--http-port", "0"]
        )
        command = [
            sys.executable,
            "-m",
            _MODULES[service],
            "--db",
            str(self.data_dir / _DBS[service]),
            "--host",
            self.host,
            *ports,
            "--ready-file",
            str(ready_file),
            "--parent-pid",
            str(os.getpid()),
        ]
        log = (self.data_dir / f"{service}.log").open("ab")
        # A new session keeps a terminal's Ctrl-C (sent to the whole foreground
        # process group) away from the services: the agent stops at a step
        # boundary while the outside world stays up. They still exit with us:
        # they watch our pid.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        running = _Running(process=process, log=log, ready={})
        try:
            running.ready = self._await_ready(service, process, ready_file)
        except BaseException:
            self._terminate(running)
            raise
        finally:
            ready_file.unlink(missing_ok=True)
        return running

    def _await_ready(
        self, service: str, process: subprocess.Popen[bytes], ready_file: Path
    ) -> dict[str, Any]:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if ready_file.exists():
                ready: dict[str, Any] = json.loads(ready_file.read_text(encoding="utf-8"))
                if ready.get("pid") == process.pid:
                    return ready
            if process.poll() is not None:
                raise ServiceStartError(
                    f"{service} server exited with status {process.returncode} before it was "
                    f"ready; see {self.data_dir / (service + '.log')}"
                )
            time.sleep(_POLL_S)
        raise ServiceStartError(f"{service} server not ready within {self.startup_timeout} s")

    def _publish(self) -> ServiceEndpoints:
        """Take the servers' endpoints and publish them in ``endpoints.json``.

        Not over a file that names another instance's servers still
        answering (an ``effectgate services`` that workers read the file
        from): a run that starts services of its own for a moment (``resume
        --with-services``, ``reconcile``) must not send them to ports that
        close when it ends. Both instances serve the same data files.
        """
        previous = self._endpoints
        tickets, mail = self._running["tickets"].ready, self._running["mail"].ready
        self._endpoints = ServiceEndpoints(
            ticket_url=_url(self.host, int(tickets["port"])),
            smtp_host=self.host,
            smtp_port=int(mail["smtp_port"]),
            mail_url=_url(self.host, int(mail["http_port"])),
        )
        path = self.data_dir / ENDPOINTS_FILE
        found = _read_endpoints(path)
        if found is None or found == previous or not serving(self.data_dir, found):
            # the owner: a reader must not adopt servers whose process is gone
            # (they exit within _PARENT_POLL_S of it, still answering until then)
            published = {**dataclasses.asdict(self._endpoints), _OWNER: new_worker_id()}
            write_ready_file(path, published)
            # The ready copies (pid, ports, admin token) go with the addresses:
            # another instance's stay while its servers answer.
            for service, running in self._running.items():
                write_ready_file(self.data_dir / f"{service}.ready.json", running.ready)
        return self._endpoints

    def _halt(self, service: str) -> None:
        running = self._running.pop(service, None)
        if running is not None:
            self._terminate(running)
            copy = self.data_dir / f"{service}.ready.json"
            with contextlib.suppress(OSError, ValueError):
                # only our own copy: another instance's names its own pid
                if json.loads(copy.read_text(encoding="utf-8")).get("pid") == running.process.pid:
                    copy.unlink()

    @staticmethod
    def _terminate(running: _Running) -> None:
        process = running.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(OSError):
            running.log.close()


def _read_published(path: Path) -> dict[str, Any] | None:
    """An ``endpoints.json`` as a dict, or ``None`` (missing or not a JSON object)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_endpoints(path: Path) -> ServiceEndpoints | None:
    """The endpoints an ``endpoints.json`` names, or ``None`` (missing or not readable)."""
    data = _read_published(path)
    if data is None:
        return None
    data.pop(_OWNER, None)
    try:
        return ServiceEndpoints(**data)
    except TypeError:
        return None


def published_endpoints(data_dir: str | os.PathLike[str]) -> ServiceEndpoints | None:
    """The addresses ``endpoints.json`` in ``data_dir`` publishes, read strictly, not probed.

    ``DemoServices.start`` (``effectgate services``, or a command's own
    instance) writes the file; ``effectgate worker`` and ``resume`` read it
    to send the tools' requests to the servers already running for the state
    directory. Pair it with ``answering``: a server killed with ``kill -9``
    leaves the file behind.

    Args:
        data_dir: the services' data directory (``<state dir>/services``).

    Returns:
        The endpoints, or ``None`` when there is no such file.

    Raises:
        ConfigError: the file exists but is not a regular file, not UTF-8
            JSON, not an object of the four fields with their types, or its
            ``smtp_port`` is outside 1 to 65535.
    """
    path = Path(data_dir) / ENDPOINTS_FILE
    if not os.path.lexists(path):
        return None
    fields = {"ticket_url": str, "smtp_host": str, "smtp_port": int, "mail_url": str}
    optional = {_OWNER: str}
    try:
        data = parse_json(read_regular_file(path))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(
            f"{path}: cannot be read ({why}); run 'effectgate services' again or remove it"
        ) from None
    if (
        not isinstance(data, dict)
        or not set(fields) <= set(data) <= set(fields) | set(optional)
        or not all(
            isinstance(data[k], t) and not isinstance(data[k], bool)
            for k, t in {**fields, **optional}.items()
            if k in data
        )
    ):
        raise ConfigError(
            f"{path}: not the demo services' addresses (an object with "
            f"{', '.join(fields)}); run 'effectgate services' again or remove it"
        )
    if not 1 <= data["smtp_port"] <= 65535:
        raise ConfigError(
            f"{path}: smtp_port {data['smtp_port']} is not a TCP port (1 to 65535); "
            "run 'effectgate services' again or remove it"
        )
    return ServiceEndpoints(**{k: data[k] for k in fields})


def running_endpoints(data_dir: str | os.PathLike[str]) -> ServiceEndpoints | None:
    """The demo services already running on ``data_dir`` (its ``endpoints.json``), if they answer.

    As ``effectgate worker`` does: one world, one set of servers, so a fault
    or a metric set on ``effectgate services`` is what a command's calls
    meet. A damaged or stale file is no error here (``None``): a command then
    starts its own servers, which write the file again.
    """
    try:
        found = published_endpoints(data_dir)
    except ConfigError:
        return None
    return found if found is not None and serving(data_dir, found) else None


def endpoints_from_env(value: str | None) -> ServiceEndpoints | Literal["demo"] | None:
    """Read ``EFFECTGATE_SERVICES``: the one reader of that variable.

    The served graph (``effectgate.server``) starts its tools from it, and
    ``effectgate reconcile --failed`` asks the same services whether the
    effect took place, so both read it here.

    Args:
        value: the variable's value; ``None`` or empty when it is unset.

    Returns:
        ``None`` when unset; ``"demo"`` when the process is to start the demo
        services in its state directory; else the addresses of services
        someone else runs.

    Raises:
        ConfigError: neither ``demo`` nor a JSON object of exactly
            ``ticket_url``, ``smtp_host``, ``smtp_port`` (an integer) and
            ``mail_url``.
    """
    if not value:
        return None
    if value.strip() == "demo":
        return "demo"
    try:
        given = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"{SERVICES_ENV}: neither 'demo' nor a JSON object: {exc}") from exc
    fields = ("ticket_url", "smtp_host", "smtp_port", "mail_url")
    if not isinstance(given, dict) or sorted(given) != sorted(fields):
        raise ConfigError(f"{SERVICES_ENV}: a JSON object needs exactly {', '.join(fields)}")
    if not isinstance(given["smtp_port"], int) or isinstance(given["smtp_port"], bool):
        raise ConfigError(f"{SERVICES_ENV}: smtp_port must be an integer")
    return ServiceEndpoints(
        ticket_url=str(given["ticket_url"]),
        smtp_host=str(given["smtp_host"]),
        smtp_port=given["smtp_port"],
        mail_url=str(given["mail_url"]),
    )


def serving(
    data_dir: str | os.PathLike[str], endpoints: ServiceEndpoints, timeout_s: float = 0.5
) -> bool:
    """Whether the servers a published ``endpoints.json`` names may be used by another process.

    The one test ``effectgate worker``, ``resume`` and ``DemoServices`` apply
    to a file they did not write: the process that started the servers is
    not proven gone (the file records it; ``effectgate._process.owner_is_gone``)
    and both servers answer (``answering``). The owner check closes a race the
    probe alone leaves open: servers whose owner was just killed exit only
    when their parent watchdog next looks (within a quarter of a second), and
    answer until then, so a command started right after a ``kill -9`` would
    send its calls to servers about to vanish.

    Args:
        data_dir: the services' data directory (``<state dir>/services``).
        endpoints: the addresses read from its ``endpoints.json``.
        timeout_s: seconds each probe may take.

    Returns:
        False when the file's owner is proven gone or a server does not answer.
    """
    data = _read_published(Path(data_dir) / ENDPOINTS_FILE)
    owner = data.get(_OWNER) if data is not None else None
    if isinstance(owner, str) and owner_is_gone(owner):
        return False
    return answering(endpoints, timeout_s)


def answering(endpoints: ServiceEndpoints, timeout_s: float = 0.5) -> bool:
    """Whether the three servers ``endpoints`` names answer at all.

    The one probe of a published ``endpoints.json``: ``DemoServices`` asks it
    before writing over another instance's file, and ``effectgate worker``
    before trusting the file (an ``effectgate services`` killed with ``kill
    -9`` leaves it behind, naming ports nothing listens on).

    Args:
        endpoints: the addresses to probe: ``ticket_url`` and ``mail_url``
            (any HTTP status), and the SMTP server at ``smtp_host:smtp_port``
            (its ``220`` greeting; the mail tools send there).
        timeout_s: seconds each probe may take (connect and read).

    Returns:
        True when all three answered; False when one refused, timed out or
        broke the exchange (no exception escapes).
    """
    for url in (endpoints.ticket_url, endpoints.mail_url):
        try:
            httpx.get(url + "/", timeout=timeout_s)
        except httpx.HTTPError:
            return False
    try:
        with socket.create_connection(
            (endpoints.smtp_host, endpoints.smtp_port), timeout=timeout_s
        ) as conn:
            return conn.recv(3) == b"220"
    except (OSError, OverflowError, ValueError):  # refused, timed out, a port out of range
        return False
