"""CLI follow-ups: model paths kept absolute, unknown ids refused, failures visible, docs."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from effectgate.ledger import SqliteLedger
from effectgate.models import load_script
from tests.cli.conftest import Ran, eg, write_script

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _metadata(state: Path, thread_id: str) -> dict[str, object]:
    ledger = SqliteLedger(state / "ledger.sqlite3")
    try:
        record = ledger.get_thread(thread_id)
        assert record is not None
        return dict(record.metadata)
    finally:
        ledger.close()


def test_relative_script_path_is_stored_absolute_and_resume_model_overrides(
    tmp_path: Path,
) -> None:
    """``scripted:rel.json`` is stored absolute, so ``resume`` works from elsewhere.

    Once the script is moved, ``resume`` says so (exit 2), and ``--model`` names
    the new place for this resume without rewriting the stored record.
    """
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    script = write_script(
        project / "scripts" / "one.json",
        [{"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}],
    )
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = eg("run", "w", "--model", "scripted:scripts/one.json", *sd, "--thread", "m", cwd=project)
    assert ran.code == 4, ran.stderr
    assert _metadata(state, "m")["model"] == f"scripted:{script}"

    waiting = eg("resume", *sd, "--thread", "m", cwd=elsewhere)
    assert waiting.code == 4, waiting.stderr

    moved = script.rename(tmp_path / "moved.json")
    lost = eg("resume", *sd, "--thread", "m", "--approve", "all", cwd=elsewhere)
    assert lost.code == 2
    assert "script file not found" in lost.stderr and "--model" in lost.stderr
    done = eg(
        "resume", *sd, "--thread", "m", "--model", f"scripted:{moved}", "--approve", "all",
        "--json", cwd=elsewhere,
    )  # fmt: skip
    assert done.code == 0, done.stderr
    assert done.json["final_message"] == "Done."
    assert (state / "workspace" / "a.txt").read_bytes() == b"alpha\n"
    assert _metadata(state, "m")["model"] == f"scripted:{script}"


def test_unknown_operation_or_thread_ids_exit_2_everywhere(
    finished_demo: tuple[Path, Ran],
) -> None:
    """``ledger events --op nope`` exits 2 like ``ledger show nope``; so do unknown threads."""
    state, _ = finished_demo
    sd = ["--state-dir", str(state)]
    for args, needle in (
        (["ledger", "events", "--op", "nope"], "unknown operation 'nope'"),
        (["ledger", "events", "--thread", "nope"], "unknown thread 'nope'"),
        (["ledger", "list", "--thread", "nope"], "unknown thread 'nope'"),
        (["ledger", "list", "--tool", "nope"], "unknown tool 'nope'"),
    ):
        ran = eg(*args, *sd)
        assert ran.code == 2, (args, ran.stderr)
        assert needle in ran.stderr
    tools = eg("ledger", "list", "--tool", "nope", *sd).stderr
    assert "create_ticket, send_email, write_file" in " ".join(tools.split())
    known = eg("ledger", "events", "--op", "ticket:orders-error-rate", *sd, "--json")
    assert known.code == 0 and len(known.json["events"]) == 4


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_thread_ids_are_refused(tmp_path: Path, blank: str) -> None:
    """``--thread ""`` never silently becomes a random id: exit 2, nothing created."""
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    for args in (
        ["demo", "--approve", "all"],
        ["run", "task", "--model", "scripted:incident"],
        ["resume"],
        ["pending"],
        ["ledger", "list"],
    ):
        ran = eg(*args, "--thread", blank, *sd)
        assert ran.code == 2, (args, ran.stderr)
        assert "thread id" in ran.stderr and "empty" in ran.stderr
    assert not state.exists()


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)


def test_docs_show_the_packaged_script_and_every_script_key() -> None:
    """docs/cli.md embeds incident.yaml verbatim and names every key the loader accepts."""
    docs = DOCS.read_text(encoding="utf-8")
    packaged = (resources.files("effectgate.demo") / "incident.yaml").read_text(encoding="utf-8")
    assert packaged in _yaml_blocks(docs)
    assert load_script("incident")["name"] == "incident"
    for key in ("name", "final", "turns", "say", "tool_calls", "args", "id", "when", "path"):
        assert f"`{key}`" in docs, key
    for key in ("op", "value", "otherwise", "{{ result.<tool>.<field> }}"):
        assert f"`{key}`" in docs, key
