"""The mail sink as a real process: what an SMTP client sees matches what its SQLite file holds."""

from __future__ import annotations

import json
import smtplib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest

from effectgate.demo.mail_sink import read_mails_db


@dataclass
class Sink:
    process: subprocess.Popen[bytes]
    smtp_port: int
    url: str
    db: Path
    token: str

    def send(self, message_id: str, *, timeout: float = 5.0, subject: str = "Incident") -> None:
        msg = EmailMessage()
        msg["From"] = "agent@effectgate.test"
        msg["To"] = "oncall@example.test, lead@example.test"
        msg["Subject"] = subject
        msg["Message-ID"] = message_id
        msg.set_content("Disk full on db-1.\nTicket #1 opened.\n")
        with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=timeout) as client:
            client.send_message(msg)

    def get(self, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, timeout=5.0)

    def fault(self, mode: str, **extra: object) -> None:
        response = httpx.post(
            f"{self.url}/_admin/fault",
            json={"mode": mode, **extra},
            headers={"X-Effectgate-Admin-Token": self.token},
            timeout=5,
        )
        assert response.status_code == 200, response.text

    def rows(self) -> list[dict[str, object]]:
        return read_mails_db(self.db)


def launch(db: Path) -> Sink:
    ready = db.parent / f"ready-{time.monotonic_ns()}.json"
    log = (db.parent / "mail.log").open("ab")
    cmd = [sys.executable, "-m", "effectgate.demo.mail_sink", "--db", str(db), "--host"]
    cmd += ["127.0.0.1", "--smtp-port", "0", "--http-port", "0", "--ready-file", str(ready)]
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 15
    while not ready.exists():
        assert process.poll() is None, (db.parent / "mail.log").read_text()
        assert time.monotonic() < deadline, "mail sink not ready"
        time.sleep(0.02)
    info = json.loads(ready.read_text())
    assert info["pid"] == process.pid
    url = f"http://127.0.0.1:{info['http_port']}"
    smtp_port = int(info["smtp_port"])
    return Sink(process=process, smtp_port=smtp_port, url=url, db=db, token=info["admin_token"])


@pytest.fixture
def sinks() -> Iterator[list[Sink]]:
    started: list[Sink] = []
    yield started
    for sink in started:
        if sink.process.poll() is None:
            sink.process.terminate()
            try:
                sink.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sink.process.kill()
                sink.process.wait()


@pytest.fixture
def sink(tmp_path: Path, sinks: list[Sink]) -> Sink:
    sinks.append(launch(tmp_path / "mail.sqlite3"))
    return sinks[-1]


def test_accepted_message_is_stored_with_its_fields(sink: Sink) -> None:
    """A 250 means the row exists, with sender, recipients, subject, body and raw bytes."""
    sink.send("<op-1@effectgate>", subject="Disk full")
    [row] = sink.rows()
    assert row["message_id"] == "<op-1@effectgate>"
    assert row["mail_from"] == "agent@effectgate.test"
    assert row["rcpt_tos"] == ["oncall@example.test", "lead@example.test"]
    assert row["subject"] == "Disk full"
    assert row["body"] == "Disk full on db-1.\nTicket #1 opened.\n"
    assert "Message-ID: <op-1@effectgate>" in str(row["raw"])
    assert sink.get("/messages").json() == {"messages": [row]}
    found = sink.get("/messages/by-id", message_id="<op-1@effectgate>")
    assert found.json() == {**row, "copies": 1}
    assert sink.get("/_admin/stats").json() == {"data_commands": 1, "messages": 1}


def test_duplicate_sends_are_both_visible(sink: Sink) -> None:
    """SMTP has no idempotency key: a resend is stored again and shows up as copies=2."""
    sink.send("<op-1@effectgate>")
    sink.send("<op-1@effectgate>")
    assert len(sink.rows()) == 2
    found = sink.get("/messages/by-id", message_id="<op-1@effectgate>").json()
    assert (found["id"], found["copies"]) == (1, 2)


def test_unknown_message_id_is_404(sink: Sink) -> None:
    """Lookup of a Message-ID never delivered is 404 not_found."""
    missing = sink.get("/messages/by-id", message_id="<nope@x>")
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found"}


def test_reject_is_550_and_stores_nothing(sink: Sink) -> None:
    """reject: 550 5.7.1 at end of DATA on every message; no row; DATA counted."""
    sink.fault("reject")
    for _ in range(2):
        with pytest.raises(smtplib.SMTPDataError) as info:
            sink.send("<op-1@effectgate>")
        assert info.value.smtp_code == 550
        assert info.value.smtp_error == b"5.7.1 rejected"
    assert sink.rows() == []
    assert sink.get("/_admin/stats").json() == {"data_commands": 2, "messages": 0}


def test_unavailable_is_451_until_changed(sink: Sink) -> None:
    """unavailable: 451 4.3.0 until reset, nothing stored; then delivery works."""
    sink.fault("unavailable")
    for _ in range(2):
        with pytest.raises(smtplib.SMTPDataError) as info:
            sink.send("<op-1@effectgate>")
        assert info.value.smtp_code == 451
        assert info.value.smtp_error == b"4.3.0 try again later"
    assert sink.rows() == []
    sink.fault("normal")
    sink.send("<op-1@effectgate>")
    assert len(sink.rows()) == 1


def test_transient_once_fails_only_the_first_message(sink: Sink) -> None:
    """transient-once: the first DATA gets 451, the resend is stored once."""
    sink.fault("transient-once")
    with pytest.raises(smtplib.SMTPDataError) as info:
        sink.send("<op-1@effectgate>")
    assert info.value.smtp_code == 451
    assert sink.rows() == []
    sink.send("<op-1@effectgate>")
    assert [row["message_id"] for row in sink.rows()] == ["<op-1@effectgate>"]


