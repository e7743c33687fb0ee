"""A ticket service with Stripe-style Idempotency-Key semantics, on 127.0.0.1 only.

Run as ``python -m effectgate.demo.ticket_service --db PATH --host 127.0.0.1
--port 0 --ready-file F``. When listening it writes ``{"port": N, "pid": P}``
to the ready file atomically. Its SQLite file is the oracle for "was the
ticket created?"; read it with ``read_tickets_db``.

API (JSON in and out):

- ``POST /tickets`` with header ``Idempotency-Key``: 201 and the ticket; the
  same key and body again returns the original response with
  ``Idempotent-Replayed: true``; the same key with another body is
  ``409 {"error": "idempotency_key_conflict"}``.
- ``GET /tickets``, ``GET /tickets/{id}``, ``GET /tickets/by-key/{quoted key}``.
- ``GET /metrics/error_rate?service=S&window_minutes=5``, ``PUT /metrics/error_rate``.
- ``POST|GET /_admin/fault`` (see ``FaultMode``), ``GET /_admin/stats``.

Note:
    Stripe's idempotent requests: https://docs.stripe.com/api/idempotent_requests
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import sqlite3
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, unquote, urlsplit

from effectgate._intent import canonical_json
from effectgate.demo._faults import (
    Action,
    FaultState,
    HttpProblem,
    JsonRequestHandler,
    QuietDisconnects,
    admin_token,
    bind_address,
    connect_db,
    migrate,
    read_rows,
    utc_now_iso,
    watch_parent,
    write_ready_file,
)
from effectgate.errors import ConfigError

__all__ = ["TicketServer", "TicketStore", "main", "read_tickets_db"]

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE tickets (
            ticket_id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            body TEXT NOT NULL,
            severity TEXT NOT NULL,
            alert_id TEXT,
            idempotency_key TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL)""",
        # The stored response: what a replay of the key answers, byte for byte.
        """CREATE TABLE idempotency_keys (
            idempotency_key TEXT PRIMARY KEY,
            request_fingerprint TEXT NOT NULL,
            response_status INTEGER NOT NULL,
            response_body TEXT NOT NULL,
            ticket_id INTEGER NOT NULL REFERENCES tickets(ticket_id),
            created_at TEXT NOT NULL)""",
        """CREATE TABLE error_rates (
            service TEXT PRIMARY KEY,
            error_rate REAL NOT NULL,
            updated_at TEXT NOT NULL)""",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('create_requests', 0)",
    ),
)

