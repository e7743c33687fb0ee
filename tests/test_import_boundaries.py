"""Imports run one way: ledger and tools never pull in LangGraph or each other."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after_import(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def _top_level(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_ledger_imports_no_langgraph_langchain_or_tools() -> None:
    """`import effectgate.ledger` loads neither LangGraph, LangChain nor effectgate.tools."""
    loaded = _modules_after_import("effectgate.ledger")
    assert "effectgate.ledger" in loaded
    assert not {"langgraph", "langchain_core", "langchain", "langchain_openai"} & _top_level(loaded)
    assert not {m for m in loaded if m.startswith(("effectgate.tools", "effectgate.graph"))}


def test_tools_import_no_ledger_or_langgraph() -> None:
    """`import effectgate.tools` loads neither effectgate.ledger nor LangGraph."""
    loaded = _modules_after_import("effectgate.tools")
    assert "effectgate.tools" in loaded
    assert "effectgate.ledger" not in loaded
    assert not {m for m in loaded if m.startswith(("effectgate.ledger.", "effectgate.graph"))}
    assert "langgraph" not in _top_level(loaded)