def test_timeout_after_commit_client_times_out_but_mail_stored(sink: Sink) -> None:
    """timeout-after-commit: the client times out waiting for 250; the mail is stored."""
    sink.fault("timeout-after-commit", delay_s=1.5)
    started = time.monotonic()
    with pytest.raises(smtplib.SMTPServerDisconnected, match="timed out"):
        sink.send("<op-1@effectgate>", timeout=0.5)
    assert time.monotonic() - started < 1.4
    [row] = sink.rows()
    found = sink.get("/messages/by-id", message_id="<op-1@effectgate>")
    assert found.json()["id"] == row["id"]
    assert httpx.get(f"{sink.url}/_admin/fault").json()["mode"] == "normal"


def test_timeout_after_commit_drops_after_delay(sink: Sink) -> None:
    """With a patient client, the sink drops the session after delay_s without a reply."""
    sink.fault("timeout-after-commit", delay_s=0.5)
    started = time.monotonic()
    with pytest.raises(smtplib.SMTPServerDisconnected):
        sink.send("<op-1@effectgate>", timeout=5)
    assert 0.45 <= time.monotonic() - started < 4
    assert len(sink.rows()) == 1


def test_reset_after_commit_lookup_finds_mail(sink: Sink) -> None:
    """reset-after-commit: the connection is reset before the 250; lookup by Message-ID finds it."""
    sink.fault("reset-after-commit")
    with pytest.raises(smtplib.SMTPServerDisconnected, match="reset"):
        sink.send("<op-1@effectgate>")
    [row] = sink.rows()
    found = sink.get("/messages/by-id", message_id="<op-1@effectgate>")
    assert found.status_code == 200
    assert found.json() == {**row, "copies": 1}


def test_server_crash_after_commit(sink: Sink, sinks: list[Sink]) -> None:
    """server-crash-after-commit: disconnect, mail stored, process exits 1; restart sees it."""
    sink.fault("server-crash-after-commit")
    with pytest.raises(smtplib.SMTPServerDisconnected):
        sink.send("<op-1@effectgate>")
    assert sink.process.wait(timeout=5) == 1
    [row] = sink.rows()
    sinks.append(launch(sink.db))
    restarted = sinks[-1]
    assert restarted.get("/messages").json() == {"messages": [row]}
    assert restarted.get("/_admin/fault").json()["mode"] == "normal"
    assert restarted.get("/_admin/stats").json() == {"data_commands": 1, "messages": 1}


def test_ambiguous_unqueryable(sink: Sink) -> None:
    """ambiguous-unqueryable: timeout, lookups 503 until reset, the mail is stored."""
    sink.fault("ambiguous-unqueryable", delay_s=1.0)
    with pytest.raises(smtplib.SMTPServerDisconnected):
        sink.send("<op-1@effectgate>", timeout=0.3)
    assert len(sink.rows()) == 1
    assert sink.get("/messages/by-id", message_id="<op-1@effectgate>").status_code == 503
    sink.fault("normal")
    assert sink.get("/messages/by-id", message_id="<op-1@effectgate>").status_code == 200


def test_slow_delivers_after_delay(sink: Sink) -> None:
    """slow: the 250 comes after delay_s and the mail is stored."""
    sink.fault("slow", delay_s=0.4)
    started = time.monotonic()
    sink.send("<op-1@effectgate>")
    assert time.monotonic() - started >= 0.4
    assert len(sink.rows()) == 1


def test_slow_then_client_gives_up_nothing_is_stored(sink: Sink) -> None:
    """slow + client timeout: the hang-up cancels the session before the commit; no row ever."""
    sink.fault("slow", delay_s=0.8)
    with pytest.raises(smtplib.SMTPServerDisconnected):
        sink.send("<op-1@effectgate>", timeout=0.3)
    time.sleep(1.0)
    assert sink.rows() == []
    assert sink.get("/_admin/stats").json() == {"data_commands": 1, "messages": 0}


def test_lookups_unavailable_does_not_block_delivery(sink: Sink) -> None:
    """lookups=unavailable: by-id answers 503 while delivery still works."""
    sink.fault("normal", lookups="unavailable")
    sink.send("<op-1@effectgate>")
    assert sink.get("/messages/by-id", message_id="<op-1@effectgate>").status_code == 503
    assert len(sink.rows()) == 1


def test_after_commit_fault_lasts_times_messages(sink: Sink) -> None:
    """times=2: two sessions are reset (both stored), the third gets its 250."""
    sink.fault("reset-after-commit", times=2)
    for n in (1, 2):
        with pytest.raises(smtplib.SMTPServerDisconnected):
            sink.send(f"<op-{n}@effectgate>")
    sink.send("<op-3@effectgate>")
    ids = [row["message_id"] for row in sink.rows()]
    assert ids == ["<op-1@effectgate>", "<op-2@effectgate>", "<op-3@effectgate>"]


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_non_loopback_host_is_refused(tmp_path: Path, host: str) -> None:
    """Binding anything but loopback exits 2 with a clear message, before touching the DB."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "effectgate.demo.mail_sink", "--db", str(tmp_path / "m.db")]
    cmd += ["--host", host, "--smtp-port", "0", "--http-port", "0", "--ready-file", str(ready)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 2
    assert "loopback" in result.stderr
    assert not ready.exists()
    assert not (tmp_path / "m.db").exists()
