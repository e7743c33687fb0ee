"""Wrap any ordinary LangChain tool (``BaseTool`` / ``@tool``) as a ``ToolSpec``.

langchain_core is imported inside the function, so ``import effectgate.tools``
stays light and never pulls LangChain (or LangGraph) in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from effectgate._intent import canonical_json
from effectgate.errors import OutcomeUnknown, Rejected, ToolError
from effectgate.tools._contract import EffectKind, Reconciler, ToolContext, ToolResult, ToolSpec

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

__all__ = ["METADATA_KEY", "from_langchain_tool"]

METADATA_KEY = "effectgate"
"""Key in ``BaseTool.metadata`` holding a tool's declarations."""
_DECLARABLE = frozenset(
    {
        "kind",
        "version",
        "reconciler",
        "not_found_is_final",
        "requires_approval",
        "operation_key",
        "preview",
    }
)
_CONTROL_FLOW = frozenset({"GraphBubbleUp"})
"""LangGraph's interrupt/bubble-up exceptions, matched by name so langgraph is never imported."""


def _declarations(tool: BaseTool, given: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``tool.metadata["effectgate"]`` with keyword arguments (which win)."""
    declared = (tool.metadata or {}).get(METADATA_KEY) or {}
    if not isinstance(declared, Mapping):
        raise ValueError(f"tool {tool.name!r}: metadata[{METADATA_KEY!r}] must be a mapping")
    unknown = set(declared) - _DECLARABLE
    if unknown:
        raise ValueError(
            f"tool {tool.name!r}: unknown declarations {sorted(unknown)}; "
            f"known: {sorted(_DECLARABLE)}"
        )
    merged = dict(declared)
    merged.update({key: value for key, value in given.items() if value is not None})
    try:
        merged["kind"] = EffectKind(merged.get("kind", EffectKind.UNSAFE))
    except ValueError:
        raise ValueError(
            f"tool {tool.name!r}: kind {merged['kind']!r} is not one of "
            f"{[str(k) for k in EffectKind]}"
        ) from None
    merged["version"] = str(merged.get("version", "1"))
    return merged


def _strict_schema(tool: BaseTool) -> type[BaseModel]:
    """Return the model-facing schema as a pydantic v2 model that forbids extra keys."""
    base = tool.tool_call_schema
    if not (isinstance(base, type) and issubclass(base, BaseModel)):
        raise ValueError(
            f"tool {tool.name!r}: its args schema must be a pydantic v2 model "
            f"(JSON-schema dicts and pydantic.v1 models are not supported)"
        )
    full = tool.get_input_schema()
    hidden = sorted(set(getattr(full, "model_fields", {})) - set(base.model_fields))
    if hidden:
        # Injected arguments (InjectedToolArg, InjectedState...) are filled by
        # LangGraph's ToolNode, which does not run effect tools here.
        raise ValueError(f"tool {tool.name!r}: injected arguments {hidden} are not supported")
    namespace = {
        "model_config": {**base.model_config, "extra": "forbid"},
        "__doc__": base.__doc__,
        "__module__": base.__module__,
    }
    return type(base.__name__, (base,), namespace)


def _as_value(out: Any) -> Any:
    """Make a tool's return value JSON-compatible, so the ledger can store it."""
    content = getattr(out, "content", None)
    if content is not None and type(out).__name__ == "ToolMessage":
        out = content
    if isinstance(out, BaseModel):
        return out.model_dump(mode="json")
    try:
        canonical_json(out)
    except (TypeError, ValueError):
        return str(out)
    return out


def _is_control_flow(exc: BaseException) -> bool:
    return any(cls.__name__ in _CONTROL_FLOW for cls in type(exc).__mro__)


def _runner(tool: BaseTool, kind: EffectKind) -> Callable[[BaseModel, ToolContext], ToolResult]:
    def run(args: BaseModel, ctx: ToolContext) -> ToolResult:
        ids = {
            "operation_id": ctx.operation_id,
            "thread_id": ctx.thread_id,
            "tool_call_id": ctx.tool_call_id,
            "attempt": ctx.attempt,
        }
        try:
            # A tool taking `config: RunnableConfig` finds the ids in config["metadata"].
            out = tool.invoke(args.model_dump(), config={"metadata": {METADATA_KEY: ids}})
        except ToolError:
            raise
        except Exception as exc:
            # Third-party code, third-party exceptions: we cannot know whether
            # the effect happened, so a side-effecting tool's failure is an
            # unknown outcome; a read's is a plain refusal.
            if _is_control_flow(exc):
                raise
            message = f"tool {tool.name!r} raised {type(exc).__name__}: {exc}"
            if kind is EffectKind.READ:
                raise Rejected(message) from exc
            raise OutcomeUnknown(message + "; whether it took effect is unknown") from exc
        return out if isinstance(out, ToolResult) else ToolResult(value=_as_value(out))

    return run


def from_langchain_tool(
    tool: BaseTool,
    *,
    kind: EffectKind | str | None = None,
    version: str | None = None,
    reconciler: Reconciler | None = None,
    not_found_is_final: bool | None = None,
    requires_approval: bool | None = None,
    operation_key: Callable[[Any], str | None] | None = None,
    preview: Callable[[Any], str] | None = None,
) -> ToolSpec:
    """Turn a LangChain tool into a ``ToolSpec`` with a side-effect contract.

    Declarations come from keyword arguments or from
    ``tool.metadata["effectgate"]`` (e.g. ``{"kind": "idempotent", "version":
    "2"}``); keyword arguments win. A tool that declares no kind is UNSAFE:
    every call is reviewed, and an unknown outcome goes to a human. The
    model-facing argument schema is the tool's own ``tool_call_schema``, made
    to refuse extra keys; normalized arguments are passed to ``tool.invoke``.

    A ``ToolError`` raised by the tool passes through. Any other exception
    becomes ``OutcomeUnknown`` (``Rejected`` for a READ tool), chained: a
    third-party error says nothing about whether the effect happened. The ids
    of the attempt are in ``config["metadata"]["effectgate"]`` for tools that
    take a ``config: RunnableConfig`` parameter (a keyed tool sends
    ``operation_id`` as its idempotency key).

    Args:
        tool: a ``langchain_core.tools.BaseTool`` (``@tool`` functions included).
        kind: effect kind (``EffectKind`` or its value, e.g. ``"keyed"``).
        version: part of the intent hash; default ``"1"``.
        reconciler: lookup for KEYED / RECONCILABLE tools.
        not_found_is_final: whether the lookup's "not found" proves non-effect.
        requires_approval: force review on or off; default: every non-read tool.
        operation_key: business key over normalized args.
        preview: reviewer preview over normalized args.

    Returns:
        The ``ToolSpec``, named and described as the tool is.

    Raises:
        TypeError: ``tool`` is not a LangChain ``BaseTool``.
        ValueError: an unknown declaration or kind, an unsupported schema
            (JSON-schema dict, pydantic.v1, injected arguments), an async-only
            tool, or a contract ``ToolSpec`` refuses (reconcilable without a
            reconciler).
    """
    from langchain_core.tools import BaseTool, StructuredTool

    if not isinstance(tool, BaseTool):
        raise TypeError(f"expected a LangChain BaseTool, got {type(tool).__name__}")
    if isinstance(tool, StructuredTool) and tool.func is None:
        raise ValueError(f"tool {tool.name!r} is async-only; effect tools run synchronously")
    given = {
        "kind": kind,
        "version": version,
        "reconciler": reconciler,
        "not_found_is_final": not_found_is_final,
        "requires_approval": requires_approval,
        "operation_key": operation_key,
        "preview": preview,
    }
    declared = _declarations(tool, given)
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        args_schema=_strict_schema(tool),
        func=_runner(tool, declared["kind"]),
        kind=declared["kind"],
        version=declared["version"],
        reconciler=declared.get("reconciler"),
        not_found_is_final=bool(declared.get("not_found_is_final", False)),
        requires_approval=declared.get("requires_approval"),
        operation_key=declared.get("operation_key"),
        preview=declared.get("preview"),
    )
