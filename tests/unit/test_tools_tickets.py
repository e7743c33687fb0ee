"""create_ticket / get_error_rate: every HTTP answer and transport failure maps to one error."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest

from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected, ToolCallError
from effectgate.tools import EffectKind, ToolContext, ToolSpec, ticket_tools
from effectgate.tools.builtin import tickets as tickets_mod

CTX = ToolContext(operation_id="ticket:A-1", thread_id="t", tool_call_id="c1", attempt=1)
TICKET = {"ticket_id": 42, "title": "t", "body": "b", "severity": "high", "alert_id": "A-1"}


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch):
    """Route the tools' HTTP through a handler; return the list of seen requests."""
    seen: list[httpx.Request] = []

    def install(handler):
        def client(self) -> httpx.Client:
            def record(request: httpx.Request) -> httpx.Response:
                seen.append(request)
                return handler(request)

            return httpx.Client(transport=httpx.MockTransport(record), timeout=self.timeout)

        monkeypatch.setattr(tickets_mod._Tickets, "_client", client)
        return seen

    return install


@pytest.fixture
def specs() -> dict[str, ToolSpec]:
    return {s.name: s for s in ticket_tools("http://tickets.test/", timeout_s=1.0)}


def create(specs: dict[str, ToolSpec], **raw):
    spec = specs["create_ticket"]
    return spec.call(spec.normalize({"title": "DB down", "body": "b", **raw}), CTX)


def test_contract(specs: dict[str, ToolSpec]) -> None:
    """create_ticket is KEYED with a lookup, not-found not final; its key comes from alert_id."""
    spec = specs["create_ticket"]
    assert spec.kind is EffectKind.KEYED and spec.reconciler is not None
    assert spec.not_found_is_final is False
    with_alert = spec.normalize({"title": "x", "body": "", "alert_id": " A-1 "})
    assert spec.operation_id_for(with_alert, thread_id="t", tool_call_id="c") == "ticket:A-1"
    without = spec.normalize({"title": "x", "body": "", "alert_id": ""})
    assert spec.operation_id_for(without, thread_id="t", tool_call_id="c") == "t:c"
    assert specs["get_error_rate"].kind is EffectKind.READ


def test_args_normalize(specs: dict[str, ToolSpec]) -> None:
    """Severity is case-folded with a default; title stripped; bad severity refused."""
    spec = specs["create_ticket"]
    a = spec.normalize({"title": " DB down ", "body": "b", "severity": "HIGH"})
    b = spec.normalize({"body": "b", "title": "DB down"})
    assert spec.intent_hash(a) == spec.intent_hash(b)
    with pytest.raises(ToolCallError):
        spec.normalize({"title": "x", "body": "b", "severity": "urgent"})


