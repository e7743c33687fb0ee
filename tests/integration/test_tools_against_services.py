"""Built-in ticket and mail tools against the real demo services, fault by fault.

Each test raises a fault in the server, calls the tool, and checks that the
typed error agrees with the server's own storage (``DemoServices.tickets()`` /
``.mails()``): ``Rejected`` / ``NotAccepted`` -> nothing stored; result or
``OutcomeUnknown`` -> stored (or, for a slow server, stored later).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from effectgate.demo.services import DemoServices
from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected
from effectgate.tools import ToolContext, ToolSpec, mail_tools, ticket_tools
from effectgate.tools.builtin.mail import message_id_for

CLIENT_TIMEOUT_S = 0.5
HOLD_S = 1.5
"""How long the server holds a committed request without answering (> client timeout)."""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServices]:
    with DemoServices(tmp_path_factory.mktemp("services")) as services:
        yield services


@pytest.fixture(autouse=True)
def _healthy(svc: DemoServices) -> None:
    """Every test starts with both servers up and no fault."""
    for service in ("tickets", "mail"):
        if not svc.alive(service):
            svc.restart(service)
        svc.set_fault(service, "normal")


def ctx(operation_id: str | None = None) -> ToolContext:
    op = operation_id or f"t:{uuid.uuid4().hex[:12]}"
    return ToolContext(operation_id=op, thread_id="t", tool_call_id=op.split(":")[-1], attempt=1)


def tickets_spec(svc: DemoServices, name: str = "create_ticket") -> ToolSpec:
    specs = ticket_tools(svc.endpoints.ticket_url, timeout_s=CLIENT_TIMEOUT_S)
    return next(s for s in specs if s.name == name)


def mail_spec(svc: DemoServices) -> ToolSpec:
    ep = svc.endpoints
    return mail_tools(ep.smtp_host, ep.smtp_port, ep.mail_url, timeout_s=CLIENT_TIMEOUT_S)[0]


def create(svc: DemoServices, c: ToolContext, title: str = "DB down", **extra):
    spec = tickets_spec(svc)
    return spec.call(spec.normalize({"title": title, "body": "disk 95%", **extra}), c)


def stored_tickets(svc: DemoServices, key: str) -> list[dict]:
    return [t for t in svc.tickets() if t["idempotency_key"] == key]


def ticket_lookup(svc: DemoServices, c: ToolContext):
    spec = tickets_spec(svc)
    return spec.reconciler(spec.normalize({"title": "DB down", "body": "disk 95%"}), c)


def send(svc: DemoServices, c: ToolContext, subject: str = "DB down"):
    spec = mail_spec(svc)
    return spec.call(
        spec.normalize({"to": "oncall@example.test", "subject": subject, "body": "b"}), c
    )


def stored_mails(svc: DemoServices, c: ToolContext) -> list[dict]:
    return [m for m in svc.mails() if m["message_id"] == message_id_for(c.operation_id)]


def mail_lookup(svc: DemoServices, c: ToolContext):
    spec = mail_spec(svc)
    args = spec.normalize({"to": "oncall@example.test", "subject": "DB down", "body": "b"})
    return spec.reconciler(args, c)


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- tickets ---------------------------------------------------------------


def test_ticket_created_once_and_found_by_key(svc: DemoServices) -> None:
    """normal: the result is the stored ticket; lookup by key finds the same one."""
    c = ctx("ticket:alert-normal")
    result = create(svc, c, alert_id="alert-normal")
    [row] = stored_tickets(svc, "ticket:alert-normal")
    assert result.value["ticket_id"] == row["ticket_id"]
    assert result.reference == f"TICKET-{row['ticket_id']}"
    assert row["alert_id"] == "alert-normal" and row["severity"] == "high"
    found = ticket_lookup(svc, c)
    assert found.status == "found" and found.result.reference == result.reference


def test_ticket_replay_with_same_key_returns_same_ticket(svc: DemoServices) -> None:
    """A repeat of the same operation returns the original ticket; still one row."""
    c = ctx()
    first, second = create(svc, c), create(svc, c)
    assert first.value == second.value
    assert len(stored_tickets(svc, c.operation_id)) == 1


def test_ticket_same_key_other_body_is_rejected(svc: DemoServices) -> None:
    """409 conflict -> Rejected; the original ticket is unchanged."""
    c = ctx()
    create(svc, c, title="first")
    with pytest.raises(Rejected, match="409"):
        create(svc, c, title="second")
    [row] = stored_tickets(svc, c.operation_id)
    assert row["title"] == "first"


def test_ticket_reject(svc: DemoServices) -> None:
    """reject -> Rejected, and the service stored nothing."""
    svc.set_fault("tickets", "reject")
    c = ctx()
    with pytest.raises(Rejected, match="422"):
        create(svc, c)
    assert stored_tickets(svc, c.operation_id) == []


def test_ticket_unavailable_carries_retry_after(svc: DemoServices) -> None:
    """unavailable -> NotAccepted with the server's Retry-After; nothing stored."""
    svc.set_fault("tickets", "unavailable", retry_after_s=7)
    c = ctx()
    with pytest.raises(NotAccepted) as info:
        create(svc, c)
    assert info.value.retry_after == timedelta(seconds=7)
    assert stored_tickets(svc, c.operation_id) == []


