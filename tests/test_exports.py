"""The public surface: each ``__all__`` is sorted, importable, and pinned (httpx, temporal)."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "effectgate": {
        "Agent",
        "Budget",
        "Dispatcher",
        "EffectGateMiddleware",
        "EffectKind",
        "Ledger",
        "Lookup",
        "OpState",
        "Operation",
        "Policy",
        "Receipt",
        "RunResult",
        "RunStatus",
        "ScriptedChatModel",
        "SqliteLedger",
        "StateDir",
        "ToolContext",
        "ToolResult",
        "ToolSpec",
        "Verdict",
        "__version__",
        "add_effect_nodes",
        "build_agent",
        "default_tools",
        "history_problems",
        "make_model",
        "open_agent",
        "submit",
    },
    "effectgate.errors": {
        "ApprovalError",
        "ApprovalExpiredError",
        "ApprovalMismatchError",
        "ClaimLostError",
        "ConfigError",
        "DatabaseUnavailableError",
        "DecisionError",
        "EffectgateError",
        "FollowUpError",
        "IllegalTransitionError",
        "IntentConflictError",
        "LedgerBusyError",
        "LedgerCorruptError",
        "CheckpointCorruptError",
        "LedgerError",
        "MissingHookError",
        "NotAccepted",
        "OperationBusyError",
        "OrphanedOperationError",
        "OutcomeUnknown",
        "Rejected",
        "SchemaVersionError",
        "ServiceStartError",
        "ThreadBusyError",
        "ToolCallError",
        "ToolError",
        "UnknownInterruptError",
        "WorkspaceError",
    },
}

MODULES = [
    "effectgate",
    "effectgate.errors",
    "effectgate.ledger",
    "effectgate.tools",
    "effectgate.graph",
    "effectgate.middleware",
    "effectgate.dispatch",
    "effectgate.models",
    "effectgate.demo",
    "effectgate.testing",
]


def _isort_key(name: str) -> tuple[int, str]:
    """RUF022's "isort-style" order: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_importable(name: str) -> None:
    """``__all__`` is sorted, free of duplicates, and every name resolves."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported in (sorted(exported), sorted(exported, key=_isort_key))
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert getattr(module, attr) is not None, attr


@pytest.mark.parametrize(("name", "expected"), sorted(PUBLIC.items()))
def test_pinned_exports(name: str, expected: set[str]) -> None:
    """The top-level and error exports change only on purpose."""
    assert set(importlib.import_module(name).__all__) == expected


def test_error_tree() -> None:
    """Callers can catch a category: the tree drawn in errors.py holds."""
    from effectgate import errors as e

    assert issubclass(e.LedgerBusyError, e.LedgerError)
    assert issubclass(e.ClaimLostError, e.LedgerError)
    assert issubclass(e.ApprovalExpiredError, e.ApprovalError)
    for cls in (e.Rejected, e.NotAccepted, e.OutcomeUnknown):
        assert issubclass(cls, e.ToolError)
    assert all(issubclass(getattr(e, n), e.EffectgateError) for n in e.__all__)
