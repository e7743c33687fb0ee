"""ChatOpenAI from make_model against FakeOpenAIServer: real HTTP on 127.0.0.1, no hosted model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from effectgate.models import make_model
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply, error_reply

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send a mail.",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                "required": ["to"],
            },
        },
    }
]


@pytest.fixture(autouse=True)
def _no_ambient_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may pick up a real key or endpoint from the developer's environment."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_ORG_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server_factory() -> Iterator[Any]:
    """Start servers on demand and always close them."""
    servers: list[FakeOpenAIServer] = []

    def start(replies: Any) -> FakeOpenAIServer:
        servers.append(FakeOpenAIServer(replies))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def model_for(server: FakeOpenAIServer, *, max_retries: int = 0, **kw: Any) -> Any:
    return make_model(
        "openai:x", base_url=server.base_url, api_key="test", max_retries=max_retries, **kw
    )


def test_tool_calls_parsed_with_server_ids(server_factory: Any) -> None:
    """bind_tools + invoke: LangChain keeps the server's tool-call ids and parsed args."""
    server = server_factory(
        [
            chat_reply(
                "",
                [
                    {
                        "name": "send_email",
                        "arguments": {"to": "a@x", "body": "hi"},
                        "id": "call_A1",
                    },
                    {"name": "send_email", "arguments": {"to": "b@x"}},
                ],
            )
        ]
    )
    ai = model_for(server).bind_tools(TOOLS).invoke("mail alice and bob")
    assert ai.tool_calls[0] == {
        "name": "send_email",
        "args": {"to": "a@x", "body": "hi"},
        "id": "call_A1",
        "type": "tool_call",
    }
    assert ai.tool_calls[1]["id"].startswith("call_") and len(ai.tool_calls[1]["id"]) == 29
    (body,) = server.requests
    assert body["model"] == "x" and body["temperature"] == 0
    assert [t["function"]["name"] for t in body["tools"]] == ["send_email"]
    assert server.request_headers[0]["authorization"] == "Bearer test"