def test_ticket_transient_once_then_success(svc: DemoServices) -> None:
    """transient-once: NotAccepted (nothing stored), then the retry creates one ticket."""
    svc.set_fault("tickets", "transient-once")
    c = ctx()
    with pytest.raises(NotAccepted):
        create(svc, c)
    assert stored_tickets(svc, c.operation_id) == []
    create(svc, c)
    assert len(stored_tickets(svc, c.operation_id)) == 1


@pytest.mark.parametrize("mode", ["timeout-after-commit", "reset-after-commit"])
def test_ticket_lost_answer_is_unknown_and_found(svc: DemoServices, mode: str) -> None:
    """Commit then no answer -> OutcomeUnknown; the row exists; lookup and same-key retry agree."""
    svc.set_fault("tickets", mode, delay_s=HOLD_S)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        create(svc, c)
    [row] = stored_tickets(svc, c.operation_id)
    found = ticket_lookup(svc, c)
    assert found.status == "found" and found.result.value["ticket_id"] == row["ticket_id"]
    assert create(svc, c).value["ticket_id"] == row["ticket_id"]
    assert len(stored_tickets(svc, c.operation_id)) == 1


def test_ticket_server_crash_after_commit(svc: DemoServices) -> None:
    """Commit, then the process dies: OutcomeUnknown; lookup unavailable, found after restart."""
    svc.set_fault("tickets", "server-crash-after-commit")
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        create(svc, c)
    assert wait_for(lambda: not svc.alive("tickets"))
    [row] = stored_tickets(svc, c.operation_id)
    assert ticket_lookup(svc, c).status == "unavailable"
    svc.restart("tickets")
    found = ticket_lookup(svc, c)
    assert found.status == "found" and found.result.value["ticket_id"] == row["ticket_id"]


def test_ticket_ambiguous_unqueryable(svc: DemoServices) -> None:
    """Commit, no answer, and lookups down: unknown and unavailable, though the row exists."""
    svc.set_fault("tickets", "ambiguous-unqueryable", delay_s=HOLD_S)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        create(svc, c)
    assert len(stored_tickets(svc, c.operation_id)) == 1
    assert ticket_lookup(svc, c).status == "unavailable"


def test_ticket_slow_server_commits_after_client_gave_up(svc: DemoServices) -> None:
    """slow: the client times out before the commit, so 'not found' is not final for tickets."""
    svc.set_fault("tickets", "slow", delay_s=2.0)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        create(svc, c)
    assert ticket_lookup(svc, c).status == "not_found"
    assert tickets_spec(svc).not_found_is_final is False
    assert wait_for(lambda: len(stored_tickets(svc, c.operation_id)) == 1)
    assert ticket_lookup(svc, c).status == "found"


def test_ticket_connection_refused_is_not_accepted(svc: DemoServices) -> None:
    """Nothing listening: NotAccepted, nothing stored; lookup unavailable."""
    spec = ticket_tools(f"http://127.0.0.1:{closed_port()}", timeout_s=CLIENT_TIMEOUT_S)[1]
    c = ctx()
    with pytest.raises(NotAccepted):
        spec.call(spec.normalize({"title": "x", "body": "y"}), c)
    assert spec.reconciler(spec.normalize({"title": "x", "body": "y"}), c).status == "unavailable"
    assert stored_tickets(svc, c.operation_id) == []


def test_eight_concurrent_creates_with_one_key_make_one_ticket(svc: DemoServices) -> None:
    """8 threads, one operation id: one row, and every caller gets that ticket."""
    c = ctx("ticket:alert-concurrent")
    spec = ticket_tools(svc.endpoints.ticket_url, timeout_s=5.0)[1]
    args = spec.normalize({"title": "DB down", "body": "b", "alert_id": "alert-concurrent"})
    barrier = threading.Barrier(8)
    ids: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            ids.append(spec.call(args, c).value["ticket_id"])
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    [row] = stored_tickets(svc, "ticket:alert-concurrent")
    assert ids == [row["ticket_id"]] * 8


def test_get_error_rate_reads_the_service(svc: DemoServices) -> None:
    """get_error_rate returns what the service holds for that service name."""
    svc.set_error_rate("checkout", 0.25)
    spec = tickets_spec(svc, "get_error_rate")
    value = spec.call(spec.normalize({"service": "checkout", "window_minutes": 10.0}), ctx()).value
    assert value == {"service": "checkout", "window_minutes": 10, "error_rate": 0.25}


