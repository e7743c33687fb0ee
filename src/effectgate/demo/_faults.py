"""Fault injection and the plumbing both demo servers share.

The ticket service and the mail sink are stand-ins for external systems
(the external systems): they own their storage, so "did it happen?" is
answered by their SQLite files and never by effectgate's own code. This module
holds what they have in common:

- ``FaultState``: the runtime-settable fault (mode, lookups, delay, times),
  consumed once per create request / DATA command;
- loopback checking, atomic ready files and a parent watchdog;
- SQLite connections (WAL, ``synchronous=FULL``) and numbered migrations;
- a JSON request handler base for ``http.server``.

The usual fault scenario names map onto ``FaultMode`` values one to one, except
``crash-after-commit``, which is ``server-crash-after-commit`` here.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import ipaddress
import json
import os
import secrets
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from effectgate.errors import ConfigError

__all__ = [
    "Action",
    "FaultDecision",
    "FaultMode",
    "FaultState",
    "HttpProblem",
    "JsonRequestHandler",
    "bind_address",
    "check_loopback",
    "connect_db",
    "migrate",
    "utc_now_iso",
    "watch_parent",
    "write_ready_file",
]

BUSY_TIMEOUT_S = 10.0
"""How long a writer waits for SQLite's write lock, in seconds."""

_PARENT_POLL_S = 0.25


class FaultMode(enum.StrEnum):
    """What the next create request (ticket service) or DATA command (mail sink) meets."""

    NORMAL = "normal"
    """Process normally."""
    REJECT = "reject"
    """Refuse for good (422 / SMTP 550); nothing stored. Stays until changed."""
    UNAVAILABLE = "unavailable"
    """Refuse for now (503 + Retry-After / SMTP 451); nothing stored. Stays until changed."""
    TRANSIENT_ONCE = "transient-once"
    """Like ``unavailable`` for ``times`` requests, then ``normal``."""
    TIMEOUT_AFTER_COMMIT = "timeout-after-commit"
    """Commit, hold the connection ``delay_s`` without answering, close it; ``times`` requests."""
    RESET_AFTER_COMMIT = "reset-after-commit"
    """Commit, then drop the connection without answering; ``times`` requests."""
    SERVER_CRASH_AFTER_COMMIT = "server-crash-after-commit"
    """Commit, then ``os._exit(1)`` the server process."""
    AMBIGUOUS_UNQUERYABLE = "ambiguous-unqueryable"
    """``timeout-after-commit``, and lookups stay unavailable until the fault is set again."""
    SLOW = "slow"
    """Sleep ``delay_s`` before processing, then process normally. Stays until changed.

    A client that gives up during the sleep meets two behaviours: the ticket
    service still commits when the sleep ends (HTTP servers do not notice a
    hang-up), while the mail sink's session is cancelled and nothing is stored.
    """


class Action(enum.StrEnum):
    """What one request must do, decided (and counted) by ``FaultState.next_action``."""

    PROCEED = "proceed"
    SLOW = "slow"
    REJECT = "reject"
    UNAVAILABLE = "unavailable"
    HOLD_AFTER_COMMIT = "hold-after-commit"
    RESET_AFTER_COMMIT = "reset-after-commit"
    CRASH_AFTER_COMMIT = "crash-after-commit"


