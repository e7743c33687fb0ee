"""The ticket service as a real process: what a client sees matches what its SQLite file holds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from effectgate.demo.ticket_service import read_tickets_db

TICKET = {"title": "Disk full on db-1", "body": "95% used", "severity": "high", "alert_id": "a-1"}


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    db: Path
    token: str

    def post(self, key: str | None, body: object = TICKET, timeout: float = 5.0) -> httpx.Response:
        headers = {} if key is None else {"Idempotency-Key": key}
        return httpx.post(f"{self.url}/tickets", json=body, headers=headers, timeout=timeout)

    def get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, timeout=5.0)

    def fault(self, mode: str, **extra: object) -> dict[str, object]:
        response = httpx.post(
            f"{self.url}/_admin/fault",
            json={"mode": mode, **extra},
            headers={"X-Effectgate-Admin-Token": self.token},
            timeout=5,
        )
        assert response.status_code == 200, response.text
        return dict(response.json())

    def rows(self) -> list[dict[str, object]]:
        return read_tickets_db(self.db)


def launch(db: Path) -> Server:
    ready = db.parent / f"ready-{time.monotonic_ns()}.json"
    log = (db.parent / "tickets.log").open("ab")
    cmd = [sys.executable, "-m", "effectgate.demo.ticket_service", "--db", str(db)]
    cmd += ["--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 15
    while not ready.exists():
        assert process.poll() is None, (db.parent / "tickets.log").read_text()
        assert time.monotonic() < deadline, "ticket service not ready"
        time.sleep(0.02)
    info = json.loads(ready.read_text())
    assert info["pid"] == process.pid
    url = f"http://127.0.0.1:{info['port']}"
    return Server(process=process, url=url, db=db, token=info["admin_token"])


def halt(server: Server) -> None:
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        halt(server)


@pytest.fixture
def server(tmp_path: Path, servers: list[Server]) -> Server:
    servers.append(launch(tmp_path / "tickets.sqlite3"))
    return servers[-1]


def test_create_returns_the_committed_row(server: Server) -> None:
    """A 201 answer carries exactly the row the service stored."""
    response = server.post("op-1")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response.headers
    body = response.json()
    assert server.rows() == [body]
    assert body["ticket_id"] == 1
    assert body["idempotency_key"] == "op-1"
    assert {k: body[k] for k in TICKET} == TICKET
    assert body["created_at"].endswith("Z")


def test_replay_returns_original_response_bytes(server: Server) -> None:
    """Same key and body: the original status and JSON, marked as replayed, no new row."""
    first = server.post("op-1")
    again = server.post("op-1", body=dict(reversed(list(TICKET.items()))))
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert len(server.rows()) == 1
    assert server.get("/_admin/stats").json() == {"create_requests": 2, "tickets": 1}


def test_same_key_other_body_conflicts(server: Server) -> None:
    """Same key with a changed body: 409 and the stored ticket is unchanged."""
    first = server.post("op-1").json()
    conflict = server.post("op-1", body={**TICKET, "severity": "low"})
    assert conflict.status_code == 409
    assert conflict.json() == {"error": "idempotency_key_conflict"}
    assert server.rows() == [first]


@pytest.mark.parametrize(
    ("key", "body"),
    [
        (None, TICKET),
        ("op-1", {**TICKET, "title": 7}),
        ("op-1", {**TICKET, "extra": "x"}),
        ("op-1", ["not", "an", "object"]),
    ],
)
def test_bad_requests_store_nothing(server: Server, key: str | None, body: object) -> None:
    """A missing key or malformed body is a 400 and stores nothing."""
    assert server.post(key, body=body).status_code == 400
    assert server.rows() == []


def test_eight_concurrent_identical_requests_create_one_ticket(server: Server) -> None:
    """Eight racing identical creates: one row, eight identical bodies, seven replays."""
    barrier = threading.Barrier(8)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def create() -> None:
        with httpx.Client(timeout=10) as client:
            barrier.wait()
            response = client.post(
                f"{server.url}/tickets", json=TICKET, headers={"Idempotency-Key": "race"}
            )
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert [r.status_code for r in responses] == [201] * 8
    assert len({r.content for r in responses}) == 1
    assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in responses) == 7
    assert len(server.rows()) == 1
    assert server.get("/_admin/stats").json() == {"create_requests": 8, "tickets": 1}


def test_reject_is_permanent_and_stores_nothing(server: Server) -> None:
    """reject: 422 on every create, no row, every request counted."""
    server.fault("reject")
    for _ in range(2):
        response = server.post("op-1")
        assert response.status_code == 422
        assert response.json() == {"error": "rejected"}
    assert server.rows() == []
    assert server.get("/_admin/stats").json() == {"create_requests": 2, "tickets": 0}


def test_unavailable_until_changed_with_retry_after(server: Server) -> None:
    """unavailable: 503 + Retry-After on every create until reset, and no row."""
    server.fault("unavailable", retry_after_s=3)
    for _ in range(3):
        response = server.post("op-1")
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "3"
    assert server.rows() == []
    server.fault("normal")
    assert server.post("op-1").status_code == 201
    assert len(server.rows()) == 1


def test_transient_once_fails_only_the_first_request(server: Server) -> None:
    """transient-once: the first create gets 503 (default Retry-After 1), the retry succeeds."""
    server.fault("transient-once")
    first = server.post("op-1")
    assert first.status_code == 503
    assert first.headers["Retry-After"] == "1"
    assert server.rows() == []
    second = server.post("op-1")
    assert second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert server.rows() == [second.json()]
    assert server.get("/_admin/fault").json()["mode"] == "normal"


def test_timeout_after_commit_client_times_out_but_row_exists(server: Server) -> None:
    """timeout-after-commit: ReadTimeout for the client, the row is stored and findable."""
    server.fault("timeout-after-commit", delay_s=1.5)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        server.post("op/1 x", timeout=0.5)
    assert time.monotonic() - started < 1.4
    [row] = server.rows()
    assert row["idempotency_key"] == "op/1 x"
    found = server.get("/tickets/by-key/" + quote("op/1 x", safe=""))
    assert found.status_code == 200
    assert found.json() == row
    assert server.get("/_admin/fault").json()["mode"] == "normal"
    replay = server.post("op/1 x")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == row


def _raw_create(server: Server, key: str) -> socket.socket:
    body = json.dumps(TICKET).encode()
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = (
        f"POST /tickets HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_timeout_after_commit_holds_then_closes_without_a_byte(server: Server) -> None:
    """The held connection is closed after delay_s without any response bytes."""
    server.fault("timeout-after-commit", delay_s=0.5)
    started = time.monotonic()
    with _raw_create(server, "op-1") as sock:
        assert sock.recv(1024) == b""
    assert 0.45 <= time.monotonic() - started < 4
    assert len(server.rows()) == 1


def test_reset_after_commit_resets_and_lookup_finds_ticket(server: Server) -> None:
    """reset-after-commit: the socket is reset with no response; lookup by key finds the row."""
    server.fault("reset-after-commit")
    with _raw_create(server, "op-1") as sock, pytest.raises(ConnectionResetError):
        sock.recv(1024)
    [row] = server.rows()
    assert server.get("/tickets/by-key/op-1").json() == row
    assert server.post("op-1").headers["Idempotent-Replayed"] == "true"


def test_reset_after_commit_seen_by_httpx_as_transport_error(server: Server) -> None:
    """httpx sees a non-timeout transport error, and the ticket was committed."""
    server.fault("reset-after-commit")
    with pytest.raises(httpx.TransportError) as info:
        server.post("op-1", timeout=2)
    assert not isinstance(info.value, httpx.TimeoutException)
    assert len(server.rows()) == 1


def test_after_commit_faults_last_times_requests(server: Server) -> None:
    """times=2: two creates are reset (both committed), the third is answered."""
    server.fault("reset-after-commit", times=2)
    for key in ("op-1", "op-2"):
        with pytest.raises(httpx.TransportError):
            server.post(key, timeout=2)
    assert server.post("op-3").status_code == 201
    assert [row["idempotency_key"] for row in server.rows()] == ["op-1", "op-2", "op-3"]


def test_server_crash_after_commit(tmp_path: Path, server: Server, servers: list[Server]) -> None:
    """server-crash-after-commit: connection error, row exists, process gone; restart sees it."""
    server.fault("server-crash-after-commit")
    with pytest.raises(httpx.TransportError) as info:
        server.post("op-1", timeout=5)
    assert not isinstance(info.value, httpx.TimeoutException)
    assert server.process.wait(timeout=5) == 1
    [row] = server.rows()
    servers.append(launch(server.db))
    restarted = servers[-1]
    assert restarted.get("/tickets").json() == {"tickets": [row]}
    assert restarted.get("/_admin/fault").json()["mode"] == "normal"
    replay = restarted.post("op-1")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == row
    assert restarted.get("/_admin/stats").json() == {"create_requests": 2, "tickets": 1}


def test_ambiguous_unqueryable(server: Server) -> None:
    """ambiguous-unqueryable: timeout, lookups 503 even after the timeout wears off, row exists."""
    server.fault("ambiguous-unqueryable", delay_s=1.0)
    with pytest.raises(httpx.ReadTimeout):
        server.post("op-1", timeout=0.3)
    assert len(server.rows()) == 1
    assert server.get("/tickets/by-key/op-1").status_code == 503
    state = server.get("/_admin/fault").json()
    assert (state["mode"], state["lookups"]) == ("normal", "unavailable")
    server.fault("normal")
    assert server.get("/tickets/by-key/op-1").json() == server.rows()[0]


def test_slow_answers_after_delay(server: Server) -> None:
    """slow: the create is answered normally after delay_s, and stays slow until changed."""
    server.fault("slow", delay_s=0.4)
    for key in ("op-1", "op-2"):
        started = time.monotonic()
        assert server.post(key).status_code == 201
        assert time.monotonic() - started >= 0.4
    assert len(server.rows()) == 2


def test_slow_commits_after_the_client_gave_up(server: Server) -> None:
    """slow + client timeout: like a real HTTP server, it still commits once the delay ends."""
    server.fault("slow", delay_s=0.8)
    with pytest.raises(httpx.ReadTimeout):
        server.post("op-1", timeout=0.3)
    assert server.get("/tickets/by-key/op-1").status_code == 404
    deadline = time.monotonic() + 5
    while not server.rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [row["idempotency_key"] for row in server.rows()] == ["op-1"]


def test_lookups_unavailable_does_not_block_creates(server: Server) -> None:
    """lookups=unavailable: by-key answers 503, creates still work."""
    server.fault("normal", lookups="unavailable")
    assert server.post("op-1").status_code == 201
    assert server.get("/tickets/by-key/op-1").status_code == 503
    server.fault("normal")
    assert server.get("/tickets/by-key/op-1").status_code == 200


def test_reads_by_id_key_and_list(server: Server) -> None:
    """List is ordered by id; unknown ids and keys are 404 not_found."""
    first = server.post("op-1").json()
    second = server.post("op-2", body={**TICKET, "alert_id": None}).json()
    assert second["alert_id"] is None
    assert server.get("/tickets").json() == {"tickets": [first, second]}
    assert server.get("/tickets/2").json() == second
    for path in ("/tickets/3", "/tickets/abc", "/tickets/by-key/nope", "/nothing"):
        missing = server.get(path)
        assert missing.status_code == 404
        assert missing.json() == {"error": "not_found"}


def test_error_rate_is_settable_and_persists(tmp_path: Path, servers: list[Server]) -> None:
    """error_rate: 0.0 by default, settable, stored in the DB across a restart."""
    servers.append(launch(tmp_path / "tickets.sqlite3"))
    first = servers[-1]
    assert first.get("/metrics/error_rate", service="orders").json() == {
        "service": "orders",
        "window_minutes": 5,
        "error_rate": 0.0,
    }
    url = f"{first.url}/metrics/error_rate"
    admin = {"X-Effectgate-Admin-Token": first.token}
    put = httpx.put(url, json={"service": "orders", "error_rate": 0.25}, headers=admin)
    assert put.json() == {"service": "orders", "error_rate": 0.25}
    bad = httpx.put(url, json={"service": "orders", "error_rate": 2}, headers=admin)
    assert bad.status_code == 400
    halt(first)
    servers.append(launch(tmp_path / "tickets.sqlite3"))
    again = servers[-1].get("/metrics/error_rate", service="orders", window_minutes="15").json()
    assert again == {"service": "orders", "window_minutes": 15, "error_rate": 0.25}


@pytest.mark.parametrize(
    "payload",
    [{"mode": "explode"}, {"mode": "slow", "delay_s": -1}, {"lookups": "maybe"}, {"x": 1}],
)
def test_bad_fault_is_refused_and_state_kept(server: Server, payload: dict[str, object]) -> None:
    """An invalid fault is a 400 and leaves the current fault in place."""
    server.fault("reject")
    headers = {"X-Effectgate-Admin-Token": server.token}
    response = httpx.post(f"{server.url}/_admin/fault", json=payload, headers=headers)
    assert response.status_code == 400
    assert server.get("/_admin/fault").json()["mode"] == "reject"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_non_loopback_host_is_refused(tmp_path: Path, host: str) -> None:
    """Binding anything but loopback exits 2 with a clear message, before touching the DB."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "effectgate.demo.ticket_service", "--db", str(tmp_path / "t.db")]
    cmd += ["--host", host, "--port", "0", "--ready-file", str(ready)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 2
    assert "loopback" in result.stderr
    assert not ready.exists()
    assert not (tmp_path / "t.db").exists()


def test_a_client_that_leaves_mid_response_is_one_log_line_not_a_traceback(
    server: Server,
) -> None:
    """A client reset while the service writes its answer: one line in the log, no traceback.

    The listing is made large (64 tickets of 32 KiB), so the service is still
    writing when the reset arrives; its write then fails with a broken pipe
    or a connection reset, which it must log as an expected event.
    """
    import struct

    for i in range(64):
        assert server.post(f"big-{i}", body={**TICKET, "body": "x" * 32_768}).status_code == 201
    port = int(server.url.rsplit(":", 1)[1])
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /tickets HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.recv(1024)  # the answer has begun
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert server.get("/tickets").status_code == 200  # still serving
    log = (server.db.parent / "tickets.log").read_text()
    assert "client went away mid-request" in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]
