"""Tool contracts and the built-in tools (docs/architecture.md, docs/custom-tools.md).

A ``ToolSpec`` says what kind of side effect a tool has (``EffectKind``), how
its arguments are normalized before hashing, how the external system can be
asked later whether it happened (``Reconciler`` -> ``Lookup``), and what a
reviewer sees. Tools raise ``Rejected`` / ``NotAccepted`` / ``OutcomeUnknown``
(``effectgate.errors``) to say what is known about the effect.

This package imports neither ``effectgate.ledger`` nor LangGraph; LangChain is
imported only when ``from_langchain_tool`` is called.
"""

from __future__ import annotations

from effectgate._intent import canonical_json, intent_hash
from effectgate.tools._contract import (
    EffectKind,
    Lookup,
    Reconciler,
    ToolContext,
    ToolResult,
    ToolSpec,
)
from effectgate.tools._langchain import from_langchain_tool
from effectgate.tools._workspace import resolve_in_workspace
from effectgate.tools.builtin import file_tools, mail_tools, shell_tool, ticket_tools

__all__ = [
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
]

for _name in ("EffectKind", "Lookup", "Reconciler", "ToolContext", "ToolResult", "ToolSpec"):
    # Reprs and docs show the public path, not the private module (httpx does this).
    globals()[_name].__module__ = __name__
del _name
