"""A tiny run of ``benchmarks/bench_prune.py`` (50 copied threads): it prunes them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_prune_bench_deletes_every_finished_thread_and_keeps_the_waiting_one(
    tmp_path: Path,
) -> None:
    env = {
        "EFFECTGATE_BENCH_QUICK": "1",
        "EFFECTGATE_BENCH_WORK": str(tmp_path / "work"),
        "EFFECTGATE_BENCH_RESULTS": str(tmp_path / "results"),
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(
        [sys.executable, str(BENCH / "bench_prune.py")], env=env, check=True, timeout=120
    )
    res = json.loads((tmp_path / "results" / "prune.json").read_text())["results"]
    assert res["threads_deleted"] == 51  # 50 copies and the template
    assert res["threads_kept"] == {"kept": "it waits (waiting_review)"}
    assert res["kept_thread"]["ok"] is True
    files = res["files_mib"]["checkpoints"]
    assert files["after"] < files["before"]
