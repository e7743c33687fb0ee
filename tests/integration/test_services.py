"""DemoServices: start, fault, crash, restart and read the oracle, never leaking a process."""

from __future__ import annotations

import json
import os
import signal
import smtplib
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest

from effectgate.demo import DemoServices, FaultMode, ServiceEndpoints, read_mails, read_tickets
from effectgate.demo._faults import check_loopback
from effectgate.demo.services import published_endpoints, serving
from effectgate.errors import ConfigError

TICKET = {"title": "Disk full", "body": "95% used", "severity": "high", "alert_id": "a-1"}


def _create(endpoints: ServiceEndpoints, key: str, timeout: float = 5.0) -> httpx.Response:
    return httpx.post(
        f"{endpoints.ticket_url}/tickets",
        json=TICKET,
        headers={"Idempotency-Key": key},
        timeout=timeout,
    )


def _mail(endpoints: ServiceEndpoints, message_id: str) -> None:
    msg = EmailMessage()
    msg["From"] = "agent@effectgate.test"
    msg["To"] = "oncall@example.test"
    msg["Subject"] = "Disk full"
    msg["Message-ID"] = message_id
    msg.set_content("Ticket opened.\n")
    with smtplib.SMTP(endpoints.smtp_host, endpoints.smtp_port, timeout=5) as client:
        client.send_message(msg)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ")[-1].startswith("Z"))


@pytest.fixture
def services(tmp_path: Path) -> Iterator[DemoServices]:
    with DemoServices(tmp_path / "world") as running:
        yield running


def test_start_writes_endpoints_and_stop_ends_processes(tmp_path: Path) -> None:
    """start() serves on loopback and writes endpoints.json; stop() ends both processes."""
    services = DemoServices(tmp_path)
    endpoints = services.start()
    pids = [services._running[name].process.pid for name in ("tickets", "mail")]
    try:
        assert endpoints.ticket_url.startswith("http://127.0.0.1:")
        assert endpoints.mail_url.startswith("http://127.0.0.1:")
        assert endpoints.smtp_host == "127.0.0.1"
        saved = json.loads((tmp_path / "endpoints.json").read_text())
        assert ServiceEndpoints(**{k: v for k, v in saved.items() if k != "owner"}) == endpoints
        assert saved["owner"].split(":")[1] == str(os.getpid())  # who started them
        assert published_endpoints(tmp_path) == endpoints
        assert services.alive("tickets")
        assert services.alive("mail")
        assert httpx.get(f"{endpoints.ticket_url}/tickets").json() == {"tickets": []}
    finally:
        services.stop()
    assert not any(_pid_alive(pid) for pid in pids)
    assert not services.alive("tickets")
    assert not (tmp_path / "endpoints.json").exists()
    assert {p.name for p in tmp_path.glob("*.log")} == {"tickets.log", "mail.log"}
    services.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not started"):
        _ = services.endpoints


def test_faults_stats_error_rate_and_oracle(services: DemoServices) -> None:
    """set_fault / set_error_rate / stats work over HTTP; tickets()/mails() read the DB files."""
    endpoints = services.endpoints
    services.set_fault("tickets", FaultMode.REJECT)
    assert _create(endpoints, "op-1").status_code == 422
    services.set_fault("tickets")
    assert _create(endpoints, "op-1").status_code == 201
    services.set_fault("mail", "transient-once", retry_after_s=2)
    with pytest.raises(smtplib.SMTPDataError):
        _mail(endpoints, "<op-2@effectgate>")
    _mail(endpoints, "<op-2@effectgate>")
    assert [t["idempotency_key"] for t in services.tickets()] == ["op-1"]
    assert [m["message_id"] for m in services.mails()] == ["<op-2@effectgate>"]
    assert services.stats("tickets") == {"create_requests": 2, "tickets": 1}
    assert services.stats("mail") == {"data_commands": 2, "messages": 1}
    services.set_error_rate("orders", 0.4)
    rate = httpx.get(f"{endpoints.ticket_url}/metrics/error_rate", params={"service": "orders"})
    assert rate.json()["error_rate"] == 0.4
    with pytest.raises(httpx.HTTPStatusError):
        services.set_fault("mail", "explode")


def test_crash_then_restart_sees_same_world(services: DemoServices) -> None:
    """After server-crash-after-commit the oracle still reads the row; restart() serves it."""
    before = services.endpoints
    services.set_fault("tickets", "server-crash-after-commit")
    with pytest.raises(httpx.TransportError):
        _create(before, "op-1")
    deadline = time.monotonic() + 5
    while services.alive("tickets") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not services.alive("tickets")
    assert services.alive("mail")
    [row] = services.tickets()
    after = services.restart("tickets")
    assert after.ticket_url != before.ticket_url
    assert (after.smtp_port, after.mail_url) == (before.smtp_port, before.mail_url)
    assert json.loads((services.data_dir / "endpoints.json").read_text())["ticket_url"] == (
        after.ticket_url
    )
    replay = _create(after, "op-1")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == row


def test_new_instance_on_same_data_dir_sees_same_world(tmp_path: Path) -> None:
    """Stop, then start a new DemoServices on the same data_dir: tickets and mails are there."""
    with DemoServices(tmp_path) as first:
        _create(first.endpoints, "op-1")
        _mail(first.endpoints, "<op-1@effectgate>")
    assert len(read_tickets(tmp_path)) == 1
    assert len(read_mails(tmp_path)) == 1
    with DemoServices(tmp_path) as second:
        got = httpx.get(f"{second.endpoints.mail_url}/messages/by-id")
        assert got.status_code == 400
        found = httpx.get(
            f"{second.endpoints.mail_url}/messages/by-id",
            params={"message_id": "<op-1@effectgate>"},
        )
        assert found.json()["id"] == 1
        assert len(httpx.get(f"{second.endpoints.ticket_url}/tickets").json()["tickets"]) == 1


