"""``--store`` without the postgres extra: one line, exit 2 (bad input), nothing marked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# The CLI as installed, but with psycopg unimportable (as without the extra).
_NO_PSYCOPG = (
    "import runpy, sys; sys.modules['psycopg'] = None; "
    "sys.argv = ['effectgate', *sys.argv[1:]]; "
    "runpy.run_module('effectgate.cli', run_name='__main__')"
)


def test_a_store_without_the_postgres_extra_is_refused_in_one_line(tmp_path: Path) -> None:
    """It printed a traceback and left a SQLite marker, so the next command ran on SQLite."""
    state = tmp_path / "state"
    argv = ["demo", "--approve", "all", "--state-dir", str(state)]
    url = "postgresql://127.0.0.1:5432/nowhere"
    done = subprocess.run(
        [sys.executable, "-c", _NO_PSYCOPG, *argv, "--store", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'effectgate[postgres]'" in lines[0], done.stderr
    assert not (state / "effectgate.json").exists()
