"""Tool contracts: what kind of side effect a tool has and how to look it up later.

The contract, not the state machine, decides how dispatch recovers
from an unknown outcome. This module imports neither ``effectgate.ledger`` nor
LangGraph.
"""

from __future__ import annotations

import enum
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from effectgate._intent import default_operation_id
from effectgate._intent import intent_hash as _intent_hash
from effectgate.errors import ToolCallError

__all__ = [
    "EffectKind",
    "Lookup",
    "Reconciler",
    "ToolContext",
    "ToolResult",
    "ToolSpec",
]


class EffectKind(enum.StrEnum):
    """What a tool does to the outside world, and so how an unknown outcome is settled."""

    READ = "read"
    """No side effect; just run again. No ledger row."""
    IDEMPOTENT = "idempotent"
    """Running it twice with the same args leaves the same state (whole-file replace)."""
    KEYED = "keyed"
    """The external system deduplicates by an idempotency key we send (Stripe semantics)."""
    RECONCILABLE = "reconcilable"
    """The external system can be asked later whether the effect happened."""
    UNSAFE = "unsafe"
    """Neither: a repeat may duplicate the effect, and nothing can be asked."""


_DC = {"frozen": True, "slots": True, "kw_only": True}


@dataclass(**_DC)
class ToolContext:
    """What a tool learns about the attempt it is running in."""

    operation_id: str
    """The idempotency key; keyed tools send it (``Idempotency-Key``, ``Message-ID``)."""
    thread_id: str
    tool_call_id: str
    attempt: int
    """1-based attempt number; also the ledger's fencing token for this attempt."""
    deadline_at: datetime | None = None
    """Aware UTC time after which the operation may not start new attempts."""


@dataclass(**_DC)
class ToolResult:
    """What a tool returns: a JSON-compatible value and an optional external reference."""

    value: Any
    reference: str | None = None
    """Ticket id, Message-ID, file digest: what a human would check the effect by."""


@dataclass(**_DC)
class Lookup:
    """A reconciler's answer to "did operation X take effect?"."""

    status: Literal["found", "not_found", "unavailable"]
    result: ToolResult | None = None
    """The receipt's content when ``status == "found"``."""
    detail: str = ""
    """Evidence for people: what was asked and what came back."""

    @classmethod
    def found(cls, value: Any, reference: str | None = None, detail: str = "") -> Lookup:
        """The effect happened; ``value`` is the result the tool would have returned."""
        return cls(
            status="found", result=ToolResult(value=value, reference=reference), detail=detail
        )

    @classmethod
    def not_found(cls, detail: str = "") -> Lookup:
        """The external system answered and has no trace of the operation."""
        return cls(status="not_found", detail=detail)

    @classmethod
    def unavailable(cls, detail: str = "") -> Lookup:
        """The question could not be answered now (timeout, 503, lookups disabled)."""
        return cls(status="unavailable", detail=detail)


@runtime_checkable
class Reconciler(Protocol):
    """Looks an operation up in the external system, by its idempotency key."""

    def __call__(self, args: BaseModel, ctx: ToolContext) -> Lookup:
        """Ask the external system whether the operation in ``ctx`` took effect.

        Must not raise for "not there" or "cannot ask": return ``Lookup``.
        """
        ...


ToolFunc = Callable[[Any, ToolContext], "ToolResult | Any"]


def _takes_operation_id(preview: Callable[..., str]) -> bool:
    try:
        return "operation_id" in inspect.signature(preview).parameters
    except (TypeError, ValueError):  # builtins and C callables may have no signature
        return False


def _default_requires_approval() -> None:
    return None


