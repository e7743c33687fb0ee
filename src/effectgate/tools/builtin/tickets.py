"""Ticket tools over HTTP: get_error_rate (read) and create_ticket (keyed + reconcilable).

create_ticket sends the operation id as ``Idempotency-Key`` (Stripe
semantics: the server stores the response with the ticket in one transaction
and replays it for the same key), and its reconciler looks the ticket up by
that key. Every transport failure and status code is mapped to the typed
error that says what is known about the ticket:

==================================================  ================
what happened                                       raised
==================================================  ================
2xx                                                 (result)
409 conflict, 400, 422, any other 4xx               ``Rejected``
429, 503 (with ``Retry-After``)                     ``NotAccepted``
408, 500, 502, 504, other 5xx, 1xx/3xx              ``OutcomeUnknown``
connect error / connect or pool timeout (not sent)  ``NotAccepted``
read/write timeout or error, protocol error         ``OutcomeUnknown``
==================================================  ================
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from urllib.parse import quote

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from effectgate._retry_after import parse_retry_after
from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected
from effectgate.tools._contract import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec

__all__ = ["CreateTicketArgs", "GetErrorRateArgs", "ticket_tools"]

_BODY_PREVIEW_LINES = 8
_ERROR_EXCERPT_CHARS = 200

# Nothing reached the server: safe to call the request "not accepted".
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# The request may have been received and processed; only the answer was lost.
_MAYBE_SENT = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Severity = Literal["low", "medium", "high", "critical"]


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _blank_to_none(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return None
    return value.strip() if isinstance(value, str) else value


_HEADER_SAFE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
"""Visible ASCII, inner spaces allowed: what an HTTP field value carries as is (RFC 9110 §5.5)."""
_MAX_ALERT_ID = 200


def _alert_id(value: str | None) -> str | None:
    # The alert id becomes the Idempotency-Key header (``ticket:{alert_id}``):
    # CR/LF, other controls or non-ASCII could never be sent, so they are
    # refused here, at review, rather than found out at dispatch.
    if value is None:
        return None
    if len(value) > _MAX_ALERT_ID:
        raise ValueError(f"at most {_MAX_ALERT_ID} characters")
    if not _HEADER_SAFE.fullmatch(value):
        raise ValueError(
            "only visible ASCII characters and inner spaces (it is sent as an HTTP header)"
        )
    return value


class GetErrorRateArgs(BaseModel):
    """Arguments of get_error_rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    service: Text = Field(description="Service name, e.g. 'checkout'.")
    window_minutes: int = Field(5, ge=1, le=24 * 60, description="Window length in minutes.")


