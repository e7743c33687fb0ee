"""Notebook 06 runs end to end as a script (its cells assert the ticket counts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "07_bring_your_own_graph.py"


@pytest.mark.slow
@pytest.mark.crash
def test_notebook_06_runs(tmp_path: Path) -> None:
    """HITL duplicates the ticket after the kill; both effectgate variants keep one."""
    proc = subprocess.run(
        [sys.executable, str(NOTEBOOK)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "after the resume: [(1, 'orders: error rate above 5%'), (2," in proc.stdout
    assert proc.stdout.rstrip().endswith("ticket:orders-error-rate")
