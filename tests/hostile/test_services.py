"""Hostile requests to the demo services: each answered with a status, never a silent close.

One ticket service and one mail sink run for the whole module (real
processes, started through ``DemoServices``); every case is one raw HTTP/1.1
request on a fresh socket. After each case the services' own SQLite files
show no ticket and no mail, and the fault mode is still ``normal``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from effectgate.demo import DemoServices


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServices]:
    """The two demo services, on loopback, for every case of this module."""
    with DemoServices(tmp_path_factory.mktemp("services")) as running:
        yield running


def _raw(url: str, request: bytes) -> bytes:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                break
    return b"".join(chunks)


def _status(answer: bytes) -> int:
    assert answer, "the connection was closed without a reply"
    return int(answer.split(b" ", 2)[1])


FAULT = b'{"mode": "reject"}'
_TICKET = b'{"title": "t", "body": "b"}'

REQUESTS: list[tuple[str, str, bytes, int]] = [
    # (service, name, raw request with {host} for the Host header, expected status)
    (
        "tickets",
        "fault-no-token",
        b"POST /_admin/fault HTTP/1.1\r\nHost: {host}\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 18\r\n\r\n" + FAULT,
        403,
    ),
    (
        "tickets",
        "fault-wrong-token",
        b"POST /_admin/fault HTTP/1.1\r\nHost: {host}\r\n"
        b"X-Effectgate-Admin-Token: guess\r\nContent-Length: 18\r\n\r\n" + FAULT,
        403,
    ),
    (
        "tickets",
        "fault-empty-token",
        b"POST /_admin/fault HTTP/1.1\r\nHost: {host}\r\n"
        b"X-Effectgate-Admin-Token: \r\nContent-Length: 18\r\n\r\n" + FAULT,
        403,
    ),
    (
        "tickets",
        "metrics-no-token",
        b"PUT /metrics/error_rate HTTP/1.1\r\nHost: {host}\r\n"
        b"Content-Length: 40\r\n\r\n" + b'{"service": "orders", "error_rate": 0.9}',
        403,
    ),
    (
        "mail",
        "mail-fault-no-token",
        b"POST /_admin/fault HTTP/1.1\r\nHost: {host}\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 18\r\n\r\n" + FAULT,
        403,
    ),
    ("tickets", "rebound-host", b"GET /tickets HTTP/1.1\r\nHost: evil.example:80\r\n\r\n", 403),
    (
        "tickets",
        "rebound-create",
        b"POST /tickets HTTP/1.1\r\nHost: attacker.test\r\n"
        b"Idempotency-Key: k\r\nContent-Length: 27\r\n\r\n" + _TICKET,
        403,
    ),
    ("mail", "mail-rebound-host", b"GET /messages HTTP/1.1\r\nHost: evil.example\r\n\r\n", 403),
    ("tickets", "no-host", b"GET /tickets HTTP/1.1\r\n\r\n", 403),
    (
        "tickets",
        "host-lookalike",
        b"GET /tickets HTTP/1.1\r\nHost: 127.0.0.1.evil.test\r\n\r\n",
        403,
    ),
    (
        "tickets",
        "content-length-text",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\n"
        b"Idempotency-Key: k\r\nContent-Length: abc\r\n\r\n" + _TICKET,
        400,
    ),
    (
        "tickets",
        "content-length-negative",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\n"
        b"Idempotency-Key: k\r\nContent-Length: -5\r\n\r\n" + _TICKET,
        400,
    ),
    (
        "tickets",
        "content-length-plus",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\n"
        b"Idempotency-Key: k\r\nContent-Length: +27\r\n\r\n" + _TICKET,
        400,
    ),
    (
        "tickets",
        "content-length-huge",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\n"
        b"Idempotency-Key: k\r\nContent-Length: 99999999999999999999\r\n\r\n" + _TICKET,
        413,
    ),
    (
        "tickets",
        "content-length-unicode-digits",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\n"
        b"Idempotency-Key: k\r\nContent-Length: \xd9\xa2\xd9\xa7\r\n\r\n" + _TICKET,
        400,
    ),
    (
        "tickets",
        "chunked",
        b"POST /tickets HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: k\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n1b\r\n" + _TICKET + b"\r\n0\r\n\r\n",
        400,
    ),
    (
        "mail",
        "mail-content-length-text",
        b"POST /_admin/fault HTTP/1.1\r\nHost: {host}\r\nContent-Length: x\r\n\r\n" + FAULT,
        400,
    ),
]


@pytest.mark.parametrize(
    ("service", "request_bytes", "status"),
    [(s, r, c) for s, _, r, c in REQUESTS],
    ids=[n for _, n, _, _ in REQUESTS],
)
def test_hostile_request_is_answered_and_changes_nothing(
    services: DemoServices, service: str, request_bytes: bytes, status: int
) -> None:
    """A status line comes back; no ticket, no mail, no fault was set."""
    endpoints = services.endpoints
    url = endpoints.ticket_url if service == "tickets" else endpoints.mail_url
    host = urlsplit(url).netloc.encode()
    answer = _raw(url, request_bytes.replace(b"{host}", host))
    assert _status(answer) == status, answer[:200]
    assert services.tickets() == []
    assert services.mails() == []
    for name in ("tickets", "mail"):
        assert services.stats(name)  # the admin reads still work, with the token
    snapshot = httpx.get(f"{endpoints.ticket_url}/_admin/fault", timeout=5).json()
    assert snapshot["mode"] == "normal"


def test_admin_token_is_per_run_and_private(services: DemoServices, tmp_path: Path) -> None:
    """The token is in the ready file only, which other local users cannot read."""
    ready = services.data_dir / "tickets.ready.json"
    assert ready.stat().st_mode & 0o077 == 0
    assert "admin_token" in ready.read_text()
    assert "admin_token" not in (services.data_dir / "endpoints.json").read_text()
    services.set_fault("tickets", "normal")  # DemoServices itself carries the token


def test_a_published_smtp_port_nothing_listens_on_is_not_answering(
    services: DemoServices,
) -> None:
    """The probe covers the SMTP server the mail tools send to, not only the two HTTP servers.

    Before, an ``endpoints.json`` whose ``smtp_port`` named a closed port passed
    the probe: the worker adopted it and the approved mail ended FAILED.
    """
    import dataclasses
    import socket

    from effectgate.demo.services import answering

    assert answering(services.endpoints)
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert not answering(dataclasses.replace(services.endpoints, smtp_port=closed))
    # an HTTP server where the SMTP server should be: it answers, but not with a 220 greeting
    http_port = int(services.endpoints.ticket_url.rsplit(":", 1)[1])
    assert not answering(dataclasses.replace(services.endpoints, smtp_port=http_port))
