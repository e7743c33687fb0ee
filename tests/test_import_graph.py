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

The same reading covers the code outside ``src`` (issue #34): tests,
benchmarks and notebooks import the public names (``from effectgate import
open_agent, StateDir``), as a user would. A test that really tests an
internal module names it in ``TEST_PRIVATE_IMPORTS`` with the reason; a
benchmark (it models user code) in the shorter ``BENCHMARK_PRIVATE_IMPORTS``;
a notebook in none. Code in a string that a test runs in a child interpreter
(``python -c``) counts too.
"""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

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


TEST_PRIVATE_IMPORTS: dict[str, str] = {
    "effectgate._failpoints": "unit tests of the failpoint switch itself (check, hit)",
    "effectgate._intent": "unit tests of argument normalisation and the default operation id",
    "effectgate._process": "a child interpreter prints its worker id without loading LangGraph",
    "effectgate._queue": "pins which threads a worker takes as ready (readiness)",
    "effectgate._recent": "unit test of the bounded recent-items set",
    "effectgate._retry_after": "unit test of Retry-After parsing (RFC 9110)",
    "effectgate._workers": "code run against an old release, where submit lived (rolling upgrade)",
    "effectgate.cli._app": "the Typer app itself, for CliRunner and its command tree",
    "effectgate.cli._decisions": "unit tests of the --approve/--decisions answerers",
    "effectgate.cli._exit": "unit tests of the error and status to exit-code mapping",
    "effectgate.cli._output": "the CLI's JSON/text output object, handed to the run report",
    "effectgate.cli._quiet_missing_node_warning": "unit test of the LangGraph log filter",
    "effectgate.cli._render": "the terminal console and tables, tested against hostile text",
    "effectgate.cli._review_ui": "the interactive review panel, tested without a terminal",
    "effectgate.cli._runner": "the run report re-raising a busy store's error (exit 75)",
    "effectgate.cli._session": "unit tests of the CLI's drive loop and failpoint check",
    "effectgate.cli._signals": "the Ctrl-C/SIGTERM stopper, tested and signalled in child code",
    "effectgate.cli._workers": "effectgate worker's loop, ready line and loop stop, run in-process",
    "effectgate.demo._faults": "unit test of the demo servers' loopback-only check",
    "effectgate.graph._messages": "unit test of the rejection ToolMessage text",
    "effectgate.graph._nodes": "the agent node alone, fed one model reply (reused call ids)",
    "effectgate.graph._pg_saver": "the PostgreSQL checkpointer, its setup lock and subclassing",
    "effectgate.graph._reading": "patches the cold-status reader to prove the shortcut is taken",
    "effectgate.graph._review": "unit test of the operation id's #n suffix choice",
    "effectgate.graph._review_resume": "the resume guard's served cases, called without a server",
    "effectgate.graph._saver": "the checkpointer's head reading and delta lineage, unit-tested",
    "effectgate.graph._state": "the message channel's snapshot-size estimate, counted",
    "effectgate.ledger._attempts": "the intent check of a decoded row, against a forged copy",
    "effectgate.ledger._codec": "the row decoders, compared and counted on damaged rows",
    "effectgate.ledger._migrations": "SQLite schema versions and triggers, tested directly",
    "effectgate.ledger._postgres": "PostgreSQL ledger internals: session, migration, clock, URLs",
    "effectgate.ledger._postgres_migrations": "PostgreSQL schema versions, tested directly",
    "effectgate.ledger._sql": "the SQL texts: the migration lock, the SQLite operations select",
    "effectgate.ledger._sqlite": "unit test of the SQLite error translation",
    "effectgate.testing.campaign._harness": "the campaign's kill span, asserted by its own test",
    "effectgate.testing.campaign._oracle": "unit test of the per-trial ledger oracle",
    "effectgate.testing.campaign._pgworkers": "the PostgreSQL trial's thread count, asserted",
    "effectgate.testing.campaign._systems": "the campaign's fork point, reused to replay a thread",
    "effectgate.tools._workspace": "unit tests of workspace path resolution and inventory",
}
"""``{private module (or private name of a public one): why a test imports it}``."""

BENCHMARK_PRIVATE_IMPORTS: dict[str, str] = {
    "effectgate.graph._state": "the profiler wraps the message channel's snapshot-size estimate",
    "effectgate.ledger._codec": "fills 100k-row ledgers with raw INSERTs in the store's encoding",
    "effectgate.ledger._migrations": "lifts the recoveries guard trigger to undo a recovery",
    "effectgate.ledger._sqlite": "the profiler wraps the SQLite store's reader and transaction",
}
"""The same for ``benchmarks/``: only what a benchmark cannot measure through public names."""


def _private_part(dotted: str) -> str | None:
    """``effectgate.a._b.c`` -> ``effectgate.a._b``: the name up to its first private part.

    ``None`` for a name outside effectgate or with no private part (a dunder
    such as ``__version__`` is public).
    """
    parts = dotted.split(".")
    if parts[0] != "effectgate":
        return None
    for n, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[: n + 1])
    return None


def _imported_names(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every import in ``tree``, at any depth.

    ``from a.b import c`` gives ``a.b.c`` (``c`` may be a module or a name).
    A string constant that mentions effectgate and parses as Python with an
    import in it (code for ``python -c``) gives its imports at the string's line.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "effectgate" in node.value
            and "import" in node.value
        ):
            try:
                inner = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue
            for _line, name in _imported_names(inner):
                yield node.lineno, name


def _sources(folder: Path) -> Iterator[tuple[str, str]]:
    """``(path:cell, code)`` of every ``.py`` file and every notebook code cell under ``folder``."""
    for path in sorted(folder.rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    for path in sorted(folder.rglob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for n, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                source = cell["source"]
                code = "".join(source) if isinstance(source, list) else source
                yield f"{path.relative_to(ROOT)}[cell {n}]", code


def _private_imports(folder: str) -> dict[str, list[str]]:
    """``{private part: ["path:line", ...]}`` of the private imports under ``ROOT/folder``."""
    found: dict[str, list[str]] = {}
    for where, code in _sources(ROOT / folder):
        for line, name in _imported_names(ast.parse(code, filename=where)):
            private = _private_part(name)
            place = f"{where}:{line}"
            if private is not None and place not in found.get(private, []):
                found.setdefault(private, []).append(place)
    return found


def _unlisted_and_gone(
    folder: str, allowed: dict[str, str]
) -> tuple[dict[str, list[str]], set[str]]:
    found = _private_imports(folder)
    unlisted = {name: where for name, where in found.items() if name not in allowed}
    return unlisted, set(allowed) - set(found)


def test_private_imports_are_read_inside_functions_and_child_code_too() -> None:
    """An import inside a test function, and one in code a test runs with ``-c``, are seen."""
    found = _private_imports("tests")
    assert "tests/recovery/test_worker_idle.py:61" in found["effectgate.cli._workers"]
    assert any(w.startswith("tests/unit/test_dispatch.py:") for w in found["effectgate._process"])
    assert _private_part("effectgate.cli._workers.READY_LINE") == "effectgate.cli._workers"
    assert _private_part("effectgate.testing.worker._endpoints") == (
        "effectgate.testing.worker._endpoints"
    )
    assert _private_part("effectgate.__version__") is None


def test_every_allowed_private_import_says_why_in_one_line() -> None:
    """Each allow-list entry is a private name with a one-line reason."""
    for name, reason in {**TEST_PRIVATE_IMPORTS, **BENCHMARK_PRIVATE_IMPORTS}.items():
        assert _private_part(name) == name, f"{name}: not a private module or name"
        assert reason.strip() and "\n" not in reason, f"{name}: give one line of reason"


def test_tests_import_private_modules_only_from_the_allow_list() -> None:
    """A new private import in ``tests/`` fails; a listed one no test imports must leave."""
    unlisted, gone = _unlisted_and_gone("tests", TEST_PRIVATE_IMPORTS)
    assert unlisted == {}, (
        f"private import(s) in tests: {unlisted}; import the public name "
        "(effectgate, effectgate.ledger, effectgate.graph, effectgate.testing, ...), "
        "or add the module to TEST_PRIVATE_IMPORTS with why"
    )
    assert gone == set(), f"no test imports these now, remove from TEST_PRIVATE_IMPORTS: {gone}"


def test_benchmarks_import_private_modules_only_from_the_allow_list() -> None:
    """Benchmarks model user code: a new private import there fails."""
    unlisted, gone = _unlisted_and_gone("benchmarks", BENCHMARK_PRIVATE_IMPORTS)
    assert unlisted == {}, (
        f"private import(s) in benchmarks: {unlisted}; import the public name, "
        "or add the module to BENCHMARK_PRIVATE_IMPORTS with why"
    )
    assert gone == set(), f"unused now, remove from BENCHMARK_PRIVATE_IMPORTS: {gone}"


def test_notebooks_import_public_names_only() -> None:
    """A notebook is read by users as an example: it imports no private module at all."""
    found = _private_imports("notebooks")
    assert found == {}, f"private import(s) in notebooks: {found}"
