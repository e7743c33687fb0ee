"""A local OpenAI-compatible chat server for tests: real HTTP on 127.0.0.1, scripted replies.

``ChatOpenAI(base_url=server.base_url, api_key="test")`` talks to it exactly as
to a hosted model (real HTTP, real parsing of tool calls, real retries), so
tests can check how the client handles 429/5xx, malformed bodies and bad
tool-call arguments without calling a hosted model::

    with FakeOpenAIServer([error_reply(429, retry_after=0), chat_reply("hi")]) as server:
        model = make_model("openai:x", base_url=server.base_url, api_key="test")
        model.invoke("hello")
        assert len(server.requests) == 2

Tool-call ids are always emitted unless a test asks not to (``with_ids=False``
or ``"id": None``): LangChain passes them through unchanged and the review
layer needs them.

Like OpenAI's API, the server refuses a request whose history breaks the
tool-call pairing (``pairing_problem``): an assistant message with
``tool_calls`` must be followed by one ``tool`` message per call id before
any other message, and a ``tool`` message must answer such a call. The reply
is HTTP 400 ``invalid_request_error`` naming the ids, and the request is
still recorded.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["FakeOpenAIServer", "Reply", "chat_reply", "error_reply", "pairing_problem"]

Reply = dict[str, Any]
"""``{"status": 200, "headers": {...}, "json": {...}}``, or ``"raw": str`` instead of
``"json"`` for a body sent verbatim; optional ``"delay_s"`` (seconds) before answering."""

_CHAT_PATH = "/v1/chat/completions"
_CREATED = 1_700_000_000  # fixed, so replies are byte-for-byte reproducible


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def chat_reply(
    content: str = "", tool_calls: list[dict[str, Any]] | None = None, *, with_ids: bool = True
) -> Reply:
    """Build a 200 reply holding one ``chat.completion`` choice.

    Args:
        content: the assistant text (sent as ``null`` when empty and there are tool calls).
        tool_calls: ``[{"name": str, "arguments": dict | str, "id"?: str | None}]``;
            a ``str`` is sent verbatim (use it for arguments that are not valid JSON).
            Without ``"id"`` a deterministic ``call_<24 hex>`` id is made; ``None``
            omits that call's id.
        with_ids: False omits every tool-call id (a malformed response).

    Returns:
        A reply for :class:`FakeOpenAIServer`; streamed as SSE chunks when the
        request asks for ``stream: true``.
    """
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(tool_calls or []):
        name, args = call["name"], call.get("arguments", {})
        text = args if isinstance(args, str) else json.dumps(args)
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": text},
        }
        call_id = call.get("id", f"call_{_digest(f'{i}:{name}:{text}')}")
        if with_ids and call_id is not None:
            entry["id"] = call_id
        calls.append(entry)
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": f"chatcmpl-{_digest(json.dumps(message, sort_keys=True))}",
        "object": "chat.completion",
        "created": _CREATED,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return {"status": 200, "headers": {}, "json": body}


def error_reply(
    status: int, message: str = "fake server error", *, retry_after: float | None = None
) -> Reply:
    """Build an error reply in OpenAI's ``{"error": {...}}`` shape.

    Args:
        status: HTTP status (429, 500, 503, 400...).
        message: the error message the client will show.
        retry_after: seconds; sent as ``retry-after`` and ``retry-after-ms``.
            The openai client ignores 0 and falls back to its own backoff (~0.5 s).

    Returns:
        A reply for :class:`FakeOpenAIServer`.
    """
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
        headers["retry-after-ms"] = f"{retry_after * 1000:g}"
    kind = (
        "rate_limit_exceeded"
        if status == 429
        else "invalid_request_error"
        if 400 <= status < 500
        else "server_error"
    )
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"status": status, "headers": headers, "json": body}


def _sse_events(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split a chat.completion into chunks, tool-call arguments in two deltas each."""
    choice = body["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        head: dict[str, Any] = {"index": index, "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        if "id" in call:
            head["id"] = call["id"]
        args = call["function"]["arguments"]
        half = len(args) // 2
        deltas.append({"tool_calls": [head]})
        for part in (args[:half], args[half:]):
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    events = [base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    final = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
    events.append(base | {"choices": [final]})
    return events


def pairing_problem(messages: Any) -> str | None:
    """Why a chat request's ``messages`` break OpenAI's tool-call pairing, or ``None``.

    Worded as OpenAI's 400 for the same request ("An assistant message with
    'tool_calls' must be followed by tool messages responding to each
    'tool_call_id'. The following tool_call_ids did not have response
    messages: ...").

    Args:
        messages: the request body's ``messages`` (anything else is not checked).
    """
    if not isinstance(messages, list):
        return None
    open_ids: list[str] = []
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id not in open_ids:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceeding message with 'tool_calls' (messages.[{i}], {call_id!r})."
                )
            open_ids.remove(call_id)
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_ids)}"
            )
        if role == "assistant":
            open_ids = [
                str(c.get("id")) for c in msg.get("tool_calls") or [] if isinstance(c, Mapping)
            ]
    return None


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    def do_GET(self) -> None:
        self._send_json(404, {"error": {"message": f"no route GET {self.path}"}}, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = {"_invalid_json": raw}
        owner = self.server.owner
        owner._record(body, {k.lower(): v for k, v in self.headers.items()})
        if self.path.rstrip("/") != _CHAT_PATH:
            self._send_json(404, {"error": {"message": f"no route POST {self.path}"}}, {})
            return
        problem = pairing_problem(body.get("messages"))
        if problem is not None:
            self._send(error_reply(400, problem), stream=False)
            return
        self._send(owner._next_reply(body), stream=bool(body.get("stream")))

    def _send(self, reply: Reply, *, stream: bool) -> None:
        time.sleep(float(reply.get("delay_s", 0)))
        status = int(reply.get("status", 200))
        headers = dict(reply.get("headers") or {})
        if "raw" in reply:
            data = reply["raw"]
            payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            self._send_bytes(status, payload, {"Content-Type": "application/json"} | headers)
        elif stream and status == 200:
            self._send_sse(reply["json"], headers)
        else:
            self._send_json(status, reply.get("json", {}), headers)

    def _send_json(self, status: int, obj: Any, headers: Mapping[str, str]) -> None:
        payload = json.dumps(obj).encode("utf-8")
        self._send_bytes(status, payload, {"Content-Type": "application/json"} | dict(headers))

    def _send_bytes(self, status: int, payload: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _send_sse(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        self.send_response(200)
        for key, value in ({"Content-Type": "text/event-stream"} | dict(headers)).items():
            self.send_header(key, value)
        self.end_headers()  # HTTP/1.0: closing the connection ends the stream
        for event in _sse_events(body):
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: FakeOpenAIServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client gave up (timeout tests); report anything else."""
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class FakeOpenAIServer:
    """Serve ``POST /v1/chat/completions`` on 127.0.0.1 from scripted replies.

    The server starts on construction, on a free port, in a daemon thread, and
    stops on ``close()`` or when the ``with`` block ends. Replies come from a
    sequence (one per request, in order; once exhausted each further request
    gets a 400 that says so, which the client does not retry) or from a
    callable given each parsed request body.

    Args:
        responses: the replies, or ``Callable[[dict], Reply]``.
    """

    def __init__(self, responses: Sequence[Reply] | Callable[[dict[str, Any]], Reply]) -> None:
        self._responder = responses if callable(responses) else None
        self._queue: list[Reply] = [] if callable(responses) else list(responses)
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._httpd = _HTTPServer(self)
        port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        """Endpoint for ``base_url=``: ``http://127.0.0.1:<port>/v1``."""
        self._thread = threading.Thread(
            # A short poll keeps close() fast: shutdown() waits for the next poll.
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-openai-{port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every POST body received so far (parsed JSON), oldest first; a copy."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers (lower-case names) of every POST, parallel to :attr:`requests`; a copy."""
        with self._lock:
            return list(self._headers)

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self._requests.append(body)
            self._headers.append(headers)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        if self._responder is not None:
            try:
                return self._responder(body)
            except Exception as exc:  # noqa: BLE001 - a responder bug must reach the test as an error reply
                return error_reply(400, f"FakeOpenAIServer responder raised {exc!r}")
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
            count = len(self._requests)
        return error_reply(400, f"FakeOpenAIServer: no reply left for request #{count}")

    def close(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
