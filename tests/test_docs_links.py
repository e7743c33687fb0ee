"""The repository stands alone: every relative link resolves inside it, nothing cites outside notes.

A reader of a fresh clone has README.md, docs/, the notebooks and the code,
nothing else. So every relative Markdown link in README.md and docs/*.md
must name a file of the repository (and, with ``#anchor``, a heading of that
file), and no text a reader sees may cite documents they cannot open.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKED_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
READ_BY_PEOPLE = [
    *LINKED_DOCS,
    *sorted((ROOT / "notebooks").glob("*.md")),
    *sorted((ROOT / "notebooks").glob("*.py")),
    *sorted((ROOT / "notebooks").glob("*.ipynb")),
    *sorted((ROOT / "src" / "effectgate").rglob("*.py")),
]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
"""An inline Markdown link; group 1 is the target."""

OUTSIDE = re.compile(
    r"\.\./shared|(?i:\bseeds?\b \d{3})|\bDESIGN(\.md\b|\s*§)|\bSTYLE(\.md\b|\s*§| anti-pattern)"
    r"|langgraph-semantics|(?i:\bissue \d+)"
)
"""Citations of documents that are not in the repository (design notes, issue threads)."""


def _slug(heading: str) -> str:
    """The anchor a code host gives a Markdown heading (GitHub's rule)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # a '#' in a code block is no heading
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.MULTILINE)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert broken == [], f"{doc.relative_to(ROOT)}: {broken}"


def test_no_file_cites_documents_outside_the_repository() -> None:
    found = []
    for path in READ_BY_PEOPLE:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == [], "\n".join(found)


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The patterns and the anchor rule, on text that must be caught and text that must not."""
    assert OUTSIDE.search("see ../shared/DESIGN.md") and OUTSIDE.search("(seed 001 §4.8)")
    assert OUTSIDE.search("as issue 8 measured") and OUTSIDE.search("langgraph-semantics §1")
    assert OUTSIDE.search("DESIGN §3") and OUTSIDE.search("STYLE §1")
    assert OUTSIDE.search("Seed 001's")
    assert not OUTSIDE.search("STATE_STYLES and RFC 9110 §10.2.3 and the design")
    assert _slug("How it works: `effect.<tool>`") == "how-it-works-effecttool"
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md)\n```\n# not a heading\n```\n")
    assert _anchors(page) == {"title"} and _links(page) == ["#title", "missing.md"]


def test_readme_points_to_the_design_and_the_tool_guide() -> None:
    links = _links(ROOT / "README.md")
    assert "docs/architecture.md" in links and "docs/custom-tools.md" in links
