"""ToolSpec contract checks, argument normalization before hashing, exports, Retry-After."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ConfigDict

import effectgate.tools as tools_pkg
from effectgate._retry_after import parse_retry_after
from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec, ticket_tools

CTX = ToolContext(operation_id="t:c1", thread_id="t", tool_call_id="c1", attempt=1)


class ScaleArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: float
    zone: str = "eu-1"


def _spec(**overrides) -> ToolSpec:
    fields = {
        "name": "scale",
        "description": "Scale a service.",
        "args_schema": ScaleArgs,
        "func": lambda args, ctx: {"replicas": args.replicas},
        "kind": EffectKind.IDEMPOTENT,
    }
    fields.update(overrides)
    return ToolSpec(**fields)


def _lookup(args, ctx) -> Lookup:
    return Lookup.not_found("never there")


def test_reconcilable_without_reconciler_is_refused() -> None:
    """RECONCILABLE needs a reconciler: the contract is checked at construction."""
    with pytest.raises(ValueError, match="needs a reconciler"):
        _spec(kind=EffectKind.RECONCILABLE)


def test_read_with_reconciler_is_refused() -> None:
    """A READ tool has nothing to reconcile."""
    with pytest.raises(ValueError, match="nothing to reconcile"):
        _spec(kind=EffectKind.READ, reconciler=_lookup)


def test_keyed_may_have_a_reconciler_and_reconcilable_has_one() -> None:
    """KEYED combines with a lookup; RECONCILABLE with one is accepted."""
    assert _spec(kind=EffectKind.KEYED, reconciler=_lookup).reconciler is _lookup
    assert _spec(kind=EffectKind.KEYED).reconciler is None
    assert _spec(kind=EffectKind.RECONCILABLE, reconciler=_lookup).kind is EffectKind.RECONCILABLE


@pytest.mark.parametrize(
    "raw",
    [
        {"replicas": 10, "zone": "eu-1"},
        {"zone": "eu-1", "replicas": 10.0},
        {"replicas": 10.0},
    ],
    ids=["int", "float-reordered", "default-filled"],
)
def test_equal_meaning_arguments_hash_equal(raw: dict) -> None:
    """Key order, 10 vs 10.0 on a float field, and an omitted default give one hash."""
    spec = _spec()
    reference = spec.intent_hash(spec.normalize({"replicas": 10, "zone": "eu-1"}))
    assert spec.intent_hash(spec.normalize(raw)) == reference


@pytest.mark.parametrize("raw", [{"replicas": 10.5}, {"replicas": 10, "zone": "us-1"}])
def test_different_arguments_hash_differently(raw: dict) -> None:
    """A change that matters changes the hash."""
    spec = _spec()
    assert spec.intent_hash(spec.normalize(raw)) != spec.intent_hash(
        spec.normalize({"replicas": 10})
    )


def test_version_is_part_of_the_intent() -> None:
    """A new tool version is a new intent for the same arguments."""
    args = _spec().normalize({"replicas": 1})
    assert _spec().intent_hash(args) != _spec(version="2").intent_hash(args)


def test_ticket_window_minutes_int_and_float_hash_equal() -> None:
    """get_error_rate's window_minutes: 10 and 10.0 normalize alike; the default is filled."""
    spec = ticket_tools("http://127.0.0.1:9")[0]
    a = spec.normalize({"service": " checkout ", "window_minutes": 10})
    b = spec.normalize({"window_minutes": 10.0, "service": "checkout"})
    assert spec.intent_hash(a) == spec.intent_hash(b)
    assert spec.args_dict(spec.normalize({"service": "checkout"})) == {
        "service": "checkout",
        "window_minutes": 5,
    }


def test_call_wraps_plain_values() -> None:
    """A plain return value becomes ToolResult(value=...) with no reference."""
    spec = _spec()
    assert spec.call(spec.normalize({"replicas": 2}), CTX) == ToolResult(value={"replicas": 2.0})


def test_render_preview_passes_operation_id_only_when_accepted() -> None:
    """A preview taking operation_id gets it; a one-argument preview still works."""
    seen = []

    def with_id(args, *, operation_id=None):
        seen.append(operation_id)
        return f"op={operation_id}"

    args = _spec().normalize({"replicas": 1})
    assert _spec(preview=with_id).render_preview(args, operation_id="t:c1") == "op=t:c1"
    assert _spec(preview=lambda a: "plain").render_preview(args, operation_id="t:c1") == "plain"
    assert _spec(preview=with_id).render_preview(args) == "op=None"
    assert seen == ["t:c1", None]


def test_exports_are_sorted_and_public() -> None:
    """effectgate.tools exports the agreed names, sorted, with public module paths."""
    assert tools_pkg.__all__ == sorted(tools_pkg.__all__)
    assert set(tools_pkg.__all__) == {
        "EffectKind",
        "Lookup",
        "Reconciler",
        "ToolContext",
        "ToolResult",
        "ToolSpec",
        "canonical_json",
        "file_tools",
        "from_langchain_tool",
        "intent_hash",
        "mail_tools",
        "resolve_in_workspace",
        "shell_tool",
        "ticket_tools",
    }
    assert ToolSpec.__module__ == "effectgate.tools"


def test_import_pulls_in_neither_ledger_nor_langgraph() -> None:
    """import effectgate.tools loads no ledger, no langgraph and no langchain."""
    code = (
        "import sys, effectgate.tools\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core')"
        " or m.startswith('effectgate.ledger') or m.startswith('effectgate.graph')]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", timedelta(seconds=120)),
        (" 0 ", timedelta(0)),
        ("Thu, 01 Jan 2026 12:00:30 GMT", timedelta(seconds=30)),
        ("Thu, 01 Jan 2026 11:00:00 GMT", timedelta(0)),
        ("99999999", timedelta(days=1)),
        ("-5", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_retry_after(value: str | None, expected: timedelta | None) -> None:
    """Seconds and HTTP-dates parse; past dates wait zero; garbage is None; a day at most."""
    assert parse_retry_after(value, NOW) == expected