_TICKET_COLUMNS = "ticket_id, title, body, severity, alert_id, idempotency_key, created_at"
_SQL_LIST = f"SELECT {_TICKET_COLUMNS} FROM tickets ORDER BY ticket_id"
_SQL_BY_ID = f"SELECT {_TICKET_COLUMNS} FROM tickets WHERE ticket_id = ?"
_SQL_BY_KEY = f"SELECT {_TICKET_COLUMNS} FROM tickets WHERE idempotency_key = ?"
_SQL_STORED = (
    "SELECT request_fingerprint, response_status, response_body "
    "FROM idempotency_keys WHERE idempotency_key = ?"
)
_SQL_INSERT_TICKET = (
    "INSERT INTO tickets (title, body, severity, alert_id, idempotency_key, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_SQL_INSERT_KEY = (
    "INSERT INTO idempotency_keys (idempotency_key, request_fingerprint, response_status, "
    "response_body, ticket_id, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
_SQL_COUNT_REQUEST = "UPDATE counters SET value = value + 1 WHERE name = 'create_requests'"
_SQL_STATS = (
    "SELECT (SELECT value FROM counters WHERE name = 'create_requests'), "
    "(SELECT COUNT(*) FROM tickets)"
)
_SQL_GET_RATE = "SELECT error_rate FROM error_rates WHERE service = ?"
# A metric is a setting, not a durable fact: overwriting it is the point.
_SQL_PUT_RATE = (
    "INSERT INTO error_rates (service, error_rate, updated_at) VALUES (?, ?, ?) "
    "ON CONFLICT(service) DO UPDATE SET error_rate = excluded.error_rate, "
    "updated_at = excluded.updated_at"
)
_TICKET_FIELDS = ("title", "body", "severity", "alert_id")
_CONFLICT = {"error": "idempotency_key_conflict"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateOutcome:
    """What ``TicketStore.create`` committed or found."""

    status: int
    """HTTP status to answer: 201 (new or replayed) or 409 (key reused with another body)."""
    body: bytes
    """Response body, byte for byte the stored one on a replay."""
    replayed: bool
    """Whether the response was stored by an earlier request with the same key."""


def _ticket(row: sqlite3.Row) -> dict[str, Any]:
    return {name: row[name] for name in _TICKET_COLUMNS.split(", ")}


class TicketStore:
    """The ticket service's own SQLite storage; one connection per call."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = Path(db_path)
        with self._connect() as conn:
            migrate(conn, _MIGRATIONS)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = connect_db(self.db_path)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so concurrent creates
        # with one key serialise and the second sees the first's stored response.
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def count_create_request(self) -> None:
        """Count one ``POST /tickets`` received (committed before returning)."""
        with self._write() as conn:
            conn.execute(_SQL_COUNT_REQUEST)

    def create(self, key: str, fields: dict[str, Any]) -> CreateOutcome:
        """Create the ticket for ``key`` or return the response stored for it.

        The ticket row and its stored response commit in one transaction.
        """
        fingerprint = hashlib.sha256(canonical_json(fields)).hexdigest()
        with self._write() as conn:
            stored = conn.execute(_SQL_STORED, (key,)).fetchone()
            if stored is not None:
                if stored["request_fingerprint"] != fingerprint:
                    return CreateOutcome(status=409, body=_json_bytes(_CONFLICT), replayed=False)
                body = str(stored["response_body"]).encode("utf-8")
                return CreateOutcome(status=stored["response_status"], body=body, replayed=True)
            now = utc_now_iso()
            values = (*(fields[name] for name in _TICKET_FIELDS), key, now)
            cursor = conn.execute(_SQL_INSERT_TICKET, values)
            ticket = _ticket(conn.execute(_SQL_BY_ID, (cursor.lastrowid,)).fetchone())
            body = _json_bytes(ticket)
            conn.execute(
                _SQL_INSERT_KEY,
                (key, fingerprint, 201, body.decode("utf-8"), cursor.lastrowid, now),
            )
        return CreateOutcome(status=201, body=body, replayed=False)

    def tickets(self) -> list[dict[str, Any]]:
        """Return every ticket, ordered by id."""
        with self._connect() as conn:
            return [_ticket(row) for row in conn.execute(_SQL_LIST)]

    def get(self, ticket_id: int) -> dict[str, Any] | None:
        """Return the ticket with ``ticket_id``, or None."""
        with self._connect() as conn:
            row = conn.execute(_SQL_BY_ID, (ticket_id,)).fetchone()
        return None if row is None else _ticket(row)

    def get_by_key(self, key: str) -> dict[str, Any] | None:
        """Return the ticket created with Idempotency-Key ``key``, or None."""
        with self._connect() as conn:
            row = conn.execute(_SQL_BY_KEY, (key,)).fetchone()
        return None if row is None else _ticket(row)

    def error_rate(self, service: str) -> float:
        """Return the stored error rate of ``service`` (0.0 when never set)."""
        with self._connect() as conn:
            row = conn.execute(_SQL_GET_RATE, (service,)).fetchone()
        return 0.0 if row is None else float(row[0])

    def set_error_rate(self, service: str, rate: float) -> None:
        """Store the error rate of ``service`` (a fraction in [0, 1])."""
        with self._write() as conn:
            conn.execute(_SQL_PUT_RATE, (service, rate, utc_now_iso()))

    def stats(self) -> dict[str, int]:
        """Return ``{"create_requests": n, "tickets": n}``."""
        with self._connect() as conn:
            requests, tickets = conn.execute(_SQL_STATS).fetchone()
        return {"create_requests": int(requests), "tickets": int(tickets)}


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def read_tickets_db(db_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every ticket straight from the service's SQLite file (the oracle).

    Works while the server is down; never migrates or writes.

    Returns:
        Tickets ordered by id, shaped as the API returns them; ``[]`` when the
        file or its schema does not exist yet.
    """
    return [_ticket(row) for row in read_rows(db_path, "tickets", _SQL_LIST)]


def read_error_rate_db(db_path: str | os.PathLike[str], service: str) -> float | None:
    """Read the stored error rate of ``service`` straight from the SQLite file.

    Returns:
        The fraction, or ``None`` when none was ever stored (no file, no
        table, or no row): the service then reports 0.0.
    """
    rows = read_rows(db_path, "error_rates", _SQL_GET_RATE, (service,))
    return float(rows[0][0]) if rows else None


def _parse_ticket(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise HttpProblem(status=400, error="invalid_request", detail="body must be an object")
    unknown = set(payload) - set(_TICKET_FIELDS)
    if unknown:
        raise HttpProblem(status=400, error="invalid_request", detail=f"unknown {sorted(unknown)}")
    for name in ("title", "body", "severity"):
        if not isinstance(payload.get(name), str):
            raise HttpProblem(
                status=400, error="invalid_request", detail=f"{name} must be a string"
            )
    alert_id = payload.get("alert_id")
    if alert_id is not None and not isinstance(alert_id, str):
        raise HttpProblem(status=400, error="invalid_request", detail="alert_id: string or null")
    return {name: payload.get(name) for name in _TICKET_FIELDS}


class TicketServer(QuietDisconnects, ThreadingHTTPServer):
    """Threaded HTTP server holding the store, the fault state and aborted sockets."""

    daemon_threads = True

    def __init__(self, host: str, port: int, store: TicketStore) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), TicketHandler)
        self.store = store
        self.admin_token = admin_token()
        self.faults = FaultState()
        self._aborted: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._aborted_lock = threading.Lock()

    def abort(self, sock: socket.socket) -> None:
        """Make closing ``sock`` send a TCP reset instead of a polite FIN."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self._aborted_lock:
            self._aborted.add(sock)

    def shutdown_request(self, request: Any) -> None:
        """Close the connection; an aborted one skips ``shutdown(SHUT_WR)`` (no FIN first)."""
        with self._aborted_lock:
            aborted = request in self._aborted
        if aborted:
            self.close_request(request)
        else:
            super().shutdown_request(request)


class TicketHandler(JsonRequestHandler):
    """Routes of the ticket service."""

    server: TicketServer
    admin_requests = frozenset({("POST", "/_admin/fault"), ("PUT", "/metrics/error_rate")})

    def do_GET(self) -> None:
        """Serve lists, lookups, metrics and admin reads."""
        url = urlsplit(self.path)
        path = url.path
        try:
            if path == "/tickets":
                self.send_json(200, {"tickets": self.server.store.tickets()})
            elif path.startswith("/tickets/by-key/"):
                self._get_by_key(unquote(path.removeprefix("/tickets/by-key/")))
            elif path.startswith("/tickets/"):
                self._get_by_id(path.removeprefix("/tickets/"))
            elif path == "/metrics/error_rate":
                self._get_error_rate(parse_qs(url.query))
            elif path == "/_admin/fault":
                self.send_json(200, self.server.faults.snapshot())
            elif path == "/_admin/stats":
                self.send_json(200, self.server.store.stats())
            else:
                raise HttpProblem(status=404, error="not_found")
        except HttpProblem as problem:
            self.send_problem(problem)

    def do_POST(self) -> None:
        """Create tickets and set faults."""
        path = urlsplit(self.path).path
        try:
            if path == "/tickets":
                self._create()
            elif path == "/_admin/fault":
                self.send_json(200, self.server.faults.configure(self.read_json()))
            else:
                self.read_json()
                raise HttpProblem(status=404, error="not_found")
        except HttpProblem as problem:
            self.send_problem(problem)

    def do_PUT(self) -> None:
        """Set a service's error rate."""
        try:
            payload = self.read_json()
            if urlsplit(self.path).path != "/metrics/error_rate":
                raise HttpProblem(status=404, error="not_found")
            self._put_error_rate(payload)
        except HttpProblem as problem:
            self.send_problem(problem)

    def _create(self) -> None:
        store = self.server.store
        store.count_create_request()  # every POST counts, faulted ones included
        payload = self.read_json()
        key = self.headers.get("Idempotency-Key")
        if not key:
            raise HttpProblem(status=400, error="missing_idempotency_key")
        fields = _parse_ticket(payload)
        decision = self.server.faults.next_action()
        if decision.action is not Action.PROCEED:
            self.log_message("fault %s on create with key %r", decision.action, key)
        if decision.action is Action.SLOW:
            time.sleep(decision.delay_s)
        elif decision.action is Action.REJECT:
            raise HttpProblem(status=422, error="rejected")
        elif decision.action is Action.UNAVAILABLE:
            retry = {"Retry-After": str(decision.retry_after_s)}
            self.send_json(503, {"error": "unavailable"}, headers=retry)
            return
        outcome = store.create(key, fields)
        # Past this line the ticket is committed; the faults below only lose the answer.
        if decision.action is Action.HOLD_AFTER_COMMIT:
            time.sleep(decision.delay_s)
            self.close_connection = True
            return
        if decision.action is Action.RESET_AFTER_COMMIT:
            self.server.abort(self.connection)
            self.close_connection = True
            return
        if decision.action is Action.CRASH_AFTER_COMMIT:
            _crash("server-crash-after-commit")
        replay = {"Idempotent-Replayed": "true"} if outcome.replayed else None
        self.send_json(outcome.status, outcome.body, headers=replay)

    def _get_by_key(self, key: str) -> None:
        if not self.server.faults.lookups_available():
            raise HttpProblem(status=503, error="lookups_unavailable")
        ticket = self.server.store.get_by_key(key)
        if ticket is None:
            raise HttpProblem(status=404, error="not_found")
        self.send_json(200, ticket)

    def _get_by_id(self, raw_id: str) -> None:
        ticket = self.server.store.get(int(raw_id)) if raw_id.isdecimal() else None
        if ticket is None:
            raise HttpProblem(status=404, error="not_found")
        self.send_json(200, ticket)

    def _get_error_rate(self, query: dict[str, list[str]]) -> None:
        service = query.get("service", [""])[0]
        window = query.get("window_minutes", ["5"])[0]
        if not service or not window.isdecimal():
            raise HttpProblem(status=400, error="invalid_request", detail="service, window_minutes")
        rate = self.server.store.error_rate(service)
        self.send_json(200, {"service": service, "window_minutes": int(window), "error_rate": rate})

    def _put_error_rate(self, payload: Any) -> None:
        if not isinstance(payload, dict) or not isinstance(payload.get("service"), str):
            raise HttpProblem(status=400, error="invalid_request", detail="service: string")
        rate = payload.get("error_rate")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise HttpProblem(status=400, error="invalid_request", detail="error_rate in [0, 1]")
        self.server.store.set_error_rate(payload["service"], float(rate))
        self.send_json(200, {"service": payload["service"], "error_rate": float(rate)})


def _crash(reason: str) -> NoReturn:
    print(f"{reason}: exiting with status 1", file=sys.stderr, flush=True)
    os._exit(1)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m effectgate.demo.ticket_service", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--db", required=True, help="SQLite file of the service")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument("--ready-file", help="where to write {port, pid} once listening")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    return parser.parse_args(argv)


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Run the ticket service until SIGTERM / SIGINT.

    Returns:
        The process exit status: 0 after a clean stop, 2 for a refused host.
    """
    args = _parse_args(argv)
    try:
        host = bind_address(args.host)
    except ConfigError as exc:
        print(f"ticket_service: {exc}", file=sys.stderr)
        return 2
    watch_parent(args.parent_pid)
    server = TicketServer(host, args.port, TicketStore(args.db))
    port = int(server.server_address[1])
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.ready_file:
        ready = {"port": port, "pid": os.getpid(), "admin_token": server.admin_token}
        write_ready_file(args.ready_file, ready)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"ticket service listening on {url}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