def test_api_key_from_env(server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """OPENAI_API_KEY and OPENAI_BASE_URL from the environment reach the server."""
    server = server_factory([chat_reply("hello")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    assert make_model("openai:x", max_retries=0).invoke("hi").content == "hello"
    assert server.request_headers[0]["authorization"] == "Bearer sk-from-env"


def test_history_with_tool_results_round_trips(server_factory: Any) -> None:
    """A ToolMessage answering a call is sent back with the same tool_call_id."""
    server = server_factory([chat_reply("done")])
    history = [
        HumanMessage("mail alice"),
        AIMessage("", tool_calls=[{"name": "send_email", "args": {"to": "a"}, "id": "call_Z"}]),
        ToolMessage('{"status": "SUCCEEDED"}', tool_call_id="call_Z"),
    ]
    assert model_for(server).bind_tools(TOOLS).invoke(history).content == "done"
    sent = server.requests[0]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_Z"
    assert sent[2] == {
        "role": "tool",
        "tool_call_id": "call_Z",
        "content": '{"status": "SUCCEEDED"}',
    }


def test_429_then_200_with_one_retry_succeeds(server_factory: Any) -> None:
    """max_retries=1: a 429 (retry-after 0) is retried once; the server sees exactly 2 POSTs."""
    server = server_factory([error_reply(429, "slow down", retry_after=0), chat_reply("ok")])
    assert model_for(server, max_retries=1).invoke("hi").content == "ok"
    assert len(server.requests) == 2
    retry_counts = [h.get("x-stainless-retry-count") for h in server.request_headers]
    assert retry_counts == ["0", "1"]


def test_500_without_retries_raises_after_one_request(server_factory: Any) -> None:
    """max_retries=0: a 500 raises InternalServerError after exactly one POST."""
    server = server_factory([error_reply(500, "kaput"), chat_reply("never")])
    with pytest.raises(openai.InternalServerError, match="kaput"):
        model_for(server, max_retries=0).invoke("hi")
    assert len(server.requests) == 1


def test_default_retries_are_two(server_factory: Any) -> None:
    """The explicit default (2 retries) means 3 POSTs for a persistent 500."""
    server = server_factory([error_reply(500, retry_after=0.01)] * 3)
    model = make_model("openai:x", base_url=server.base_url, api_key="test")
    with pytest.raises(openai.InternalServerError):
        model.invoke("hi")
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("content_type", "match"),
    [
        ("application/json", "Expecting value"),
        ("text/html", "Unexpected response type from OpenAI-compatible endpoint"),
    ],
)
def test_malformed_body_raises_and_is_not_retried(
    server_factory: Any, content_type: str, match: str
) -> None:
    """A 200 whose body is not JSON raises ValueError at once, even with retries left."""
    reply = {"status": 200, "raw": "<html>oops</html>", "headers": {"Content-Type": content_type}}
    server = server_factory([reply] * 3)
    with pytest.raises(ValueError, match=match):
        model_for(server, max_retries=2).invoke("hi")
    assert len(server.requests) == 1


def test_invalid_json_arguments_land_in_invalid_tool_calls(server_factory: Any) -> None:
    """Arguments that are not JSON become invalid_tool_calls, keeping name and id."""
    server = server_factory(
        [
            chat_reply(
                "",
                [
                    {"name": "send_email", "arguments": '{"to": "a@x"', "id": "call_BAD"},
                    {"name": "send_email", "arguments": {"to": "b@x"}, "id": "call_OK"},
                ],
            )
        ]
    )
    ai = model_for(server).bind_tools(TOOLS).invoke("hi")
    assert [c["id"] for c in ai.tool_calls] == ["call_OK"]
    (bad,) = ai.invalid_tool_calls
    assert (bad["id"], bad["name"], bad["args"]) == ("call_BAD", "send_email", '{"to": "a@x"')
    assert "are not valid JSON" in str(bad["error"])


def test_missing_ids_come_through_as_none(server_factory: Any) -> None:
    """with_ids=False: LangChain does not invent ids (why the server emits them by default)."""
    server = server_factory(
        [chat_reply("", [{"name": "send_email", "arguments": {}}], with_ids=False)]
    )
    ai = model_for(server).bind_tools(TOOLS).invoke("hi")
    assert [c["id"] for c in ai.tool_calls] == [None]


def test_timeout_applies(server_factory: Any) -> None:
    """timeout_s bounds one request; max_retries=0 gives exactly one attempt."""
    server = server_factory([chat_reply("late") | {"delay_s": 2.0}])
    with pytest.raises(openai.APITimeoutError):
        model_for(server, timeout_s=0.3).invoke("hi")
    assert len(server.requests) == 1


def test_stream_with_tools_is_one_request_keeping_invalid_calls(server_factory: Any) -> None:
    """make_model does not stream tool calls: stream() sends one non-streaming request."""
    server = server_factory([chat_reply("", [{"name": "send_email", "arguments": "{bad"}])])
    chunks = list(model_for(server).bind_tools(TOOLS).stream("hi"))
    assert len(chunks) == 1 and chunks[0].tool_calls == []
    assert [c["args"] for c in chunks[0].invalid_tool_calls] == ["{bad"]
    assert not server.requests[0].get("stream")


def test_sse_stream_without_tools(server_factory: Any) -> None:
    """Without tools the model streams; the server answers with SSE chunks."""
    server = server_factory([chat_reply("hello world")])
    chunks = list(model_for(server).stream("hi"))
    assert "".join(str(c.content) for c in chunks) == "hello world"
    assert server.requests[0]["stream"] is True


def test_streamed_tool_calls_merge_and_why_we_do_not_stream_them(server_factory: Any) -> None:
    """Plain ChatOpenAI streaming merges SSE tool calls by index, but turns '{bad' into {}."""
    reply = chat_reply(
        "",
        [
            {"name": "send_email", "arguments": {"to": "a@x"}, "id": "call_S1"},
            {"name": "send_email", "arguments": "{bad", "id": "call_S2"},
        ],
    )
    server = server_factory([reply])
    raw = ChatOpenAI(model="x", base_url=server.base_url, api_key="test", max_retries=0)  # type: ignore[arg-type]
    merged = None
    for chunk in raw.bind_tools(TOOLS).stream("hi"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None and server.requests[0]["stream"] is True
    assert [(c["id"], c["args"]) for c in merged.tool_calls] == [
        ("call_S1", {"to": "a@x"}),
        ("call_S2", {}),  # the malformed call now looks valid: hence disable_streaming
    ]


def test_responder_callable_and_exhaustion(server_factory: Any) -> None:
    """A callable sees each request body; an exhausted queue answers a clear 400."""
    seen: list[int] = []

    def responder(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(body["messages"]))
        return chat_reply(f"n={len(body['messages'])}")

    server = server_factory(responder)
    assert model_for(server).invoke([HumanMessage("a"), HumanMessage("b")]).content == "n=2"
    assert seen == [2]
    empty = server_factory([])
    with pytest.raises(openai.BadRequestError, match="no reply left for request #1"):
        model_for(empty).invoke("hi")


def test_server_binds_loopback_and_closes() -> None:
    """The server listens on 127.0.0.1 only and releases its port on close."""
    import httpx

    with FakeOpenAIServer([chat_reply("x")]) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        resp = httpx.post(server.base_url + "/nowhere", json={"a": 1}, timeout=5)
        assert resp.status_code == 404 and server.requests == [{"a": 1}]
        assert json.loads(resp.text)["error"]["message"] == "no route POST /v1/nowhere"
    with pytest.raises(httpx.ConnectError):
        httpx.post(server.base_url + "/chat/completions", json={}, timeout=2)
