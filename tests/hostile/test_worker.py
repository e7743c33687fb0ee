"""Hostile input on ``effectgate worker`` and its neighbours, in-process (``CliRunner``).

Each case asserts the documented exit code, one error line naming what was
wrong, no traceback, nothing written outside the state directory, and the
planted secret in neither SQLite file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate._app import StateDir
from tests.hostile.conftest import World, assert_clean_error

BAD_INPUT = 2

ENDPOINTS: list[tuple[str, Callable[[Path], None]]] = [
    ("not-json", lambda p: p.write_text("{not json")),
    ("not-utf8", lambda p: p.write_bytes(b"\xff\xfe{}")),
    ("a-list", lambda p: p.write_text("[1, 2]")),
    ("missing-field", lambda p: p.write_text('{"ticket_url": "http://127.0.0.1:1"}')),
    (
        "wrong-type",
        lambda p: p.write_text(
            '{"ticket_url": 1, "smtp_host": "h", "smtp_port": "25", "mail_url": "u"}'
        ),
    ),
    ("a-directory", lambda p: p.mkdir()),
    ("a-fifo", lambda p: __import__("os").mkfifo(p)),
]


@pytest.mark.parametrize(("name", "damage"), ENDPOINTS, ids=[n for n, _ in ENDPOINTS])
def test_damaged_service_endpoints_stop_the_worker_in_one_line(
    world: World, name: str, damage: Callable[[Path], None]
) -> None:
    """A damaged ``services/endpoints.json``: one line naming it, exit 2, nothing run."""
    sd = StateDir.open(world.state)
    sd.services.mkdir(parents=True, exist_ok=True)
    damage(sd.services / "endpoints.json")
    ran = world.run("worker", "--until-idle")
    assert_clean_error(ran, BAD_INPUT, "endpoints.json")
    world.assert_outside_untouched()
    world.assert_no_secret_stored()
