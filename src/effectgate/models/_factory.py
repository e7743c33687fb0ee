"""Turn a model spec string into a chat model, and load scripts for the offline model.

Specs:

- ``scripted:<name or path>``: :class:`ScriptedChatModel` playing a packaged
  script (``scripted:incident``) or a ``.yaml``/``.yml``/``.json`` file.
- ``openai:<model>``: ``langchain_openai.ChatOpenAI`` against the OpenAI API or
  any OpenAI-compatible server (llama.cpp, vLLM, Ollama), configured from
  arguments or ``$OPENAI_BASE_URL`` / ``$OPENAI_API_KEY``; temperature 0.

Model retries and effectgate's retries are separate and do not multiply.
``ChatOpenAI`` retries a failed *model request* (HTTP 408/409/429/5xx,
timeouts, connection errors) up to ``max_retries`` times, so one model step is
at most ``1 + max_retries`` HTTP requests. A model request has no side effect:
re-sending it can only cost tokens. effectgate's ledger attempts (docs/architecture.md,
the dispatch protocol) apply only to tool effects, and a model retry never re-dispatches a tool:
tool calls are dispatched by effect nodes, after review, from the AIMessage
that was checkpointed once the model step returned. The openai client's
implicit default is also 2 retries (the openai client's default), but it is
passed explicitly here (``DEFAULT_OPENAI_MAX_RETRIES``) so the number of
requests a fake server sees is visible in the code, not hidden in a library.

``ChatOpenAI`` is built with ``disable_streaming="tool_calling"``: when tools
are bound, ``stream()`` (and LangGraph's ``stream_mode="messages"``) makes one
non-streaming request, because LangChain merges streamed tool-call arguments
with a partial-JSON parser that turns invalid JSON (``{bad``) into ``{}``, so a
malformed call would silently look like a valid call with no arguments.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from langchain_core.language_models import BaseChatModel

from effectgate.errors import ConfigError
from effectgate.models._script import _SPEC_HELP, load_script
from effectgate.models._scripted import ScriptedChatModel

__all__ = [
    "DEFAULT_OPENAI_MAX_RETRIES",
    "check_base_url",
    "load_script",
    "make_model",
    "redact_url",
]

DEFAULT_OPENAI_MAX_RETRIES = 2
"""Retries of one failed model request (3 HTTP requests at most); never a tool retry."""

_SECRET_QUERY_NAMES = ("key", "token", "secret", "password", "passwd", "auth", "sig")


def redact_url(url: str) -> str:
    """Return ``url`` with its user-info and query replaced by ``***`` (safe to print)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if parts.username is not None or parts.password is not None:
        host = f"***@{host}"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


def check_base_url(url: str, *, origin: str = "--base-url") -> str:
    """Refuse a base URL that carries credentials, so none is stored or printed.

    The thread's metadata keeps the base URL (``resume`` rebuilds the model
    from it), and error messages name it; a password in the URL's user-info or
    a key in its query string would end up in the ledger and on the terminal.
    The key belongs in ``OPENAI_API_KEY`` (or ``--api-key``), which is never
    stored.

    Args:
        url: the URL as given.
        origin: where it came from, named in the error.

    Returns:
        ``url`` unchanged.

    Raises:
        ConfigError: the URL has a user name or password, a query parameter
            named like a credential, or is not http(s); the message shows the
            URL with those parts redacted.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a bad port
    except ValueError as exc:
        raise ConfigError(f"{origin}: not a URL ({exc})") from None
    if not parts.hostname:  # not a URL at all: maybe the key itself, so not echoed
        raise ConfigError(f"{origin}: give an http:// or https:// URL with a host")
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{origin} {redact_url(url)!r}: give an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{origin} {redact_url(url)!r} carries credentials; they would be stored with "
            "the thread: give the key in OPENAI_API_KEY or --api-key instead"
        )
    names = [name.lower() for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    if any(word in name for name in names for word in _SECRET_QUERY_NAMES):
        raise ConfigError(
            f"{origin} {redact_url(url)!r} has a credential in its query string; it would be "
            "stored with the thread: give the key in OPENAI_API_KEY or --api-key instead"
        )
    return url


def _make_openai(
    model: str,
    *,
    base_url: str | None,
    api_key: str | None,
    max_retries: int,
    timeout_s: float,
) -> BaseChatModel:
    key = api_key or os.environ.get("OPENAI_API_KEY") or None
    if not key:
        raise ConfigError(
            f"openai:{model} needs an API key: pass --api-key or set OPENAI_API_KEY "
            "(a local OpenAI-compatible server accepts any non-empty key)"
        )
    if max_retries < 0:
        raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if not base_url and os.environ.get("OPENAI_BASE_URL"):
        base_url = check_base_url(os.environ["OPENAI_BASE_URL"], origin="OPENAI_BASE_URL")
    from langchain_openai import ChatOpenAI  # heavy import, only when asked for

    return ChatOpenAI(
        model=model,
        base_url=base_url or None,
        api_key=key,  # type: ignore[arg-type]  # pydantic coerces str to SecretStr
        max_retries=max_retries,
        timeout=timeout_s,
        temperature=0,
        # Streamed tool-call arguments are merged by a partial-JSON parser that turns
        # invalid JSON such as '{bad' into {}: a malformed call would look valid.
        # Not streaming while tools are bound keeps it in invalid_tool_calls.
        disable_streaming="tool_calling",
    )


def make_model(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_retries: int = DEFAULT_OPENAI_MAX_RETRIES,
    timeout_s: float = 60.0,
    fresh_ids: bool = False,
) -> BaseChatModel:
    """Build the chat model a spec string names.

    Construction does no network I/O; an ``openai:`` model first talks to its
    server on the first call.

    Args:
        spec: ``"scripted:<name or path>"`` or ``"openai:<model>"``.
        base_url: OpenAI-compatible endpoint (``http://127.0.0.1:8080/v1``);
            default ``$OPENAI_BASE_URL``, else the official API.
        api_key: default ``$OPENAI_API_KEY``; required for ``openai:``.
        max_retries: retries of one failed model request (not of tools); see
            the module docstring.
        timeout_s: per-request timeout in seconds.
        fresh_ids: scripted model only; random ids as a re-proposing model would.

    Returns:
        A ``ScriptedChatModel`` or a ``ChatOpenAI``; both support ``bind_tools``.

    Raises:
        ConfigError: unknown provider, empty name, bad script, missing API key,
            credentials in ``base_url`` (see ``check_base_url``),
            negative ``max_retries`` or non-positive ``timeout_s``.
    """
    if base_url:
        check_base_url(base_url)  # stored with the thread whatever the provider
    provider, sep, rest = spec.partition(":")
    rest = rest.strip()
    if not sep or not rest:
        raise ConfigError(f"bad model spec {spec!r}: {_SPEC_HELP}")
    if provider == "scripted":
        return ScriptedChatModel.from_file(rest, fresh_ids=fresh_ids)
    if provider == "openai":
        return _make_openai(
            rest, base_url=base_url, api_key=api_key, max_retries=max_retries, timeout_s=timeout_s
        )
    raise ConfigError(f"unknown model provider {provider!r} in {spec!r}: {_SPEC_HELP}")
