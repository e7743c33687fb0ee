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