def test_success_sends_key_and_body(serve, specs) -> None:
    """2xx: the ticket is the result, TICKET-<id> the reference; the key header is sent."""
    seen = serve(lambda r: httpx.Response(201, json=TICKET))
    result = create(specs, alert_id="A-1", severity="low")
    assert result.value == TICKET and result.reference == "TICKET-42"
    assert seen[0].headers["Idempotency-Key"] == "ticket:A-1"
    assert str(seen[0].url) == "http://tickets.test/tickets"
    assert json.loads(seen[0].content) == {
        "title": "DB down",
        "body": "b",
        "severity": "low",
        "alert_id": "A-1",
    }


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (409, Rejected),
        (400, Rejected),
        (422, Rejected),
        (404, Rejected),
        (429, NotAccepted),
        (503, NotAccepted),
        (408, OutcomeUnknown),
        (500, OutcomeUnknown),
        (502, OutcomeUnknown),
        (504, OutcomeUnknown),
        (302, OutcomeUnknown),
    ],
)
def test_status_mapping(serve, specs, status: int, error: type[Exception]) -> None:
    """Each status lands on the error that says what is known about the ticket."""
    serve(lambda r: httpx.Response(status, json={"error": "x"}))
    with pytest.raises(error, match=f"HTTP {status}"):
        create(specs)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", timedelta(seconds=7)), ("Wed, 01 Jan 2020 00:00:00 GMT", timedelta(0)), (None, None)],
)
def test_retry_after_is_carried(serve, specs, header, expected) -> None:
    """503's Retry-After (seconds or HTTP-date) lands in NotAccepted.retry_after."""
    headers = {"Retry-After": header} if header else {}
    serve(lambda r: httpx.Response(503, headers=headers))
    with pytest.raises(NotAccepted) as info:
        create(specs)
    assert info.value.retry_after == expected


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (httpx.ConnectError("refused"), NotAccepted),
        (httpx.ConnectTimeout("slow connect"), NotAccepted),
        (httpx.PoolTimeout("pool"), NotAccepted),
        (httpx.ReadTimeout("no answer"), OutcomeUnknown),
        (httpx.WriteTimeout("stuck"), OutcomeUnknown),
        (httpx.ReadError("reset"), OutcomeUnknown),
        (httpx.WriteError("broken pipe"), OutcomeUnknown),
        (httpx.RemoteProtocolError("closed"), OutcomeUnknown),
    ],
)
def test_transport_mapping(serve, specs, exc: Exception, error: type[Exception]) -> None:
    """Not sent -> NotAccepted; maybe received -> OutcomeUnknown, chained."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise exc

    serve(fail)
    with pytest.raises(error) as info:
        create(specs)
    assert info.value.__cause__ is exc


def test_2xx_with_garbage_body_is_unknown(serve, specs) -> None:
    """A 2xx whose body is no ticket: it happened, but there is no receipt to keep."""
    serve(lambda r: httpx.Response(201, text="<html>ok</html>"))
    with pytest.raises(OutcomeUnknown):
        create(specs)


@pytest.mark.parametrize(
    ("response", "status"),
    [
        (httpx.Response(200, json=TICKET), "found"),
        (httpx.Response(404, json={"error": "not_found"}), "not_found"),
        (httpx.Response(503, json={"error": "lookups_unavailable"}), "unavailable"),
        (httpx.Response(200, text="nope"), "unavailable"),
    ],
)
def test_lookup_never_raises(serve, specs, response: httpx.Response, status: str) -> None:
    """The reconciler answers found / not_found / unavailable; it asks by the quoted key."""
    seen = serve(lambda r: response)
    spec = specs["create_ticket"]
    lookup = spec.reconciler(spec.normalize({"title": "x", "body": ""}), CTX)
    assert lookup.status == status
    assert seen[0].url.raw_path == b"/tickets/by-key/ticket%3AA-1"
    if status == "found":
        assert lookup.result.value == TICKET and lookup.result.reference == "TICKET-42"


def test_lookup_transport_error_is_unavailable(serve, specs) -> None:
    """No answer from the service: the lookup is unavailable, not an exception."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    serve(fail)
    spec = specs["create_ticket"]
    assert spec.reconciler(spec.normalize({"title": "x", "body": ""}), CTX).status == "unavailable"


def test_get_error_rate(serve, specs) -> None:
    """The read passes service and window; failures are NotAccepted or Rejected."""
    seen = serve(
        lambda r: httpx.Response(
            200, json={"service": "api", "window_minutes": 10, "error_rate": 0.2}
        )
    )
    spec = specs["get_error_rate"]
    assert (
        spec.call(spec.normalize({"service": "api", "window_minutes": 10}), CTX).value["error_rate"]
        == 0.2
    )
    assert dict(seen[0].url.params) == {"service": "api", "window_minutes": "10"}
    serve(lambda r: httpx.Response(500))
    with pytest.raises(NotAccepted):
        spec.call(spec.normalize({"service": "api"}), CTX)
    serve(lambda r: httpx.Response(400))
    with pytest.raises(Rejected):
        spec.call(spec.normalize({"service": "api"}), CTX)


def test_preview(specs) -> None:
    """The preview shows title, severity, alert id and the first body lines."""
    spec = specs["create_ticket"]
    body = "\n".join(f"line {i}" for i in range(12))
    text = spec.render_preview(
        spec.normalize({"title": "DB down", "body": body, "alert_id": "A-1"})
    )
    assert "title:    DB down" in text and "severity: high" in text and "alert_id: A-1" in text
    assert "line 7" in text and "line 8" not in text and "(4 more lines)" in text
