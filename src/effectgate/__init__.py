"""effectgate: a LangGraph agent whose side effects are safe to replay.

Names are re-exported lazily, so ``import effectgate.ledger`` or
``import effectgate.tools`` does not pull in LangGraph (tests/test_import_boundaries.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # graph and runner
    "Agent": "effectgate.graph",
    "Policy": "effectgate.graph",
    "RunResult": "effectgate.graph",
    "RunStatus": "effectgate.graph",
    "add_effect_nodes": "effectgate.graph",
    "build_agent": "effectgate.graph",
    "history_problems": "effectgate.graph",
    # bring your own agent (create_agent middleware: needs the langchain package)
    "EffectGateMiddleware": "effectgate.middleware",
    # dispatch
    "Dispatcher": "effectgate.dispatch",
    "Verdict": "effectgate.dispatch",
    # ledger
    "Budget": "effectgate.ledger",
    "Ledger": "effectgate.ledger",
    "OpState": "effectgate.ledger",
    "Operation": "effectgate.ledger",
    "Receipt": "effectgate.ledger",
    "SqliteLedger": "effectgate.ledger",
    # tools
    "EffectKind": "effectgate.tools",
    "Lookup": "effectgate.tools",
    "ToolContext": "effectgate.tools",
    "ToolResult": "effectgate.tools",
    "ToolSpec": "effectgate.tools",
    # app layer
    "StateDir": "effectgate._app",
    "submit": "effectgate._queue",
    "default_tools": "effectgate._app",
    "open_agent": "effectgate._app",
    # models
    "ScriptedChatModel": "effectgate.models",
    "make_model": "effectgate.models",
}

__all__ = [
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
]

if TYPE_CHECKING:
    from effectgate._app import StateDir, default_tools, open_agent
    from effectgate._queue import submit
    from effectgate.dispatch import Dispatcher, Verdict
    from effectgate.graph import (
        Agent,
        Policy,
        RunResult,
        RunStatus,
        add_effect_nodes,
        build_agent,
        history_problems,
    )
    from effectgate.ledger import Budget, Ledger, Operation, OpState, Receipt, SqliteLedger
    from effectgate.middleware import EffectGateMiddleware
    from effectgate.models import ScriptedChatModel, make_model
    from effectgate.tools import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'effectgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
