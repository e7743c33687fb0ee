"""A ``--store`` binds a state directory only once it has been opened (issue #36)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.cli.conftest import eg


def _free_port() -> int:
    """A local TCP port nothing listens on (bound and released by this test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _on_port(url: str, port: int) -> str:
    host, sep, rest = url.partition("127.0.0.1:")
    assert sep, url
    return f"{host}127.0.0.1:{port}{rest[rest.index('/') :]}"


def test_a_mistyped_store_port_binds_nothing_and_the_right_one_then_works(
    tmp_path: Path, postgres_url: str
) -> None:
    """Wrong port first (exit 2), then the right one: the run uses the right database."""
    state = tmp_path / "state"
    wrong = _on_port(postgres_url, _free_port())
    failed = eg("demo", "--state-dir", str(state), "--store", wrong, "--approve", "all",
                "--thread", "t1", "--json", timeout=120)  # fmt: skip
    assert failed.code == 2, failed.stderr[-2000:]
    marker = state / "effectgate.json"
    assert not marker.exists() or "store" not in json.loads(marker.read_text())
    ran = eg("demo", "--state-dir", str(state), "--store", postgres_url, "--approve", "all",
             "--thread", "t1", "--json", timeout=120)  # fmt: skip
    assert ran.code == 0, ran.stderr[-2000:]
    recorded = json.loads(marker.read_text())["store"]
    assert recorded.rsplit("@", maxsplit=1)[-1] == postgres_url.rsplit("@", maxsplit=1)[-1]
    listed = eg("threads", "--state-dir", str(state), "--json")
    assert [t["thread_id"] for t in listed.json["threads"]] == ["t1"], listed.stderr


def test_a_bound_directory_given_another_store_says_what_is_bound_and_how_to_change(
    tmp_path: Path, postgres_url: str
) -> None:
    """The refusal names the bound store and both ways out (omit --store, a new --state-dir)."""
    state = tmp_path / "state"
    first = eg("demo", "--state-dir", str(state), "--store", postgres_url,
               "--thread", "t1", "--json", timeout=120)  # fmt: skip
    assert first.code == 4, first.stderr[-2000:]
    other = postgres_url.replace("search_path%3D", "search_path%3Dother_")
    refused = eg("resume", "--state-dir", str(state), "--store", other, "--thread", "t1")
    assert refused.code == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "search_path%3Dt_" in line and "search_path%3Dother_t_" in line
    assert "without --store" in line and "new --state-dir" in line