class CreateTicketArgs(BaseModel):
    """Arguments of create_ticket."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    body: str = Field(description="Ticket description (plain text).")
    severity: Annotated[Severity, BeforeValidator(_lower)] = "high"
    alert_id: Annotated[str | None, BeforeValidator(_blank_to_none), AfterValidator(_alert_id)] = (
        Field(None, description="The alert this ticket is about; one ticket per alert.")
    )


def _excerpt(response: httpx.Response) -> str:
    text = response.text
    return text[:_ERROR_EXCERPT_CHARS] + ("…" if len(text) > _ERROR_EXCERPT_CHARS else "")


def _retry_after(response: httpx.Response) -> timedelta | None:
    return parse_retry_after(response.headers.get("Retry-After"), datetime.now(UTC))


def _raise_for_write_status(response: httpx.Response, what: str) -> None:
    """Map a non-2xx answer to a create request onto what is known about the ticket."""
    code = response.status_code
    if 200 <= code < 300:
        return
    message = f"{what}: HTTP {code}: {_excerpt(response)}"
    if code in (429, 503):
        raise NotAccepted(message, retry_after=_retry_after(response))
    if code == 408 or code >= 500 or code < 400:
        # 500/502/504: the server or a proxy may have committed before failing.
        raise OutcomeUnknown(message)
    raise Rejected(message)


def _raise_for_read_status(response: httpx.Response, what: str) -> None:
    """Map a non-2xx answer to a read: nothing was changed, so nothing is unknown."""
    code = response.status_code
    if 200 <= code < 300:
        return
    message = f"{what}: HTTP {code}: {_excerpt(response)}"
    if 400 <= code < 500 and code not in (408, 429):
        raise Rejected(message)
    raise NotAccepted(message, retry_after=_retry_after(response))


def _ticket_result(payload: Any) -> ToolResult:
    if not isinstance(payload, dict) or not isinstance(payload.get("ticket_id"), int):
        raise ValueError(f"not a ticket: {payload!r:.200}")
    return ToolResult(value=payload, reference=f"TICKET-{payload['ticket_id']}")


class _Tickets:
    """The ticket tools of one service, sharing its URL and timeouts."""

    def __init__(self, base_url: str, timeout: httpx.Timeout) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _client(self) -> httpx.Client:
        # One client per call: calls may run on several threads at once, and
        # trust_env=False keeps proxy variables away from this service.
        return httpx.Client(timeout=self.timeout, trust_env=False)

    def get_error_rate(self, args: GetErrorRateArgs, ctx: ToolContext) -> ToolResult:
        url = f"{self.base_url}/metrics/error_rate"
        params: dict[str, str | int] = {
            "service": args.service,
            "window_minutes": args.window_minutes,
        }
        try:
            with self._client() as client:
                response = client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise NotAccepted(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        _raise_for_read_status(response, f"GET {url}")
        try:
            return ToolResult(value=response.json())
        except ValueError as exc:
            raise NotAccepted(f"GET {url}: answer is not JSON: {_excerpt(response)}") from exc

    def create_ticket(self, args: CreateTicketArgs, ctx: ToolContext) -> ToolResult:
        url = f"{self.base_url}/tickets"
        what = f"POST {url} (Idempotency-Key {ctx.operation_id!r})"
        request = self._create_request(url, args, ctx, what)
        try:
            with self._client() as client:
                response = client.send(request)
        except _NOT_SENT as exc:
            raise NotAccepted(f"{what}: {type(exc).__name__}: {exc}") from exc
        except _MAYBE_SENT as exc:
            raise OutcomeUnknown(f"{what}: {type(exc).__name__}: {exc}") from exc
        except httpx.TransportError as exc:
            # Any other transport failure: we cannot tell whether it was sent.
            raise OutcomeUnknown(f"{what}: {type(exc).__name__}: {exc}") from exc
        _raise_for_write_status(response, what)
        try:
            return _ticket_result(response.json())
        except ValueError as exc:
            # A 2xx means the ticket exists; only its receipt is unreadable.
            raise OutcomeUnknown(f"{what}: HTTP {response.status_code}, bad body: {exc}") from exc

    def _create_request(
        self, url: str, args: CreateTicketArgs, ctx: ToolContext, what: str
    ) -> httpx.Request:
        """Build the POST, or refuse with ``Rejected`` ("not sent") if it cannot be sent.

        Everything that could fail while encoding (a header value HTTP cannot
        carry, text JSON cannot encode) fails here, before any connection is
        opened: proof that nothing reached the server, so no retry and no
        reconciliation are needed.
        """
        key = ctx.operation_id
        try:
            if not _HEADER_SAFE.fullmatch(key):
                raise ValueError(f"Idempotency-Key {key!r} is not visible ASCII")
            return httpx.Request(
                "POST", url, json=args.model_dump(mode="json"), headers={"Idempotency-Key": key}
            )
        except (ValueError, TypeError, UnicodeError, httpx.HTTPError) as exc:
            raise Rejected(f"{what}: not sent: the request cannot be encoded: {exc}") from exc

    def lookup(self, args: BaseModel, ctx: ToolContext) -> Lookup:
        """Find the ticket created with ``ctx.operation_id`` as its key; never raises."""
        url = f"{self.base_url}/tickets/by-key/{quote(ctx.operation_id, safe='')}"
        try:
            with self._client() as client:
                response = client.get(url)
        except httpx.HTTPError as exc:
            return Lookup.unavailable(f"GET {url}: {type(exc).__name__}: {exc}")
        detail = f"GET {url}: HTTP {response.status_code}"
        if response.status_code == 404:
            return Lookup.not_found(detail)
        if response.status_code != 200:
            return Lookup.unavailable(f"{detail}: {_excerpt(response)}")
        try:
            found = _ticket_result(response.json())
        except ValueError as exc:
            return Lookup.unavailable(f"{detail}: unreadable ticket: {exc}")
        return Lookup.found(found.value, found.reference, detail=detail)

    def preview(self, args: CreateTicketArgs) -> str:
        lines = args.body.splitlines()
        shown = [f"    {line}" for line in lines[:_BODY_PREVIEW_LINES]]
        if len(lines) > _BODY_PREVIEW_LINES:
            shown.append(f"    ... ({len(lines) - _BODY_PREVIEW_LINES} more lines)")
        alert = args.alert_id if args.alert_id is not None else "(none)"
        return "\n".join(
            [
                f"create ticket at {self.base_url}",
                f"  title:    {args.title}",
                f"  severity: {args.severity}",
                f"  alert_id: {alert}",
                "  body:",
                *shown,
                "",
            ]
        )


def _ticket_key(args: CreateTicketArgs) -> str | None:
    return f"ticket:{args.alert_id}" if args.alert_id is not None else None


def ticket_tools(
    base_url: str, *, timeout_s: float = 5.0, connect_timeout_s: float = 2.0
) -> list[ToolSpec]:
    """Build get_error_rate and create_ticket for one ticket service.

    - ``get_error_rate(service, window_minutes=5)`` (READ) ->
      ``{"service", "window_minutes", "error_rate"}``. Failures raise
      ``NotAccepted`` (or ``Rejected`` for a 4xx): a read changes nothing.
    - ``create_ticket(title, body, severity="high", alert_id=None)`` (KEYED,
      with a reconciler): POST with ``Idempotency-Key: <operation id>``; a
      replay with the same key returns the same ticket. The operation id is
      ``ticket:{alert_id}`` when an alert id is given, so a re-planned call for
      the same alert maps onto the same operation. Result: the ticket JSON,
      reference ``TICKET-<id>``. The reconciler looks the ticket up by key;
      "not found" is not final (``not_found_is_final=False``): the create may
      still be in flight on a slow server, and a same-key retry is safe anyway.

    Args:
        base_url: the service's base URL, e.g. ``"http://127.0.0.1:8080"``.
        timeout_s: read/write/pool timeout per request, in seconds.
        connect_timeout_s: connect timeout, in seconds.

    Returns:
        ``[get_error_rate, create_ticket]``.

    Note:
        Idempotency-Key semantics: https://docs.stripe.com/api/idempotent_requests
    """
    tickets = _Tickets(base_url, httpx.Timeout(timeout_s, connect=connect_timeout_s))
    return [
        ToolSpec(
            name="get_error_rate",
            description="Read a service's error rate (fraction 0..1) over the last N minutes.",
            args_schema=GetErrorRateArgs,
            func=tickets.get_error_rate,
            kind=EffectKind.READ,
        ),
        ToolSpec(
            name="create_ticket",
            description=(
                "Open an incident ticket. Give alert_id when the ticket is about an alert: "
                "one ticket per alert."
            ),
            args_schema=CreateTicketArgs,
            func=tickets.create_ticket,
            kind=EffectKind.KEYED,
            reconciler=tickets.lookup,
            not_found_is_final=False,
            operation_key=_ticket_key,
            preview=tickets.preview,
        ),
    ]
