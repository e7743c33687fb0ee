"""A failpoint setting that could never fire is refused before anything runs."""

from __future__ import annotations

import pytest

from effectgate._failpoints import check
from effectgate.errors import ConfigError

TOOLS = ["create_ticket", "send_email", "write_file"]


@pytest.mark.parametrize(
    "spec",
    [
        "AFTER_IN_FLIGHT_COMMIT",
        "after_in_flight_commit",
        "AFTER_EXTERNAL_COMMIT@send_email",
        "AFTER_LEDGER_RESULT@write_file#2",
        "AFTER_REVIEW_RECORDED#3",
        "MID_SUPERSTEP",
        "MID_MIGRATION#1",
    ],
)
def test_valid_settings_pass(spec: str) -> None:
    """Known seams, known effect tools and positive counts are accepted."""
    check(TOOLS, spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("NOPE", "unknown seam"),
        ("AFTER_EXTERNAL_COMMIT@nosuchtool", "no side-effecting tool"),
        ("AFTER_EXTERNAL_COMMIT@get_error_rate", "no side-effecting tool"),
        ("AFTER_REVIEW_RECORDED@create_ticket", "not reached per tool"),
        ("AFTER_IN_FLIGHT_COMMIT#0", "counts from 1"),
        ("AFTER_IN_FLIGHT_COMMIT#x", "integer"),
    ],
)
def test_settings_that_never_fire_are_refused(spec: str, match: str) -> None:
    """A typo would make a crash test that never crashes: ConfigError instead."""
    with pytest.raises(ConfigError, match=match):
        check(TOOLS, spec)


def test_environment_is_read_when_no_spec_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit spec the environment variable is checked; unset passes."""
    check(TOOLS)
    monkeypatch.setenv("EFFECTGATE_FAILPOINT", "NOPE")
    with pytest.raises(ConfigError):
        check(TOOLS)


def test_an_unknown_action_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``EFFECTGATE_FAILPOINT_ACTION`` is ``exit`` or ``stop``; a typo is refused up front."""
    monkeypatch.setenv("EFFECTGATE_FAILPOINT_ACTION", "pause")
    with pytest.raises(ConfigError, match="EFFECTGATE_FAILPOINT_ACTION"):
        check(TOOLS, "MID_SUPERSTEP")


_STOPS = """
from effectgate.testing import Failpoint
from effectgate._failpoints import hit
hit(Failpoint.AFTER_IN_FLIGHT_COMMIT, tool="send_email")
print("went on")
"""


def test_the_stop_action_stops_the_process_at_the_seam_until_sigcont() -> None:
    """With ``stop`` a real process stops itself at the seam and goes on past it once continued."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {
        **os.environ,
        "EFFECTGATE_FAILPOINT": "AFTER_IN_FLIGHT_COMMIT@send_email",
        "EFFECTGATE_FAILPOINT_ACTION": "stop",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _STOPS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        deadline = time.monotonic() + 60
        state = ""
        while state != "T" and proc.poll() is None and time.monotonic() < deadline:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0]
            time.sleep(0.01)
        assert state == "T", proc.poll()  # stopped at the seam, not exited
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.decode().strip() == "went on"
    assert b"stopping (SIGSTOP)" in err
