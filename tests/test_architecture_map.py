"""docs/architecture.md's map names every module of ``src/effectgate`` once, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "effectgate"


def _map_section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.index("## The map (one line per module)")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_map_names_every_module_once() -> None:
    """A module added, moved or removed without its line in the map fails here."""
    named = re.findall(r"^- `([\w/]+\.py)`:", _map_section(), flags=re.MULTILINE)
    modules = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))
    assert sorted(set(named)) == sorted(named), "a module is named twice"
    assert sorted(set(modules) - set(named)) == [], "modules missing from the map"
    assert sorted(set(named) - set(modules)) == [], "the map names modules that do not exist"