# --- mail ------------------------------------------------------------------


def test_mail_delivered_once_and_found(svc: DemoServices) -> None:
    """normal: one stored message with our Message-ID; lookup finds it."""
    c = ctx()
    result = send(svc, c)
    [stored] = stored_mails(svc, c)
    assert stored["rcpt_tos"] == ["oncall@example.test"] and stored["subject"] == "DB down"
    assert result.reference == message_id_for(c.operation_id)
    found = mail_lookup(svc, c)
    assert found.status == "found" and found.result.value == result.value


def test_mail_lookup_not_found_for_unsent(svc: DemoServices) -> None:
    """An operation never sent is 'not_found' (final for the sink)."""
    assert mail_lookup(svc, ctx()).status == "not_found"
    assert mail_spec(svc).not_found_is_final is True


@pytest.mark.parametrize(("mode", "error"), [("reject", Rejected), ("unavailable", NotAccepted)])
def test_mail_refused(svc: DemoServices, mode: str, error: type[Exception]) -> None:
    """550 -> Rejected, 451 -> NotAccepted; the sink stored nothing."""
    svc.set_fault("mail", mode)
    c = ctx()
    with pytest.raises(error, match="end of DATA"):
        send(svc, c)
    assert stored_mails(svc, c) == []
    assert mail_lookup(svc, c).status == "not_found"


def test_mail_transient_once_then_delivered_once(svc: DemoServices) -> None:
    """transient-once: NotAccepted, nothing stored; the retry delivers exactly one copy."""
    svc.set_fault("mail", "transient-once")
    c = ctx()
    with pytest.raises(NotAccepted):
        send(svc, c)
    assert stored_mails(svc, c) == []
    send(svc, c)
    assert len(stored_mails(svc, c)) == 1


@pytest.mark.parametrize("mode", ["timeout-after-commit", "reset-after-commit"])
def test_mail_lost_reply_is_unknown_and_found(svc: DemoServices, mode: str) -> None:
    """Commit then no 250 -> OutcomeUnknown; the message is stored; lookup finds it."""
    svc.set_fault("mail", mode, delay_s=HOLD_S)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        send(svc, c)
    assert len(stored_mails(svc, c)) == 1
    found = mail_lookup(svc, c)
    assert found.status == "found" and found.result.reference == message_id_for(c.operation_id)


def test_mail_server_crash_after_commit(svc: DemoServices) -> None:
    """Commit then the sink dies -> OutcomeUnknown; stored; found after restart."""
    svc.set_fault("mail", "server-crash-after-commit")
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        send(svc, c)
    assert wait_for(lambda: not svc.alive("mail"))
    assert len(stored_mails(svc, c)) == 1
    assert mail_lookup(svc, c).status == "unavailable"
    svc.restart("mail")
    assert mail_lookup(svc, c).status == "found"


def test_mail_ambiguous_unqueryable(svc: DemoServices) -> None:
    """No reply and lookups down: unknown and unavailable, though the message is stored."""
    svc.set_fault("mail", "ambiguous-unqueryable", delay_s=HOLD_S)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        send(svc, c)
    assert len(stored_mails(svc, c)) == 1
    assert mail_lookup(svc, c).status == "unavailable"


def test_mail_connection_refused_is_not_accepted(svc: DemoServices) -> None:
    """Nothing listening on the SMTP port: NotAccepted, nothing stored."""
    ep = svc.endpoints
    spec = mail_tools(ep.smtp_host, closed_port(), ep.mail_url, timeout_s=CLIENT_TIMEOUT_S)[0]
    c = ctx()
    with pytest.raises(NotAccepted, match="connect"):
        spec.call(spec.normalize({"to": "a@example.test", "subject": "s", "body": "b"}), c)
    assert stored_mails(svc, c) == []


def test_mail_retry_of_same_operation_reuses_message_id(svc: DemoServices, tmp_path: Path) -> None:
    """Two sends of one operation carry one Message-ID: the sink shows the duplicate plainly."""
    c = ctx()
    send(svc, c)
    send(svc, c)
    copies = stored_mails(svc, c)
    assert len(copies) == 2 and copies[0]["message_id"] == copies[1]["message_id"]


def test_mail_slow_sink_drops_the_message_when_the_client_gives_up(svc: DemoServices) -> None:
    """slow past our timeout: OutcomeUnknown, and the sink never stores it ('not found' holds)."""
    svc.set_fault("mail", "slow", delay_s=1.0)
    c = ctx()
    with pytest.raises(OutcomeUnknown):
        send(svc, c)
    time.sleep(1.5)
    assert stored_mails(svc, c) == []
    assert mail_lookup(svc, c).status == "not_found"
