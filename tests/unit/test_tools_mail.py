"""send_email: normalization, the Message-ID, and SMTP replies mapped stage by stage."""

from __future__ import annotations

import email
import email.policy
import socket
from collections.abc import Iterator

import pytest
from aiosmtpd.controller import Controller

from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected, ToolCallError
from effectgate.tools import EffectKind, ToolContext, ToolSpec, mail_tools
from effectgate.tools.builtin.mail import message_id_for

CTX = ToolContext(operation_id="t:c1", thread_id="t", tool_call_id="c1", attempt=1)


class Handler:
    """RCPT bad@ -> 550, busy@ -> 451; DATA with subject '[NNN]' answers NNN."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("bad@"):
            return "550 5.1.1 no such user"
        if address.startswith("busy@"):
            return "451 4.2.1 mailbox busy"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.received.append(envelope.original_content)
        subject = email.message_from_bytes(envelope.original_content)["Subject"] or ""
        if subject.startswith("[") and subject[4] == "]":
            return f"{subject[1:4]} refused by test"
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def smtp() -> Iterator[tuple[Controller, Handler]]:
    handler = Handler()
    controller = Controller(
        handler, hostname="127.0.0.1", port=_free_port(), server_hostname="sink"
    )
    controller.start()
    yield controller, handler
    controller.stop()


def _spec(port: int, **kw) -> ToolSpec:
    # Port 9 on loopback: nothing listens there, so lookups are "unavailable".
    return mail_tools("127.0.0.1", port, "http://127.0.0.1:9", timeout_s=2.0, **kw)[0]


def send(spec: ToolSpec, **raw):
    return spec.call(spec.normalize({"subject": "Hi", "body": "hello", **raw}), CTX)


def test_contract_and_message_id() -> None:
    """RECONCILABLE with a lookup; the Message-ID is fixed per operation id."""
    spec = _spec(25)
    assert spec.kind is EffectKind.RECONCILABLE and spec.reconciler is not None
    assert spec.not_found_is_final is True
    assert _spec(25, not_found_is_final=False).not_found_is_final is False
    mid = message_id_for("t:c1")
    assert mid == message_id_for("t:c1") != message_id_for("t:c2")
    assert mid.startswith("<") and mid.endswith("@effectgate.local>") and len(mid) == 32 + 19


def test_recipients_normalize() -> None:
    """One string becomes a list; domains lower-cased; stripped; repeats dropped."""
    spec = _spec(25)
    a = spec.normalize({"to": " Ops@Example.COM ", "subject": " Hi ", "body": "x\r\ny"})
    b = spec.normalize(
        {"body": "x\ny", "subject": "Hi", "to": ["Ops@example.com", "Ops@EXAMPLE.com"]}
    )
    assert spec.args_dict(a) == {"to": ["Ops@example.com"], "subject": "Hi", "body": "x\ny"}
    assert spec.intent_hash(a) == spec.intent_hash(b)
    assert spec.intent_hash(a) != spec.intent_hash(
        spec.normalize({**spec.args_dict(a), "to": "ops@example.com"})
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"to": [], "subject": "s", "body": "b"},
        {"to": "not-an-address", "subject": "s", "body": "b"},
        {"to": "a@b.c, d@e.f", "subject": "s", "body": "b"},
        {"to": "a@b.c", "subject": "two\nlines", "body": "b"},
        {"to": "a@b.c", "subject": "s", "body": "b", "cc": "x@y.z"},
    ],
)
def test_bad_arguments_are_refused(raw: dict) -> None:
    """Empty or malformed recipients, header injection and extra keys fail the schema."""
    with pytest.raises(ToolCallError):
        _spec(25).normalize(raw)


def test_send_delivers_with_message_id(smtp) -> None:
    """The message arrives once with the operation's Message-ID; dots are stuffed."""
    controller, handler = smtp
    result = send(_spec(controller.port), to=["a@example.com", "b@example.com"], body=".\n..x\nend")
    mid = message_id_for("t:c1")
    assert result.value == {
        "message_id": mid,
        "to": ["a@example.com", "b@example.com"],
        "subject": "Hi",
    }
    assert result.reference == mid
    [raw] = handler.received
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert msg["Message-ID"] == mid and msg["To"] == "a@example.com, b@example.com"
    assert msg.get_content().replace("\r\n", "\n") == ".\n..x\nend\n"


@pytest.mark.parametrize(
    ("to", "error"),
    [
        (["bad@example.com"], Rejected),
        (["ok@example.com", "bad@example.com"], Rejected),
        (["busy@example.com"], NotAccepted),
        (["busy@example.com", "bad@example.com"], Rejected),
    ],
)
def test_refused_recipient_fails_the_whole_message(smtp, to, error) -> None:
    """Any refused recipient: no DATA is sent (all or none); 5xx permanent, 4xx not."""
    controller, handler = smtp
    with pytest.raises(error, match="RCPT TO"):
        send(_spec(controller.port), to=to)
    assert handler.received == []


@pytest.mark.parametrize(
    ("code", "error"), [("552", Rejected), ("554", Rejected), ("451", NotAccepted)]
)
def test_end_of_data_refusal(smtp, code: str, error) -> None:
    """A 5xx/4xx reply to the end of DATA is Rejected/NotAccepted with the server's text."""
    controller, _ = smtp
    with pytest.raises(error, match=f"end of DATA: {code}"):
        send(_spec(controller.port), to="a@example.com", subject=f"[{code}] x")


def test_connection_refused_is_not_accepted() -> None:
    """Nothing listening: nothing sent, NotAccepted."""
    with pytest.raises(NotAccepted, match="connect"):
        send(_spec(_free_port()), to="a@example.com")


def test_silence_after_payload_is_unknown() -> None:
    """A server that takes the payload and never answers: OutcomeUnknown."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    import threading

    def mute_server() -> None:
        conn, _ = listener.accept()
        with conn:
            f = conn.makefile("rb")
            conn.sendall(b"220 mute\r\n")
            for line in iter(f.readline, b""):
                if line.upper().startswith((b"EHLO", b"MAIL", b"RCPT")):
                    conn.sendall(b"250 ok\r\n")
                elif line.upper().startswith(b"DATA"):
                    conn.sendall(b"354 go\r\n")
                elif line == b".\r\n":
                    break  # swallow the end of data; never reply
            threading.Event().wait(3)

    thread = threading.Thread(target=mute_server, daemon=True)
    thread.start()
    spec = mail_tools("127.0.0.1", listener.getsockname()[1], "http://127.0.0.1:9", timeout_s=0.5)[
        0
    ]
    with pytest.raises(OutcomeUnknown, match="after the message was sent"):
        send(spec, to="a@example.com")
    listener.close()


def test_preview_shows_headers_and_first_lines() -> None:
    """To, Subject, the Message-ID as it will be, and at most five body lines."""
    spec = _spec(25)
    args = spec.normalize({"to": "a@example.com", "subject": "Hi", "body": "\n".join("1234567")})
    text = spec.render_preview(args, operation_id="t:c1")
    assert f"Message-ID: {message_id_for('t:c1')}" in text
    assert "To: a@example.com" in text and "Subject: Hi" in text
    assert "  5" in text and "  6" not in text and "(2 more lines)" in text
    assert "derived from the operation id" in spec.render_preview(args)


def test_lookup_unreachable_mailbox_is_unavailable() -> None:
    """The reconciler never raises: no mailbox answer is 'unavailable'."""
    spec = _spec(25)
    assert (
        spec.reconciler(spec.normalize({"to": "a@b.c", "subject": "s", "body": ""}), CTX).status
        == "unavailable"
    )
