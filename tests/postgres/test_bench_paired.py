"""``bench_postgres.py --paired``: both PostgreSQL systems timed pair by pair."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from effectgate.testing.postgres import DEFAULT_DSN, ENV_DSN

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_paired_bench_times_every_pair(postgres_database: str, tmp_path: Path) -> None:
    env = {
        "EFFECTGATE_BENCH_QUICK": "1",
        "EFFECTGATE_BENCH_WORK": str(tmp_path / "work"),
        "EFFECTGATE_BENCH_RESULTS": str(tmp_path / "results"),
        ENV_DSN: os.environ.get(ENV_DSN) or DEFAULT_DSN,
        "PATH": "/usr/bin:/bin",
    }
    cmd = [sys.executable, str(BENCH / "bench_postgres.py"), "--paired", "--calls", "3"]
    subprocess.run(cmd, env=env, check=True, timeout=300)
    doc = json.loads((tmp_path / "results" / "postgres_paired.json").read_text())
    assert doc["params"] == {"pairs": 3}
    for name in ("langgraph_pg", "effectgate_pg"):
        for key in ("wall_ms", "cpu_ms"):
            assert doc["results"][name][key]["n"] == 3
            assert doc["results"][name][key]["median"] > 0
    assert doc["results"]["ratio_effectgate_over_langgraph"]["cpu"]["n"] == 3
