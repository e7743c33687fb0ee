"""from_langchain_tool: any LangChain tool becomes a ToolSpec; undeclared means UNSAFE."""

from __future__ import annotations

from typing import Annotated

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolArg, StructuredTool, tool

from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected, ToolCallError
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, from_langchain_tool

CTX = ToolContext(operation_id="t:c7", thread_id="t", tool_call_id="c7", attempt=2)
calls: list[dict] = []


@tool
def restart_service(service: str, grace_s: float = 5.0) -> str:
    """Restart a service."""
    calls.append({"service": service, "grace_s": grace_s})
    return f"restarted {service}"


@tool
def set_replicas(service: str, replicas: int) -> dict:
    """Set the replica count of a service."""
    return {"service": service, "replicas": replicas}


set_replicas.metadata = {"effectgate": {"kind": "idempotent", "version": "2"}}


@tool
def keyed_call(payload: str, config: RunnableConfig) -> dict:
    """Send a payload with the operation id as idempotency key."""
    return {"key": config["metadata"]["effectgate"]["operation_id"], "payload": payload}


class Lookup1(BaseTool):
    name: str = "lookup_host"
    description: str = "Look a host up."

    def _run(self, host: str) -> str:
        return host.upper()


def test_tool_declaring_nothing_is_unsafe_and_reviewed() -> None:
    """No declaration: UNSAFE, version 1, reviewed; the model-facing schema is kept."""
    spec = from_langchain_tool(restart_service)
    assert spec.kind is EffectKind.UNSAFE and spec.version == "1" and spec.needs_review
    assert spec.name == "restart_service" and spec.description == "Restart a service."
    params = spec.to_openai_tool()["function"]["parameters"]
    assert set(params["properties"]) == {"service", "grace_s"}


def test_calls_the_tool_with_normalized_args() -> None:
    """Defaults are filled and the result wrapped; 5 and 5.0 on a float field hash equal."""
    calls.clear()
    spec = from_langchain_tool(restart_service)
    a, b = spec.normalize({"service": "api"}), spec.normalize({"grace_s": 5, "service": "api"})
    assert spec.intent_hash(a) == spec.intent_hash(b)
    assert spec.call(a, CTX) == ToolResult(value="restarted api")
    assert calls == [{"service": "api", "grace_s": 5.0}]


def test_extra_keys_are_refused() -> None:
    """The wrapped schema forbids keys the tool does not declare."""
    with pytest.raises(ToolCallError, match=r"(?i)extra inputs"):
        from_langchain_tool(restart_service).normalize({"service": "api", "force": True})


def test_metadata_declarations() -> None:
    """tool.metadata['effectgate'] declares kind and version."""
    spec = from_langchain_tool(set_replicas)
    assert spec.kind is EffectKind.IDEMPOTENT and spec.version == "2"
    result = spec.call(spec.normalize({"service": "api", "replicas": 3.0}), CTX)
    assert result.value == {"service": "api", "replicas": 3}


def test_keyword_declarations_win_over_metadata() -> None:
    """Keyword arguments override metadata; a reconcilable tool takes its lookup."""
    lookup = lambda args, ctx: Lookup.not_found()  # noqa: E731
    spec = from_langchain_tool(
        set_replicas, kind="reconcilable", version="3", reconciler=lookup, not_found_is_final=True
    )
    assert spec.kind is EffectKind.RECONCILABLE and spec.version == "3"
    assert spec.reconciler is lookup and spec.not_found_is_final


def test_reconcilable_without_lookup_is_refused() -> None:
    """The ToolSpec contract applies to wrapped tools too."""
    with pytest.raises(ValueError, match="reconciler"):
        from_langchain_tool(restart_service, kind=EffectKind.RECONCILABLE)


@pytest.mark.parametrize(
    "metadata",
    [
        {"effectgate": {"kind": "sometimes"}},
        {"effectgate": {"knd": "read"}},
        {"effectgate": "read"},
    ],
)
def test_bad_declarations_are_refused(metadata: dict) -> None:
    """Unknown kinds, misspelt keys and non-mapping declarations raise ValueError."""
    bad = StructuredTool.from_function(lambda x: x, name="bad", description="d", metadata=metadata)
    with pytest.raises(ValueError):
        from_langchain_tool(bad)


def test_operation_ids_reach_tools_taking_config() -> None:
    """A tool taking config: RunnableConfig sees the attempt's ids in its metadata."""
    spec = from_langchain_tool(keyed_call, kind="keyed")
    assert spec.call(spec.normalize({"payload": "p"}), CTX).value == {"key": "t:c7", "payload": "p"}


def test_basetool_subclass() -> None:
    """A hand-written BaseTool works and may be declared READ."""
    spec = from_langchain_tool(Lookup1(), kind="read")
    assert not spec.needs_review
    assert spec.call(spec.normalize({"host": "db1"}), CTX).value == "DB1"


def test_errors_map_by_kind() -> None:
    """Foreign exceptions: OutcomeUnknown for effects, Rejected for reads; ToolErrors pass."""

    def boom(x: str) -> str:
        raise RuntimeError("disk on fire")

    def busy(x: str) -> str:
        raise NotAccepted("busy")

    failing = StructuredTool.from_function(boom, name="boom", description="d")
    with pytest.raises(OutcomeUnknown, match="disk on fire") as info:
        spec = from_langchain_tool(failing)
        spec.call(spec.normalize({"x": "1"}), CTX)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(Rejected):
        spec = from_langchain_tool(failing, kind="read")
        spec.call(spec.normalize({"x": "1"}), CTX)
    with pytest.raises(NotAccepted, match="busy"):
        spec = from_langchain_tool(StructuredTool.from_function(busy, name="busy", description="d"))
        spec.call(spec.normalize({"x": "1"}), CTX)


def test_unsupported_tools_are_refused() -> None:
    """Injected arguments, async-only tools and non-tools are refused up front."""

    @tool
    def injected(x: int, secret: Annotated[str, InjectedToolArg]) -> str:
        """Uses an injected arg."""
        return secret

    async def acall(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="injected"):
        from_langchain_tool(injected)
    with pytest.raises(ValueError, match="async-only"):
        from_langchain_tool(
            StructuredTool.from_function(coroutine=acall, name="a", description="d")
        )
    with pytest.raises(TypeError):
        from_langchain_tool(lambda x: x)  # type: ignore[arg-type]
