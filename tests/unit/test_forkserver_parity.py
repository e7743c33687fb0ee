"""A child of the test fork server sees what a fresh ``python -m`` would.

Compared side by side with a real fresh interpreter: the child's time zone
from its own ``TZ`` (read once per process, so the fork must re-read it),
its working directory first on ``sys.path`` (so a module there imports, as
``--agent mymodule:build`` needs), its argv and environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate.testing.forkserver import ForkServer

PROBE = """
import json, os, sys, time
import beside_the_probe
print(json.dumps({
    "tzname": list(time.tzname),
    "timezone": time.timezone,
    "path0": sys.path[0],
    "argv": sys.argv[1:],
    "marker": os.environ.get("PARITY_MARKER"),
    "beside": beside_the_probe.VALUE,
}))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    fork = ForkServer(preload=("json",))
    yield fork
    fork.close()


@pytest.mark.parametrize("tz", ["Pacific/Chatham", "America/St_Johns", "UTC"])
def test_forked_child_matches_a_fresh_interpreter(
    server: ForkServer, tmp_path: Path, tz: str
) -> None:
    (tmp_path / "parity_probe.py").write_text(PROBE)
    (tmp_path / "beside_the_probe.py").write_text("VALUE = 'imported from the cwd'\n")
    env = {**os.environ, "TZ": tz, "PARITY_MARKER": tz}
    argv = ["--flag", "x y"]
    fresh = subprocess.run(
        [sys.executable, "-m", "parity_probe", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    forked = server.run("parity_probe", argv, env, timeout=60, cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)["beside"] == "imported from the cwd"