@dataclass(**_DC)
class ToolSpec:
    """A tool and its side-effect contract.

    ``kind`` and ``reconciler`` together decide recovery: a
    ``RECONCILABLE`` tool must have a reconciler; a ``KEYED`` tool may have one
    (keyed and reconcilable combine), and then the lookup is tried first.

    Raises:
        ValueError: at construction, for a RECONCILABLE tool without a
            reconciler, a READ tool with one, or an empty name.
    """

    name: str
    description: str
    args_schema: type[BaseModel]
    """Pydantic model that validates and normalizes arguments before hashing."""
    func: ToolFunc
    """``func(args, ctx) -> ToolResult | value``; raises ``ToolError`` subclasses."""
    kind: EffectKind
    version: str = "1"
    """Part of the intent hash: a new version invalidates earlier approvals."""
    reconciler: Reconciler | None = None
    not_found_is_final: bool = False
    """Whether a reconciler's "not found" proves the effect did not happen."""
    requires_approval: bool | None = field(default_factory=_default_requires_approval)
    """Whether a human must review each call; ``None`` means "every non-read tool"."""
    operation_key: Callable[[Any], str | None] | None = None
    """Business key over normalized args (``ticket:{alert_id}``); ``None`` -> default id."""
    preview: Callable[[Any], str] | None = None
    """Reviewer-facing preview of normalized args (a unified diff, mail headers).

    It may also accept a keyword ``operation_id: str | None`` to show what is
    derived from it (see ``render_preview``).
    """

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool needs a name")
        if self.kind is EffectKind.RECONCILABLE and self.reconciler is None:
            raise ValueError(f"tool {self.name!r}: a reconcilable tool needs a reconciler")
        if self.kind is EffectKind.READ and self.reconciler is not None:
            raise ValueError(f"tool {self.name!r}: a read tool has nothing to reconcile")

    @property
    def is_read(self) -> bool:
        """Whether the tool has no side effect."""
        return self.kind is EffectKind.READ

    @property
    def needs_review(self) -> bool:
        """Whether each call stops for human review (default: every non-read tool)."""
        return (not self.is_read) if self.requires_approval is None else self.requires_approval

    def normalize(self, raw_args: Mapping[str, Any], *, tool_call_id: str | None = None) -> Any:
        """Validate and normalize raw arguments with the tool's own schema.

        Args:
            raw_args: the arguments as the model or a reviewer gave them.
            tool_call_id: named in the error, if known.

        Returns:
            An instance of ``args_schema``.

        Raises:
            ToolCallError: the arguments fail the schema (or path confinement),
                or a string the schema accepted holds a lone surrogate.
        """
        if not isinstance(raw_args, Mapping):
            raise ToolCallError(
                f"tool {self.name!r}: arguments must be a JSON object, "
                f"got {type(raw_args).__name__}",
                tool=self.name,
                tool_call_id=tool_call_id,
            )
        try:
            validated = self.args_schema.model_validate(dict(raw_args))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(args)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolCallError(
                f"tool {self.name!r}: invalid arguments: {problems}",
                tool=self.name,
                tool_call_id=tool_call_id,
            ) from exc
        try:
            json.dumps(self.args_dict(validated), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate the schema let through (a model's JSON escape of
            # U+D800 alone): no text holds it, so the call could be neither
            # hashed, stored nor shown for review. Told to the model as malformed.
            raise ToolCallError(
                f"tool {self.name!r}: invalid arguments: a string holds a lone UTF-16 "
                "surrogate (not Unicode text)",
                tool=self.name,
                tool_call_id=tool_call_id,
            ) from None
        return validated

    def args_dict(self, args: BaseModel) -> dict[str, Any]:
        """Return normalized args as a JSON-compatible dict (what is hashed and stored)."""
        return args.model_dump(mode="json")

    def intent_hash(self, args: BaseModel) -> str:
        """Return the intent hash of a normalized call of this tool."""
        return _intent_hash(self.name, self.version, self.args_dict(args))

    def operation_id_for(self, args: BaseModel, *, thread_id: str, tool_call_id: str) -> str:
        """Return the operation id: the tool's business key, or ``{thread_id}:{tool_call_id}``."""
        if self.operation_key is not None:
            key = self.operation_key(args)
            if key:
                return key
        return default_operation_id(thread_id, tool_call_id)

    def render_preview(self, args: BaseModel, *, operation_id: str | None = None) -> str:
        """Return the reviewer preview, or the args as indented JSON when none is defined.

        Args:
            args: normalized arguments.
            operation_id: the call's operation id, when known; handed to a
                preview that takes an ``operation_id`` keyword (send_email shows
                the Message-ID derived from it).
        """
        if self.preview is not None:
            if operation_id is not None and _takes_operation_id(self.preview):
                return self.preview(args, operation_id=operation_id)  # type: ignore[call-arg]
            return self.preview(args)

        return json.dumps(self.args_dict(args), indent=2, ensure_ascii=False, sort_keys=True)

    def to_openai_tool(self) -> dict[str, Any]:
        """Return the OpenAI function-tool definition the model is bound with."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.args_schema.model_json_schema(),
            },
        }

    def call(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        """Run the tool once and wrap a plain return value in ``ToolResult``.

        Raises:
            ToolError: whatever the tool raises to say what happened.
        """
        out = self.func(args, ctx)
        return out if isinstance(out, ToolResult) else ToolResult(value=out)
