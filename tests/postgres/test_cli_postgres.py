"""``effectgate demo --store postgresql://...``: the state directory remembers its store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectgate.ledger import OpState, PostgresLedger
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_demo_on_postgres_then_every_command_follows_the_marker(
    tmp_path: Path, postgres_url: str
) -> None:
    """One --store on the first run; threads and ledger list read PostgreSQL without it."""
    state = tmp_path / "state"
    ran = eg("demo", "--state-dir", str(state), "--store", postgres_url, "--approve", "all",
             "--thread", "t1", "--json", timeout=120)  # fmt: skip
    assert ran.code == 0, ran.stderr[-2000:]
    assert not (state / "ledger.sqlite3").exists()
    assert not (state / "checkpoints.sqlite3").exists()
    marker = json.loads((state / "effectgate.json").read_text())
    assert marker["format"] == 2 and "search_path" in marker["store"]
    with PostgresLedger(postgres_url) as ledger:
        states = {op.tool: op.state for op in ledger.list(thread_id="t1")}
    assert set(states.values()) == {OpState.SUCCEEDED} and len(states) == 3
    listed = eg("ledger", "list", "--state-dir", str(state), "--json")
    assert listed.code == 0, listed.stderr
    assert {op["id"] for op in listed.json["operations"]} == set(_ids(postgres_url))
    threads = eg("threads", "--state-dir", str(state), "--json")
    assert threads.code == 0 and [t["thread_id"] for t in threads.json["threads"]] == ["t1"]


def test_a_state_directory_keeps_its_store(tmp_path: Path, postgres_url: str) -> None:
    """Another store, or a store for a directory that uses SQLite, is refused (exit 2)."""
    state = tmp_path / "pg"
    first = eg("demo", "--state-dir", str(state), "--store", postgres_url, "--approve", "none",
               "--thread", "t1", "--json", timeout=120)  # fmt: skip
    assert first.code == 0, first.stderr[-2000:]
    other = postgres_url.replace("search_path%3D", "search_path%3Dother_")
    refused = eg("demo", "--state-dir", str(state), "--store", other, "--approve", "all")
    assert refused.code == 2 and "keeps its ledger and checkpoints in" in refused.stderr
    assert "Traceback" not in refused.stderr

    sqlite_state = tmp_path / "sqlite"
    assert eg("demo", "--state-dir", str(sqlite_state), "--approve", "all", "--json",
              timeout=120).code == 0  # fmt: skip
    moved = eg("demo", "--state-dir", str(sqlite_state), "--store", postgres_url)
    assert moved.code == 2 and "keeps its ledger in SQLite" in moved.stderr
    bad = eg("demo", "--state-dir", str(tmp_path / "x"), "--store", "mysql://u:pw@h/db")
    assert bad.code == 2 and "expected a postgresql:// URL" in bad.stderr
    assert "pw" not in bad.stderr


def _ids(url: str) -> list[str]:
    with PostgresLedger(url) as ledger:
        return [op.operation_id for op in ledger.list()]


def test_a_thread_waiting_on_postgres_is_resumed_and_its_lease_broken_from_the_cli(
    tmp_path: Path, postgres_url: str
) -> None:
    """resume, lease break and the recovery report read PostgreSQL, not an empty SQLite file."""
    state = tmp_path / "state"
    waiting = eg("demo", "--state-dir", str(state), "--store", postgres_url, "--thread", "p1",
                 "--json", timeout=120)  # fmt: skip
    assert waiting.code == 4, waiting.stderr[-2000:]
    broken = eg("lease", "break", "--thread", "p1", "--reason", "test", "--state-dir", str(state))
    assert broken.code == 0 and "broke the lease of thread 'p1'" in broken.stdout, broken.stderr
    done = eg("resume", "--thread", "p1", "--approve", "all", "--state-dir", str(state),
              "--json", timeout=120)  # fmt: skip
    assert done.code == 0, done.stderr[-2000:]
    assert not (state / "ledger.sqlite3").exists()
    with PostgresLedger(postgres_url) as ledger:
        assert {op.state for op in ledger.list(thread_id="p1")} == {OpState.SUCCEEDED}


def test_run_with_an_agent_recipe_keeps_its_ledger_in_the_store(
    tmp_path: Path, postgres_url: str
) -> None:
    """`run --agent M:F --store URL` on a new directory records the store, as without --agent.

    Before, the recipe path opened the directory without the store: SQLite
    files were made, and every later --store on it was refused (a fresh user).
    """
    state = tmp_path / "state"
    agent = "tests.conversations._custom_agent:build"
    ran = eg("run", "Ring the bell for the release.", "--agent", agent, "--thread", "b",
             "--state-dir", str(state), "--store", postgres_url, "--approve", "all",
             cwd=ROOT)  # fmt: skip
    assert ran.code == 0, ran.stderr
    assert json.loads((state / "effectgate.json").read_text()).get("store")
    assert not (state / "ledger.sqlite3").exists() and not (state / "checkpoints.sqlite3").exists()
    with PostgresLedger(postgres_url) as ledger:
        assert [op.tool for op in ledger.list(thread_id="b")] == ["ring_bell"]


def test_another_machine_resumes_a_recipe_thread_by_its_ledger_record(
    tmp_path: Path, postgres_url: str
) -> None:
    """A second state directory on the same store resumes a `run --agent` thread without --agent.

    Its `agents.json` is empty (another machine); the recipe is in the
    thread's ledger record. Before, `resume` decided by `agents.json` alone
    and refused ("uses tool(s) ring_bell that the CLI does not have").
    """
    agent = "tests.conversations._custom_agent:build"
    first, second = tmp_path / "machine-a", tmp_path / "machine-b"
    waiting = eg("run", "Ring the bell for the release.", "--agent", agent, "--thread", "b",
                 "--state-dir", str(first), "--store", postgres_url, cwd=ROOT)  # fmt: skip
    assert waiting.code == 4, waiting.stderr
    done = eg("resume", "--thread", "b", "--approve", "all", "--state-dir", str(second),
              "--store", postgres_url, "--json", cwd=ROOT)  # fmt: skip
    assert done.code == 0, done.stderr
    listed = eg("threads", "--state-dir", str(second), "--json", cwd=ROOT)
    assert listed.code == 0, listed.stderr
    assert [(t["thread_id"], t["status"]) for t in listed.json["threads"]] == [("b", "done")]
    assert not (second / "agents.json").exists() or "b" in (second / "agents.json").read_text()
    with PostgresLedger(postgres_url) as ledger:
        assert [(op.tool, op.state) for op in ledger.list(thread_id="b")] == [
            ("ring_bell", OpState.SUCCEEDED)
        ]
