"""Shared fixtures: a state directory, the demo services, and a worker-process runner."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from effectgate import StateDir
from effectgate.demo.services import DemoServices
from tests._fork import python_m

pytest_plugins = ("effectgate.testing.postgres",)  # postgres_database, postgres_url

settings.register_profile("ci", deadline=None, max_examples=60, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _no_failpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test inherits a failpoint from the environment."""
    monkeypatch.delenv("EFFECTGATE_FAILPOINT", raising=False)


@pytest.fixture
def state_dir(tmp_path: Path) -> StateDir:
    return StateDir.open(tmp_path / "state")


@pytest.fixture
def services(state_dir: StateDir) -> Iterator[DemoServices]:
    """The demo ticket service and mail sink, with the orders error rate above threshold."""
    with DemoServices(state_dir.services) as svc:
        svc.set_error_rate("orders", 0.12)
        yield svc


@dataclass
class WorkerRun:
    returncode: int
    summary: dict[str, Any]
    stderr: str


def run_worker(
    state_dir: StateDir,
    thread: str,
    *,
    failpoint: str | None = None,
    model: str = "scripted:incident",
    approve: str = "all",
    timeout: float = 60.0,
    store: str | None = None,
    api: str = "sync",
) -> WorkerRun:
    """Run ``effectgate.testing.worker`` in a new process and wait (``store``: its --store)."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if failpoint:
        env["EFFECTGATE_FAILPOINT"] = failpoint
    proc = python_m(
        "effectgate.testing.worker",
        [
            "--state-dir",
            str(state_dir.root),
            "--thread",
            thread,
            "--model",
            model,
            "--approve",
            approve,
            *(["--store", store] if store else []),
            "--api",
            api,
        ],
        env=env,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    return WorkerRun(proc.returncode, summary, proc.stderr)


def worker_cmd(state_dir: StateDir, thread: str, *extra: str) -> list[str]:
    """The command line of a worker process, for tests that manage the process themselves."""
    return [
        sys.executable,
        "-m",
        "effectgate.testing.worker",
        "--state-dir",
        str(state_dir.root),
        "--thread",
        thread,
        *extra,
    ]
