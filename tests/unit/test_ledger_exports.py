"""The public surface of ``effectgate.ledger``: the names callers are written against."""

from __future__ import annotations

import dataclasses
import typing

import effectgate.ledger as ledger

PROMISED = {
    "Ledger",
    "SqliteLedger",
    "LedgerStore",
    "OpState",
    "TERMINAL",
    "TRANSITIONS",
    "check_transition",
    "Operation",
    "Approval",
    "Receipt",
    "Budget",
    "Event",
    "Lease",
    "ThreadRecord",
    "LedgerMetrics",
    "OpenRequest",
    "full_jitter_delay",
}


def test_promised_names_are_exported() -> None:
    """Every name the other packages import is in ``__all__`` and resolves."""
    assert set(ledger.__all__) >= PROMISED
    assert all(hasattr(ledger, name) for name in ledger.__all__)
    assert len(set(ledger.__all__)) == len(ledger.__all__)


def test_records_are_frozen_and_their_type_hints_resolve() -> None:
    """Records are frozen dataclasses whose annotations resolve (pydantic/LangGraph may ask)."""
    for name in ledger.__all__:
        obj = getattr(ledger, name)
        if dataclasses.is_dataclass(obj):
            assert obj.__dataclass_params__.frozen, name  # type: ignore[attr-defined]
            typing.get_type_hints(obj)


def test_open_request_mirrors_open() -> None:
    """OpenRequest has exactly the keyword fields of Ledger.open."""
    fields = {f.name for f in dataclasses.fields(ledger.OpenRequest)}
    params = set(typing.get_type_hints(ledger.Ledger.open)) - {"return"}
    assert fields == params
