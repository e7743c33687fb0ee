"""No module of ``src/effectgate`` over 800 lines without the reason written at its top.

A module that long is usually several responsibilities in one room (issue
#34). One that must stay long says why in its docstring, in a line such as
"Over 800 lines because ..." (or "Over 800 lines, for now: ..."), where the
next reader sees it.

``KNOWN_DEBTS`` are the long modules not yet split (issue #34): named so
that the debt can only shrink. A listed module that is 800 lines or fewer
now (or gone) fails here until it is removed from the list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "effectgate"

LIMIT = 800
"""Lines a module may have without a reason at its top."""

KNOWN_DEBTS: set[str] = set()
"""Modules over the limit with no reason written, being split elsewhere (issue #34)."""

_REASON = re.compile(r"Over 800 lines\b[^\n]*?(?:because|:)\s*\w")


def _lines(text: str) -> int:
    return len(text.splitlines())


def _states_why(text: str) -> bool:
    """Whether the module's docstring says why it is over the limit."""
    doc = ast.get_docstring(ast.parse(text), clean=False) or ""
    return bool(_REASON.search(doc))


def _too_long(package: Path) -> dict[str, int]:
    """``{module path under package: lines}`` of the modules over the limit with no reason."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if _lines(text) > LIMIT and not _states_why(text):
            found[str(path.relative_to(package))] = _lines(text)
    return found


def test_no_module_over_the_limit_without_a_reason() -> None:
    """A new long module, or one that lost its reason, fails; the known debts are left."""
    unexplained = {name: n for name, n in _too_long(PACKAGE).items() if name not in KNOWN_DEBTS}
    assert unexplained == {}, (
        f"modules over {LIMIT} lines with no 'Over 800 lines because ...' at their top: "
        f"{unexplained}; split them by responsibility, or write why not"
    )


def test_the_known_debts_only_shrink() -> None:
    """A listed module now within the limit (or with its reason written, or gone) must leave."""
    paid = sorted(KNOWN_DEBTS - set(_too_long(PACKAGE)))
    assert paid == [], f"within {LIMIT} lines (or explained) now, remove from KNOWN_DEBTS: {paid}"


def test_the_check_tells_a_reason_from_none(tmp_path: Path) -> None:
    """The check itself: too long without a reason is found; with one, or short, it is not."""
    body = "x = 1\n" * LIMIT
    (tmp_path / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (LIMIT - 1))
    (tmp_path / "silent.py").write_text('"""Long, and says nothing."""\n' + body)
    (tmp_path / "mention.py").write_text('"""Over 800 lines\n\nand no reason."""\n' + body)
    (tmp_path / "why.py").write_text('"""Long.\n\nOver 800 lines because one argument."""\n' + body)
    (tmp_path / "later.py").write_text(
        '"""Long.\n\n(Over 800 lines, for now: a session.)"""\n' + body
    )
    # a reason in a comment or string further down is no reason at the top
    (tmp_path / "below.py").write_text('"""Long."""\n# Over 800 lines because hidden\n' + body)
    assert _too_long(tmp_path) == {
        "below.py": LIMIT + 2,
        "mention.py": LIMIT + 3,
        "silent.py": LIMIT + 1,
    }
