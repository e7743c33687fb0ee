"""send_email over SMTP: the reconcile-only case.

SMTP has no idempotency key, so a retry cannot be deduplicated by the server.
What we can do is give every operation a stable ``Message-ID`` derived from
its operation id, and ask the mailbox afterwards whether a message with that
id arrived. The SMTP conversation is split at the one point that matters::

    connect, EHLO, MAIL FROM, RCPT TO, DATA -> 354   | payload ... "." -> 250
    <------------- nothing can be delivered -------> | <-- may be delivered -->
    failure: NotAccepted (4xx, I/O) / Rejected (5xx) | failure: OutcomeUnknown
                                                     | (4xx reply: NotAccepted,
                                                     |  5xx reply: Rejected)

A server cannot deliver a message whose terminating ``"."`` it never
received, so any failure before the payload is sent is "known not applied".
"""

from __future__ import annotations

import contextlib
import email.policy
import hashlib
import re
import smtplib
import unicodedata
from email.message import EmailMessage
from email.utils import formatdate
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected, ToolError
from effectgate.tools._contract import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec

__all__ = ["SendEmailArgs", "mail_tools", "message_id_for"]

_BODY_PREVIEW_LINES = 5
_LOCAL_HOSTNAME = "effectgate.local"
"""Our EHLO name; fixed, so smtplib never calls ``socket.getfqdn()`` (a DNS lookup)."""
_LOCAL_PART = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+")
_DOMAIN = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def message_id_for(operation_id: str) -> str:
    """Return the ``Message-ID`` of an operation: the same for every attempt of it.

    Args:
        operation_id: the operation's idempotency key.

    Returns:
        ``<{sha256(operation_id)[:32 hex]}@effectgate.local>``, angle brackets included.
    """
    digest = hashlib.sha256(operation_id.encode("utf-8")).hexdigest()[:32]
    return f"<{digest}@effectgate.local>"


def _address(value: str) -> str:
    local, at, domain = value.strip().rpartition("@")
    if not at or not _LOCAL_PART.fullmatch(local) or not _DOMAIN.fullmatch(domain):
        raise ValueError(f"{value!r} is not a plain ASCII e-mail address like name@example.com")
    return f"{local}@{domain.lower()}"


def _one_to_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _recipients(values: list[str]) -> list[str]:
    if not values:
        raise ValueError("at least one recipient is needed")
    return list(dict.fromkeys(values))  # drop repeats, keep the order


def _single_line(value: str) -> str:
    # Every line break str.splitlines() knows (VT, FF, NEL, U+2028...) and any
    # other control character would break or be refused by the header encoder
    # at dispatch; refuse them at review instead.
    bad = sorted({c for c in value if c != "\t" and unicodedata.category(c) in _CONTROL})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        raise ValueError(f"the subject must be one line of text; it contains {shown}")
    return value.strip()


_CONTROL = frozenset({"Cc", "Zl", "Zp", "Cs"})
"""Controls, line/paragraph separators, lone surrogates."""


def _unix_newlines(value: str) -> str:
    return value.replace("\r\n", "\n").replace("\r", "\n")


class SendEmailArgs(BaseModel):
    """Arguments of send_email."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    to: Annotated[
        list[Annotated[str, AfterValidator(_address)]],
        BeforeValidator(_one_to_list),
        AfterValidator(_recipients),
    ] = Field(description="Recipient addresses (one string is accepted too).")
    subject: Annotated[str, AfterValidator(_single_line)] = Field(description="One line.")
    body: Annotated[str, AfterValidator(_unix_newlines)] = Field(description="Plain text.")


def _refusal(stage: str, code: int, reply: bytes | str) -> ToolError:
    """A refusal before or at the end of DATA: 5xx is permanent, anything else is not."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    message = f"SMTP {stage}: {code} {text}".strip()
    return Rejected(message) if 500 <= code < 600 else NotAccepted(message)