_ACTION_OF_MODE: Mapping[FaultMode, Action] = {
    FaultMode.NORMAL: Action.PROCEED,
    FaultMode.REJECT: Action.REJECT,
    FaultMode.UNAVAILABLE: Action.UNAVAILABLE,
    FaultMode.TRANSIENT_ONCE: Action.UNAVAILABLE,
    FaultMode.TIMEOUT_AFTER_COMMIT: Action.HOLD_AFTER_COMMIT,
    FaultMode.RESET_AFTER_COMMIT: Action.RESET_AFTER_COMMIT,
    FaultMode.SERVER_CRASH_AFTER_COMMIT: Action.CRASH_AFTER_COMMIT,
    FaultMode.AMBIGUOUS_UNQUERYABLE: Action.HOLD_AFTER_COMMIT,
    FaultMode.SLOW: Action.SLOW,
}
# Modes that wear off after `times` requests; the others stay until changed.
_COUNTED = frozenset(
    {
        FaultMode.TRANSIENT_ONCE,
        FaultMode.TIMEOUT_AFTER_COMMIT,
        FaultMode.RESET_AFTER_COMMIT,
        FaultMode.SERVER_CRASH_AFTER_COMMIT,
        FaultMode.AMBIGUOUS_UNQUERYABLE,
    }
)
_LOOKUPS = ("ok", "unavailable")
_FAULT_KEYS = frozenset({"mode", "lookups", "delay_s", "retry_after_s", "times"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultDecision:
    """The fault one request meets."""

    action: Action
    delay_s: float
    """Seconds to sleep (``SLOW``) or to hold the connection (``HOLD_AFTER_COMMIT``)."""
    retry_after_s: int
    """Seconds to announce in ``Retry-After`` (``UNAVAILABLE``)."""


class HttpProblem(Exception):
    """A request the demo server answers with an error status and JSON body."""

    def __init__(self, *, status: int, error: str, detail: str = "") -> None:
        self.status = status
        self.error = error
        self.detail = detail
        super().__init__(f"{status} {error}: {detail}" if detail else f"{status} {error}")

    def payload(self) -> dict[str, str]:
        """Return the JSON error body."""
        return (
            {"error": self.error, "detail": self.detail} if self.detail else {"error": self.error}
        )


class FaultState:
    """The fault a server applies, settable at runtime and safe across threads.

    State is in memory only: a restarted server starts ``normal`` with lookups ``ok``.
    """

    DEFAULT_DELAY_S = 10.0
    DEFAULT_RETRY_AFTER_S = 1
    DEFAULT_TIMES = 1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mode = FaultMode.NORMAL
        self._lookups_ok = True
        self._delay_s = self.DEFAULT_DELAY_S
        self._retry_after_s = self.DEFAULT_RETRY_AFTER_S
        self._times_left = self.DEFAULT_TIMES

    def configure(self, payload: Any) -> dict[str, Any]:
        """Replace the whole fault with ``payload``; missing fields take their defaults.

        Args:
            payload: ``{"mode", "lookups", "delay_s", "retry_after_s", "times"}``, all optional.

        Returns:
            The new state, as ``snapshot`` gives it.

        Raises:
            HttpProblem: 400, the payload has an unknown key or a bad value.
        """
        mode, lookups_ok, delay_s, retry_after_s, times = _parse_fault(payload)
        with self._lock:
            self._mode = mode
            # ambiguous-unqueryable: lookups stay down even after the timeouts wear off.
            self._lookups_ok = lookups_ok and mode is not FaultMode.AMBIGUOUS_UNQUERYABLE
            self._delay_s = delay_s
            self._retry_after_s = retry_after_s
            self._times_left = times
        return self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """Return the current fault; ``times`` is how many counted requests remain."""
        with self._lock:
            return {
                "mode": str(self._mode),
                "lookups": "ok" if self._lookups_ok else "unavailable",
                "delay_s": self._delay_s,
                "retry_after_s": self._retry_after_s,
                "times": self._times_left,
            }

    def lookups_available(self) -> bool:
        """Return whether lookups (by key / Message-ID) may answer."""
        with self._lock:
            return self._lookups_ok

    def next_action(self) -> FaultDecision:
        """Decide what the next create request / DATA command meets, and count it."""
        with self._lock:
            mode = self._mode
            if mode in _COUNTED:
                self._times_left -= 1
                if self._times_left <= 0:
                    self._mode = FaultMode.NORMAL
            return FaultDecision(
                action=_ACTION_OF_MODE[mode],
                delay_s=self._delay_s,
                retry_after_s=self._retry_after_s,
            )


def _parse_fault(payload: Any) -> tuple[FaultMode, bool, float, int, int]:
    if not isinstance(payload, dict):
        raise HttpProblem(status=400, error="invalid_fault", detail="body must be an object")
    unknown = set(payload) - _FAULT_KEYS
    if unknown:
        raise HttpProblem(
            status=400, error="invalid_fault", detail=f"unknown keys {sorted(unknown)}"
        )
    try:
        mode = FaultMode(payload.get("mode", "normal"))
    except ValueError:
        raise HttpProblem(
            status=400,
            error="invalid_fault",
            detail=f"mode must be one of {[str(m) for m in FaultMode]}",
        ) from None
    lookups = payload.get("lookups", "ok")
    if lookups not in _LOOKUPS:
        raise HttpProblem(
            status=400, error="invalid_fault", detail="lookups must be ok|unavailable"
        )
    delay_s = _number(payload, "delay_s", FaultState.DEFAULT_DELAY_S, minimum=0)
    retry_after_s = int(
        _number(payload, "retry_after_s", FaultState.DEFAULT_RETRY_AFTER_S, minimum=0)
    )
    times = int(_number(payload, "times", FaultState.DEFAULT_TIMES, minimum=1))
    return mode, lookups == "ok", float(delay_s), retry_after_s, times


def _number(payload: Mapping[str, Any], key: str, default: float, *, minimum: float) -> float:
    value = payload.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise HttpProblem(
            status=400, error="invalid_fault", detail=f"{key} must be a number >= {minimum}"
        )
    return float(value)


def check_loopback(host: str) -> str:
    """Refuse any host that is not loopback (127.0.0.0/8, ::1, localhost).

    Args:
        host: the address a server would bind.

    Returns:
        ``host`` unchanged.

    Raises:
        ConfigError: ``host`` is not a loopback address.
    """
    if host == "localhost":
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"refusing to bind {host!r}: the demo servers bind loopback only "
            "(127.0.0.0/8, ::1 or localhost)"
        )
    return host


def bind_address(host: str) -> str:
    """Return the one address to bind for a loopback ``host`` (``localhost`` -> 127.0.0.1).

    Binding ``localhost`` with port 0 could open 127.0.0.1 and ::1 on two
    different ports; one concrete address keeps "the port" well defined.
    """
    return "127.0.0.1" if check_loopback(host) == "localhost" else host


def write_ready_file(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file, fsync, rename)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(dict(payload), fh)
            fh.flush()
            os.fsync(fh.fileno())
        # A reader sees either no file or the whole JSON, never a prefix.
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def watch_parent(parent_pid: int | None) -> None:
    """Exit this process as soon as ``parent_pid`` is no longer its parent.

    A child is re-parented when its parent dies, even by SIGKILL, so polling
    ``os.getppid()`` keeps servers from outliving the test or notebook that
    started them. ``None`` disables the watchdog.
    """
    if parent_pid is None:
        return

    def _watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_PARENT_POLL_S)
        print(f"parent {parent_pid} is gone; exiting", file=sys.stderr, flush=True)
        os._exit(0)

    threading.Thread(target=_watch, name="parent-watchdog", daemon=True).start()


