"""The import graph of ``src/effectgate``, read statically: every import counts.

``tests/test_import_boundaries.py`` checks what an import really loads at run
time; it cannot see an import inside a function until that function runs.
This test reads every ``import`` statement of every module with ``ast``
(module level, inside functions, under ``TYPE_CHECKING``) and checks two
rules of docs/architecture.md:

- no import circle (a strongly connected component of more than one module);
- nothing outside ``effectgate.cli`` and ``effectgate.testing`` imports the CLI
  (the CLI sits on top; a library module that reaches up into it ties the
  library to its command line).

``KNOWN_CIRCLES`` and ``KNOWN_UPWARD`` are the debts left, named so that they
can only shrink: a new circle or a new upward import fails here, and so does
a listed one that is gone (remove it from the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

KNOWN_CIRCLES: set[frozenset[str]] = set()
"""Circles not yet broken (issue #34)."""

KNOWN_UPWARD: set[tuple[str, str]] = set()
"""Library modules that still import the CLI (issue #34)."""


def _modules() -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _graph() -> dict[str, set[str]]:
    """``{module: {module it imports}}`` over effectgate's own modules."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    head = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*head, base] if base else head)
                targets = [f"{base}.{alias.name}" for alias in node.names]
                targets = [t if t in modules else base for t in targets]
            # A string inside ``-m effectgate.cli`` is no import; only statements count.
            for target in targets:
                hit = known(target)
                if hit and hit != name:
                    edges[name].add(hit)
    return edges


def _circles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    counter = 0
    for root, first in edges.items():
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(first))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_graph_is_read_from_function_level_imports_too() -> None:
    """A lazy import inside a function is an edge (the campaign's worker entry point has one)."""
    edges = _graph()
    assert "effectgate.testing.worker" in edges["effectgate.testing.campaign._worker"]
    assert "effectgate.cli._exit" in edges["effectgate.cli._workers"]


def test_no_import_circle_beyond_the_known_ones() -> None:
    """No new circle; a known circle that is gone must leave ``KNOWN_CIRCLES``."""
    circles = _circles(_graph())
    assert circles - KNOWN_CIRCLES == set(), f"new import circle(s): {circles - KNOWN_CIRCLES}"
    gone = KNOWN_CIRCLES - circles
    assert gone == set(), f"gone, remove from KNOWN_CIRCLES: {gone}"


def test_nothing_below_the_cli_imports_it_beyond_the_known_ones() -> None:
    """Only the CLI itself and the test harnesses import ``effectgate.cli``."""
    upward = {
        (source, target)
        for source, targets in _graph().items()
        if not source.startswith(("effectgate.cli", "effectgate.testing"))
        for target in targets
        if target == "effectgate.cli" or target.startswith("effectgate.cli.")
    }
    assert upward - KNOWN_UPWARD == set(), f"new upward import(s): {upward - KNOWN_UPWARD}"
    gone = KNOWN_UPWARD - upward
    assert gone == set(), f"gone, remove from KNOWN_UPWARD: {gone}"