def _render(args: SendEmailArgs, sender: str, message_id: str) -> bytes:
    """Return the DATA payload: CRLF lines, dot-stuffed, ending in ``CRLF . CRLF``."""
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = sender
    msg["To"] = ", ".join(args.to)
    msg["Subject"] = args.subject
    msg["Message-ID"] = message_id
    msg["Date"] = formatdate(usegmt=True)
    msg.set_content(args.body)
    data = re.sub(rb"(?m)^\.", b"..", msg.as_bytes())  # RFC 5321 §4.5.2 transparency
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n"


class _Mail:
    """send_email for one SMTP server and mailbox."""

    def __init__(
        self, smtp_host: str, smtp_port: int, mailbox_url: str, sender: str, timeout_s: float
    ) -> None:
        self.smtp_host = smtp_host
        self.smtp_port = smtp_port
        self.mailbox_url = mailbox_url.rstrip("/")
        self.sender = sender
        self.timeout_s = timeout_s

    def send(self, args: SendEmailArgs, ctx: ToolContext) -> ToolResult:
        message_id = message_id_for(ctx.operation_id)
        try:
            payload = _render(args, self.sender, message_id)
        except (ValueError, TypeError, UnicodeError) as exc:
            # Raised before any connection: nothing was sent, so no retry.
            raise Rejected(f"send_email: not sent: the message cannot be encoded: {exc}") from exc
        try:
            smtp = smtplib.SMTP(
                self.smtp_host, self.smtp_port, _LOCAL_HOSTNAME, timeout=self.timeout_s
            )
        except smtplib.SMTPConnectError as exc:
            raise _refusal("greeting", exc.smtp_code, exc.smtp_error) from exc
        except OSError as exc:  # refused, unreachable, connect timeout: nothing sent
            raise NotAccepted(f"SMTP connect {self.smtp_host}:{self.smtp_port}: {exc}") from exc
        try:
            self._envelope(smtp, args.to)
            self._data(smtp, payload)
        except BaseException:
            smtp.close()
            raise
        with contextlib.suppress(OSError):
            smtp.quit()  # delivered already; a failed goodbye changes nothing
        value = {"message_id": message_id, "to": list(args.to), "subject": args.subject}
        return ToolResult(value=value, reference=message_id)

    def _envelope(self, smtp: smtplib.SMTP, to: list[str]) -> None:
        """EHLO, MAIL FROM, RCPT TO, DATA -> 354. Any failure here: nothing delivered."""
        try:
            code, reply = smtp.ehlo()
            if not 200 <= code < 300:
                code, reply = smtp.helo()
            if not 200 <= code < 300:
                raise _refusal("HELO", code, reply)
            code, reply = smtp.mail(self.sender)
            if code != 250:
                raise _refusal("MAIL FROM", code, reply)
            refused = [(rcpt, *smtp.rcpt(rcpt)) for rcpt in to]
            refused = [(r, c, m) for r, c, m in refused if c not in (250, 251)]
            if refused:
                # All or nothing: never deliver to some recipients of one operation.
                worst = max(c for _, c, _ in refused)
                raise _refusal(f"RCPT TO {[r for r, _, _ in refused]}", worst, refused[0][2])
            code, reply = smtp.docmd("DATA")
            if code != 354:
                raise _refusal("DATA", code, reply)
        except smtplib.SMTPException as exc:
            if isinstance(exc, smtplib.SMTPResponseException):
                raise _refusal("session", exc.smtp_code, exc.smtp_error) from exc
            raise NotAccepted(f"SMTP before the message was sent: {exc}") from exc
        except OSError as exc:
            raise NotAccepted(f"SMTP before the message was sent: {exc}") from exc

    @staticmethod
    def _data(smtp: smtplib.SMTP, payload: bytes) -> None:
        """Send the payload and read the final reply; a lost reply is an unknown outcome."""
        try:
            smtp.send(payload)
            code, reply = smtp.getreply()
        except OSError as exc:
            # smtplib reports timeouts and resets as SMTPServerDisconnected (an OSError).
            raise OutcomeUnknown(f"SMTP: no reply after the message was sent: {exc}") from exc
        if code != 250:
            if 400 <= code < 600:
                raise _refusal("end of DATA", code, reply)
            raise OutcomeUnknown(f"SMTP end of DATA: unexpected reply {code} {reply!r}")

    def lookup(self, args: BaseModel, ctx: ToolContext) -> Lookup:
        """Ask the mailbox for the operation's Message-ID; never raises."""
        message_id = message_id_for(ctx.operation_id)
        url = f"{self.mailbox_url}/messages/by-id?message_id={quote(message_id, safe='')}"
        try:
            with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
                response = client.get(url)
        except httpx.HTTPError as exc:
            return Lookup.unavailable(f"GET {url}: {type(exc).__name__}: {exc}")
        detail = f"GET {url}: HTTP {response.status_code}"
        if response.status_code == 404:
            return Lookup.not_found(detail)
        if response.status_code != 200 or not isinstance(args, SendEmailArgs):
            return Lookup.unavailable(f"{detail}: {response.text[:200]}")
        try:
            stored = response.json()
            detail += f"; stored {stored.get('copies', 1)} time(s), at {stored.get('received_at')}"
        except (ValueError, AttributeError):
            return Lookup.unavailable(f"{detail}: unreadable answer {response.text[:200]!r}")
        value = {"message_id": message_id, "to": list(args.to), "subject": args.subject}
        return Lookup.found(value, message_id, detail=detail)

    def preview(self, args: SendEmailArgs, *, operation_id: str | None = None) -> str:
        shown_id = (
            message_id_for(operation_id) if operation_id else "(derived from the operation id)"
        )
        lines = args.body.split("\n")
        body = [f"  {line}" for line in lines[:_BODY_PREVIEW_LINES]]
        if len(lines) > _BODY_PREVIEW_LINES:
            body.append(f"  ... ({len(lines) - _BODY_PREVIEW_LINES} more lines)")
        head = [
            f"To: {', '.join(args.to)}",
            f"Subject: {args.subject}",
            f"Message-ID: {shown_id}",
            f"(via smtp://{self.smtp_host}:{self.smtp_port}, from {self.sender})",
            "",
        ]
        return "\n".join([*head, *body, ""])