def connect_db(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open the server's SQLite file: autocommit mode, WAL, ``synchronous=FULL``, busy timeout."""
    conn = sqlite3.connect(
        os.fspath(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed row survives power loss, not only a process crash.
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def read_rows(
    db_path: str | os.PathLike[str], table: str, sql: str, params: Sequence[Any] = ()
) -> list[sqlite3.Row]:
    """Run one read on a server's SQLite file, straight from disk (the oracle's view).

    Works while the server is down; never creates, migrates or writes.

    Returns:
        The rows; ``[]`` when the file or ``table`` does not exist yet.
    """
    path = os.fspath(db_path)
    if not os.path.exists(path):
        return []
    with contextlib.closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)) as conn:
        conn.row_factory = sqlite3.Row
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        return [] if exists is None else conn.execute(sql, tuple(params)).fetchall()


def migrate(conn: sqlite3.Connection, migrations: Sequence[Sequence[str]]) -> int:
    """Apply the numbered migrations (index + 1 = version) above ``PRAGMA user_version``.

    Returns:
        The schema version after migrating.

    Raises:
        ConfigError: the database is newer than this build.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > len(migrations):
            raise ConfigError(
                f"database schema v{version} is newer than this build (v{len(migrations)})"
            )
        for statements in migrations[version:]:
            for statement in statements:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version={len(migrations)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(migrations)


def utc_now_iso() -> str:
    """Return the current UTC time as ISO 8601 with milliseconds and a ``Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


ADMIN_TOKEN_HEADER = "X-Effectgate-Admin-Token"
"""Header carrying the per-run admin token on requests that change a server's behaviour."""
ADMIN_TOKEN_ENV = "EFFECTGATE_DEMO_ADMIN_TOKEN"
"""A token given to a server in its environment; otherwise it makes up its own."""
MAX_BODY_BYTES = 1024 * 1024
"""Largest request body a demo server reads (bytes)."""
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def admin_token() -> str:
    """Return this server process's admin token: ``$EFFECTGATE_DEMO_ADMIN_TOKEN`` or a new one.

    The token is written into the ready file (created ``0600`` by
    ``write_ready_file``), so only the user who started the server, through
    ``DemoServices``, can change its faults or metrics.
    """
    return os.environ.get(ADMIN_TOKEN_ENV) or secrets.token_urlsafe(24)


def _loopback_host(value: str | None) -> bool:
    """Whether a ``Host`` header names a loopback address (with or without a port)."""
    if not value:
        return False
    host = value.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class QuietDisconnects:
    """``handle_error`` for a ``socketserver`` server: a client that left is one log line.

    A client killed mid-request (``kill -9`` is what the demos do) makes the
    handler's write fail with ``BrokenPipeError`` or ``ConnectionResetError``;
    ``socketserver.BaseServer.handle_error`` would print a traceback into the
    service's log for what is an expected event. Any other error keeps the
    standard traceback. Put it before the server class in the bases.
    """

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log ``ConnectionError``s as one line on stderr; defer the rest to the base class."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            host = client_address[0] if isinstance(client_address, tuple) else client_address
            sys.stderr.write(f"{host} - client went away mid-request ({type(exc).__name__})\n")
            sys.stderr.flush()
            return
        super().handle_error(request, client_address)  # type: ignore[misc]


class JsonRequestHandler(BaseHTTPRequestHandler):
    """``http.server`` handler with JSON helpers; HTTP/1.1 with Content-Length always set.

    Every request is checked before its handler runs (``parse_request``):

    - ``Host`` must name a loopback address, so a web page whose DNS name was
      rebound to 127.0.0.1 ("DNS rebinding") is answered 403, not served;
    - ``Content-Length``, when present, must be a decimal number up to
      ``MAX_BODY_BYTES``: anything else is answered 400 (413 when too large)
      and the connection closed, instead of a silent close;
    - requests in ``admin_requests`` (fault injection, metrics) need the
      server's per-run token in ``X-Effectgate-Admin-Token`` (403 otherwise). A
      custom header also makes a browser send a CORS preflight first, which
      these servers never answer, so a page cannot even try.
    """

    protocol_version = "HTTP/1.1"
    server_version = "effectgate-demo/1"
    admin_requests: frozenset[tuple[str, str]] = frozenset()
    """``(method, path)`` pairs that need the admin token."""

    def parse_request(self) -> bool:
        """Parse the request line and headers, then refuse a hostile request (see class doc)."""
        if not super().parse_request():
            return False
        problem = self._guard()
        if problem is None:
            return True
        self.close_connection = True  # the body, if any, was not read
        self.send_problem(problem)
        return False

    def _guard(self) -> HttpProblem | None:
        if not _loopback_host(self.headers.get("Host")):
            return HttpProblem(status=403, error="forbidden_host", detail="Host must be loopback")
        length = self.headers.get("Content-Length")
        if length is not None:
            text = length.strip()
            if not text.isdigit() or not text.isascii():
                return HttpProblem(status=400, error="bad_content_length")
            if int(text) > MAX_BODY_BYTES:
                return HttpProblem(status=413, error="body_too_large")
        if self.headers.get("Transfer-Encoding"):
            return HttpProblem(status=400, error="transfer_encoding_not_supported")
        if (self.command, urlsplit(self.path).path) in self.admin_requests:
            expected = getattr(self.server, "admin_token", None)
            given = self.headers.get(ADMIN_TOKEN_HEADER) or ""
            if not expected or not hmac.compare_digest(given.encode(), str(expected).encode()):
                return HttpProblem(status=403, error="admin_token_required")
        return None

    def read_json(self) -> Any:
        """Read and parse the request body (always consumed, so keep-alive stays in sync).

        Raises:
            HttpProblem: 400, the body is not JSON.
        """
        length = int(self.headers.get("Content-Length") or 0)  # checked in parse_request
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            return json.loads(raw or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise HttpProblem(status=400, error="invalid_json") from None

    def send_json(
        self, status: int, payload: Any, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send ``payload`` (bytes are sent as they are) with ``status`` and extra ``headers``."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def send_problem(self, problem: HttpProblem) -> None:
        """Answer with the problem's status and JSON error body."""
        self.send_json(problem.status, problem.payload())

    def log_message(self, format: str, *args: Any) -> None:
        """Log one line per request to stderr (the server's log file), flushed."""
        sys.stderr.write(f"{self.address_string()} - {format % args}\n")
        sys.stderr.flush()
