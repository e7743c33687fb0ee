"""An SMTP mail sink that stores every accepted message durably, on 127.0.0.1 only.

Run as ``python -m effectgate.demo.mail_sink --db PATH --host 127.0.0.1
--smtp-port 0 --http-port 0 --ready-file F``. When both servers listen it
writes ``{"smtp_port": N, "http_port": M, "pid": P}`` to the ready file
atomically. Each message is committed to SQLite *before* the SMTP 250 reply,
so the file is the oracle for "was the mail delivered?"; read it
with ``read_mails_db``.

SMTP has no idempotency key: a message sent twice is stored twice, which is
exactly what tests must be able to see. Lookups go by the ``Message-ID``
header, as given by the sender.

HTTP API: ``GET /messages``, ``GET /messages/by-id?message_id=<quoted, with <>>``
(200 | 404 | 503 when lookups are faulted), ``POST|GET /_admin/fault``,
``GET /_admin/stats``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email
import email.policy
import json
import os
import signal
import socket
import sqlite3
import struct
import sys
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit

from aiosmtpd.smtp import SMTP, Envelope, Session

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

__all__ = ["MailSinkHandler", "MailStore", "main", "read_mails_db"]

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        # message_id is deliberately not UNIQUE: a duplicate delivery must be visible.
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            message_id TEXT,
            mail_from TEXT NOT NULL,
            rcpt_tos TEXT NOT NULL,
            subject TEXT NOT NULL,
            body TEXT NOT NULL,
            raw BLOB NOT NULL,
            received_at TEXT NOT NULL)""",
        "CREATE INDEX messages_by_message_id ON messages (message_id)",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO counters (name, value) VALUES ('data_commands', 0)",
    ),
)
_COLUMNS = "id, message_id, mail_from, rcpt_tos, subject, body, raw, received_at"
_SQL_LIST = f"SELECT {_COLUMNS} FROM messages ORDER BY id"
_SQL_BY_MESSAGE_ID = f"SELECT {_COLUMNS} FROM messages WHERE message_id = ? ORDER BY id"
_SQL_INSERT = (
    "INSERT INTO messages (message_id, mail_from, rcpt_tos, subject, body, raw, received_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SQL_COUNT_DATA = "UPDATE counters SET value = value + 1 WHERE name = 'data_commands'"
_SQL_STATS = (
    "SELECT (SELECT value FROM counters WHERE name = 'data_commands'), "
    "(SELECT COUNT(*) FROM messages)"
)
_SMTP_HOSTNAME = "effectgate-mail-sink"  # fixed, so aiosmtpd never calls getfqdn() (DNS)
_REPLY_OK = "250 2.0.0 Message accepted for delivery"
_REPLY_REJECT = "550 5.7.1 rejected"
_REPLY_UNAVAILABLE = "451 4.3.0 try again later"


def _message(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "message_id": row["message_id"],
        "mail_from": row["mail_from"],
        "rcpt_tos": json.loads(row["rcpt_tos"]),
        "subject": row["subject"],
        "body": row["body"],
        "raw": bytes(row["raw"]).decode("utf-8", errors="replace"),
        "received_at": row["received_at"],
    }


def _parse(raw: bytes) -> tuple[str | None, str, str]:
    """Return ``(Message-ID as given, subject, body text)`` of a raw message."""
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    message_id = msg.get("Message-ID")
    subject = str(msg.get("Subject") or "")
    body = ""
    if isinstance(msg, EmailMessage):
        part = msg.get_body(preferencelist=("plain", "html"))
        if isinstance(part, EmailMessage):
            # SMTP carries CRLF; store the text the sender wrote.
            body = str(part.get_content()).replace("\r\n", "\n")
    return (None if message_id is None else str(message_id).strip()), subject, body


class MailStore:
    """The sink's own SQLite storage; one connection per call."""

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

    def _commit(self, sql: str, params: tuple[Any, ...] = ()) -> int | None:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                rowid = conn.execute(sql, params).lastrowid
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return rowid

    def count_data_command(self) -> None:
        """Count one DATA command received (committed before returning)."""
        self._commit(_SQL_COUNT_DATA)

    def store(self, *, mail_from: str, rcpt_tos: list[str], raw: bytes) -> int:
        """Commit one accepted message and return its row id."""
        message_id, subject, body = _parse(raw)
        params = (message_id, mail_from, json.dumps(rcpt_tos), subject, body, raw, utc_now_iso())
        rowid = self._commit(_SQL_INSERT, params)
        assert rowid is not None  # an INSERT always sets lastrowid
        return rowid

    def messages(self) -> list[dict[str, Any]]:
        """Return every stored message, oldest first."""
        with self._connect() as conn:
            return [_message(row) for row in conn.execute(_SQL_LIST)]

    def by_message_id(self, message_id: str) -> list[dict[str, Any]]:
        """Return every stored copy of ``message_id``, oldest first."""
        with self._connect() as conn:
            return [_message(row) for row in conn.execute(_SQL_BY_MESSAGE_ID, (message_id,))]

    def stats(self) -> dict[str, int]:
        """Return ``{"data_commands": n, "messages": n}``."""
        with self._connect() as conn:
            data_commands, messages = conn.execute(_SQL_STATS).fetchone()
        return {"data_commands": int(data_commands), "messages": int(messages)}


def read_mails_db(db_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every message straight from the sink's SQLite file (the oracle).

    Works while the sink is down; never migrates or writes.

    Returns:
        Messages oldest first, shaped as ``GET /messages`` returns them; ``[]``
        when the file or its schema does not exist yet.
    """
    return [_message(row) for row in read_rows(db_path, "messages", _SQL_LIST)]


class MailSinkHandler:
    """aiosmtpd handler: apply the fault, commit the message, then answer."""

    def __init__(self, store: MailStore, faults: FaultState) -> None:
        self.store = store
        self.faults = faults

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        """Answer the end of DATA; the message is committed before any 250."""
        await asyncio.to_thread(self.store.count_data_command)
        decision = self.faults.next_action()
        print(
            f"DATA from {envelope.mail_from} to {envelope.rcpt_tos}: {decision.action}",
            file=sys.stderr,
            flush=True,
        )
        if decision.action is Action.SLOW:
            await asyncio.sleep(decision.delay_s)
        elif decision.action is Action.REJECT:
            return _REPLY_REJECT
        elif decision.action is Action.UNAVAILABLE:
            return _REPLY_UNAVAILABLE
        raw = envelope.original_content or b""
        await asyncio.to_thread(
            self.store.store,
            mail_from=str(envelope.mail_from),
            rcpt_tos=[str(rcpt) for rcpt in envelope.rcpt_tos],
            raw=raw,
        )
        # Past this line the message is committed; the faults below only lose the reply.
        if decision.action is Action.CRASH_AFTER_COMMIT:
            _crash("server-crash-after-commit")
        if decision.action is Action.HOLD_AFTER_COMMIT:
            await asyncio.sleep(decision.delay_s)
            return await _drop(server, reset=False)
        if decision.action is Action.RESET_AFTER_COMMIT:
            return await _drop(server, reset=True)
        return _REPLY_OK


async def _drop(server: SMTP, *, reset: bool) -> str:
    transport = server.transport
    if isinstance(transport, asyncio.Transport):
        sock = transport.get_extra_info("socket")
        if reset and sock is not None:
            # Linger 0: the close sends a TCP reset, not a polite FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    # connection_lost() cancels this session's task; the reply below is never sent.
    await asyncio.sleep(3600)
    return _REPLY_UNAVAILABLE


def _crash(reason: str) -> NoReturn:
    print(f"{reason}: exiting with status 1", file=sys.stderr, flush=True)
    os._exit(1)


class _HttpServer(QuietDisconnects, ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, store: MailStore, faults: FaultState) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _HttpHandler)
        self.store = store
        self.faults = faults
        self.admin_token = admin_token()


class _HttpHandler(JsonRequestHandler):
    server: _HttpServer
    admin_requests = frozenset({("POST", "/_admin/fault")})

    def do_GET(self) -> None:
        """Serve the mailbox, lookups by Message-ID and admin reads."""
        url = urlsplit(self.path)
        try:
            if url.path == "/messages":
                self.send_json(200, {"messages": self.server.store.messages()})
            elif url.path == "/messages/by-id":
                self._by_id(parse_qs(url.query).get("message_id", [""])[0])
            elif url.path == "/_admin/fault":
                self.send_json(200, self.server.faults.snapshot())
            elif url.path == "/_admin/stats":
                self.send_json(200, self.server.store.stats())
            else:
                raise HttpProblem(status=404, error="not_found")
        except HttpProblem as problem:
            self.send_problem(problem)

    def do_POST(self) -> None:
        """Set the fault."""
        try:
            payload = self.read_json()
            if urlsplit(self.path).path != "/_admin/fault":
                raise HttpProblem(status=404, error="not_found")
            self.send_json(200, self.server.faults.configure(payload))
        except HttpProblem as problem:
            self.send_problem(problem)

    def _by_id(self, message_id: str) -> None:
        if not message_id:
            raise HttpProblem(status=400, error="invalid_request", detail="message_id required")
        if not self.server.faults.lookups_available():
            raise HttpProblem(status=503, error="lookups_unavailable")
        copies = self.server.store.by_message_id(message_id)
        if not copies:
            raise HttpProblem(status=404, error="not_found")
        # The first delivery answers; `copies` > 1 reveals a duplicate send.
        self.send_json(200, {**copies[0], "copies": len(copies)})


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m effectgate.demo.mail_sink", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--db", required=True, help="SQLite file of the sink")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--smtp-port", type=int, default=0, help="SMTP port; 0 picks a free one")
    parser.add_argument("--http-port", type=int, default=0, help="HTTP port; 0 picks a free one")
    parser.add_argument("--ready-file", help="where to write {smtp_port, http_port, pid}")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    store = MailStore(args.db)
    faults = FaultState()
    loop = asyncio.get_running_loop()
    smtp = await loop.create_server(
        lambda: SMTP(
            MailSinkHandler(store, faults),
            hostname=_SMTP_HOSTNAME,
            enable_SMTPUTF8=True,
            loop=loop,
        ),
        host=args.host,
        port=args.smtp_port,
    )
    http = _HttpServer(args.host, args.http_port, store, faults)
    threading.Thread(target=http.serve_forever, args=(0.2,), name="http", daemon=True).start()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    smtp_port = int(smtp.sockets[0].getsockname()[1])
    http_port = int(http.server_address[1])
    if args.ready_file:
        ready = {
            "smtp_port": smtp_port,
            "http_port": http_port,
            "pid": os.getpid(),
            "admin_token": http.admin_token,
        }
        write_ready_file(args.ready_file, ready)
    print(
        f"mail sink listening: smtp://{args.host}:{smtp_port} http://{args.host}:{http_port}",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        smtp.close()
        http.shutdown()
        http.server_close()


def main(argv: list[str] | None = None) -> int:
    """Run the mail sink (SMTP + HTTP) until SIGTERM / SIGINT.

    Returns:
        The process exit status: 0 after a clean stop, 2 for a refused host.
    """
    args = _parse_args(argv)
    try:
        args.host = bind_address(args.host)
    except ConfigError as exc:
        print(f"mail_sink: {exc}", file=sys.stderr)
        return 2
    watch_parent(args.parent_pid)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