def mail_tools(
    smtp_host: str,
    smtp_port: int,
    mailbox_url: str,
    *,
    sender: str = "effectgate@localhost",
    timeout_s: float = 5.0,
    not_found_is_final: bool = True,
) -> list[ToolSpec]:
    """Build send_email for one SMTP server and the mailbox that can be asked about it.

    ``send_email(to, subject, body)`` is RECONCILABLE. Every attempt of one
    operation carries the same ``Message-ID`` (``message_id_for``), and the
    reconciler asks ``GET {mailbox_url}/messages/by-id?message_id=...``:
    200 -> found (reference = the Message-ID), 404 -> not found, anything
    else or no answer -> unavailable. Result ``{"message_id", "to", "subject"}``,
    reference the Message-ID. ``to`` takes a list or one string; addresses are
    stripped, their domain lower-cased, repeats dropped. A recipient refused
    fails the whole message: it is delivered to all or to none.

    ``not_found_is_final=True`` is right for the demo sink: it commits each
    message to its database *before* answering 250, so once our attempt has
    ended (the client gave up and closed the connection), "not found" means
    it was never accepted and a resend cannot duplicate it. One window stays
    open: a sink still committing when the lookup runs (our client timed out
    mid-commit). Use ``False`` for a real relay, where acceptance and arrival
    in the mailbox are minutes apart.

    Args:
        smtp_host: SMTP server host.
        smtp_port: SMTP server TCP port.
        mailbox_url: base URL of the mailbox HTTP API.
        sender: envelope and ``From`` address.
        timeout_s: per socket operation (SMTP) and per request (lookup), seconds.
        not_found_is_final: whether a lookup's "not found" proves non-delivery.

    Returns:
        ``[send_email]``.

    Raises:
        ValueError: ``sender`` is not a plain address.
    """
    mail = _Mail(smtp_host, smtp_port, mailbox_url, _address(sender), timeout_s)
    return [
        ToolSpec(
            name="send_email",
            description="Send a plain-text e-mail.",
            args_schema=SendEmailArgs,
            func=mail.send,
            kind=EffectKind.RECONCILABLE,
            reconciler=mail.lookup,
            not_found_is_final=not_found_is_final,
            preview=mail.preview,
        )
    ]