def test_oracle_before_first_start_is_empty(tmp_path: Path) -> None:
    """read_tickets / read_mails on an empty directory return [] and create nothing."""
    assert read_tickets(tmp_path) == []
    assert read_mails(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.6.7", "::1", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    """Every loopback spelling passes the check."""
    assert check_loopback(host) == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.0.2", "example.com", ""])
def test_non_loopback_host_is_refused_before_any_process(tmp_path: Path, host: str) -> None:
    """DemoServices refuses a non-loopback host at construction, with ConfigError."""
    with pytest.raises(ConfigError, match="loopback"):
        DemoServices(tmp_path, host=host)
    assert list(tmp_path.iterdir()) == []


def test_localhost_binds_ipv4_loopback(tmp_path: Path) -> None:
    """host='localhost' binds 127.0.0.1 only, so each service has one well-defined port."""
    with DemoServices(tmp_path, host="localhost") as services:
        assert services.endpoints.ticket_url.startswith("http://127.0.0.1:")
        _mail(services.endpoints, "<op-1@effectgate>")
        assert len(services.mails()) == 1


_ORPHAN_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from effectgate.demo import DemoServices
    services = DemoServices(sys.argv[1])
    services.start()
    pids = [services._running[n].process.pid for n in ("tickets", "mail")]
    print(json.dumps(pids), flush=True)
    time.sleep(60)
    """
)


def _start_then_kill_parent(data_dir: Path, while_alive: Callable[[], None]) -> list[int]:
    """Start services from a child process, call ``while_alive``, SIGKILL the child, reap it.

    Returns the servers' pids (alive when the child printed them).
    """
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(data_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        pids: list[int] = json.loads(parent.stdout.readline())
        assert all(_pid_alive(pid) for pid in pids)
        while_alive()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    return pids


def test_servers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL the process that started the services: both servers exit on their own."""
    pids = _start_then_kill_parent(tmp_path, lambda: None)
    deadline = time.monotonic() + 5
    while any(_pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in pids if _pid_alive(pid)]
    for pid in survivors:  # never leak a server, even when the watchdog is broken
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_servers_of_a_killed_parent_are_not_adopted_while_they_still_answer(
    tmp_path: Path,
) -> None:
    """Right after ``kill -9`` of their owner the servers still answer; nobody may adopt them.

    They exit only when their watchdog next looks (up to a quarter of a
    second), so a ``resume`` started at once used to take them from
    ``endpoints.json``, send its calls there and meet refused connections
    (the ticket left NEEDS_RECONCILIATION). The file names its owner; once
    the owner is proven gone, ``serving`` says no and the command starts its
    own servers, which take the file over.
    """
    seen: list[ServiceEndpoints] = []

    def while_alive() -> None:
        published = published_endpoints(tmp_path)
        assert published is not None and serving(tmp_path, published)  # owner alive
        seen.append(published)

    pids = _start_then_kill_parent(tmp_path, while_alive)
    (published,) = seen
    try:
        assert published_endpoints(tmp_path) == published  # the file is still there
        assert not serving(tmp_path, published)
        with DemoServices(tmp_path) as mine:
            assert mine.endpoints != published
            assert published_endpoints(tmp_path) == mine.endpoints
            assert serving(tmp_path, mine.endpoints)
    finally:
        for pid in pids:
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_two_starts_on_one_data_dir_do_not_clobber_each_other(tmp_path: Path) -> None:
    """Two processes' worth of services on one data dir both get ready (two resumes at once)."""
    import threading

    results: list[object] = []

    def start() -> None:
        svc = DemoServices(tmp_path)
        try:
            results.append(svc.start())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            results.append(exc)
        finally:
            svc.stop()

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [type(r).__name__ for r in results] == ["ServiceEndpoints"] * 3
    assert not list(tmp_path.glob(".*.ready.json"))


_COPIES = ("tickets", "mail")


def _copies(data_dir: Path) -> dict[str, object]:
    return {s: json.loads((data_dir / f"{s}.ready.json").read_text()) for s in _COPIES}


def test_a_short_lived_instance_leaves_a_running_ones_endpoints_file(tmp_path: Path) -> None:
    """A brief instance beside `effectgate services`: endpoints.json keeps naming the latter.

    Before, the short-lived instance overwrote the file with its own ports,
    then deleted it when it stopped: workers started meanwhile sent mail to
    ports that closed a moment later (FAILED with no attempts left), and
    workers started after found no services at all.
    """
    path = tmp_path / "endpoints.json"
    with DemoServices(tmp_path) as long_lived:
        kept = json.loads(path.read_text())
        assert kept["ticket_url"] == long_lived.endpoints.ticket_url
        ready = _copies(tmp_path)
        with DemoServices(tmp_path) as brief:
            assert brief.endpoints.ticket_url != long_lived.endpoints.ticket_url
            assert json.loads(path.read_text()) == kept
            assert _copies(tmp_path) == ready  # the ready copies (admin token) stay too
        assert json.loads(path.read_text()) == kept  # not deleted by the brief one's stop
        # Before, the brief one overwrote and then deleted the long-lived one's
        # ready copies: its admin token (faults, metrics) was gone.
        assert _copies(tmp_path) == ready
    assert not path.exists()  # the long-lived one removed its own file
    with DemoServices(tmp_path) as first:  # a file naming closed ports is replaced
        path.write_text(json.dumps({**kept}))
        with DemoServices(tmp_path) as second:
            assert json.loads(path.read_text())["ticket_url"] == second.endpoints.ticket_url
        assert first.endpoints.ticket_url != kept["ticket_url"]
