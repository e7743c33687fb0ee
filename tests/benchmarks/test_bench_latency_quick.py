"""``bench_latency.py --quick``: both systems run every approved effect exactly once.

Nothing timed is asserted: the effects are counted in their own storage (the
per-worker effect files the tool appends to), not in the benchmark's report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effectgate.testing.postgres import ENV_DSN

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.slow  # about 20-30 s: eight short rounds, two worker processes

# The quick grid: a 1 x 1 round (the step time), then 1 x 2 and 2 x 2 (workers x threads),
# 2 threads per slot; each worker also runs one warm-up thread per round.
QUICK_ROUNDS = [(1, 1), (1, 2), (2, 2)]
PER_SLOT = 2


def test_quick_latency_bench_runs_each_approved_effect_once(
    postgres_database: str, tmp_path: Path
) -> None:
    env = {
        "EFFECTGATE_BENCH_WORK": str(tmp_path / "work"),
        "EFFECTGATE_BENCH_RESULTS": str(tmp_path / "results"),
        "PATH": "/usr/bin:/bin",
        **({ENV_DSN: os.environ[ENV_DSN]} if ENV_DSN in os.environ else {}),
    }
    cmd = [sys.executable, str(BENCH / "bench_latency.py"), "--quick", "--keep"]
    subprocess.run([*cmd, "--dsn", postgres_database], env=env, check=True, timeout=300)
    doc = json.loads((tmp_path / "results" / "latency.json").read_text())
    effects_dir = Path(doc["results"]["effects_dir"])
    expected = sum(n * (k * PER_SLOT + 1) for n, k in QUICK_ROUNDS)  # 18
    for system in ("effectgate", "langgraph"):
        lines = [
            line.split(" ")[0]
            for path in effects_dir.glob(f"{system}.w*.log")
            for line in path.read_text().splitlines()
        ]
        assert len(lines) == expected, system
        assert len(set(lines)) == expected, f"{system} ran an effect twice"
