"""Every named seam has a crash test that kills a real process there."""

from __future__ import annotations

from pathlib import Path

from effectgate.testing import Failpoint


def test_every_failpoint_has_a_crash_test() -> None:
    """Each Failpoint member is named in a crash test module other than this one.

    The crash tests are in tests/crash, and in tests/postgres for the seams
    only a PostgreSQL store passes (``MID_MIGRATION``).
    """
    here = Path(__file__)
    modules = [*here.parent.glob("test_*.py"), *here.parents[1].glob("postgres/test_*.py")]
    text = "\n".join(p.read_text() for p in modules if p != here)
    missing = [fp.name for fp in Failpoint if f"Failpoint.{fp.name}" not in text]
    assert missing == []


def test_every_failpoint_is_called_exactly_once_in_src() -> None:
    """Each seam is reached from exactly one place in the source (DBOS-style named triggers)."""
    src = Path(__file__).resolve().parents[2] / "src" / "effectgate"
    text = "\n".join(p.read_text() for p in src.rglob("*.py") if p.name != "_failpoints.py")
    counts = {fp.name: text.count(f"Failpoint.{fp.name}") for fp in Failpoint}
    assert counts == {fp.name: 1 for fp in Failpoint}
