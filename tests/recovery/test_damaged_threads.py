"""A damaged thread record or checkpoint hides that one thread; the others are listed and run.

Before, one record whose ``input_json`` was not JSON, or one checkpoint whose
bytes were cut, made ``threads``, ``pending`` and every worker stop with
exit 1 for every thread; a damaged PostgreSQL checkpoint gave a traceback
(``ValueError: invalid type Reserved``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectgate import StateDir, open_agent, submit
from tests._damage import damage_checkpoint, damage_thread_record
from tests.cli.conftest import cli_env, eg

TASK = "Check the order service's error rate and handle any incident."


def _worker(sd: StateDir) -> tuple[int, list[dict[str, object]], str]:
    cmd = [sys.executable, "-m", "effectgate.cli", "worker", "--state-dir", str(sd.root)]
    proc = subprocess.run(
        [*cmd, "--json", "--until-idle", "--lease-ttl", "5"],
        capture_output=True,
        text=True,
        timeout=180,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def _damaged_state(sd: StateDir, ledger: str, checkpoints: str) -> None:
    """``ckpt`` has a damaged checkpoint, ``rec`` a damaged record, ``good`` is new and sound."""
    with open_agent(sd) as agent:
        submit(agent, TASK, thread_id="ckpt")
    code, lines, err = _worker(sd)
    assert code == 0, err[-2000:]
    assert {"thread_id": "ckpt", "was": "new", "status": "done"} in lines
    with open_agent(sd) as agent:
        submit(agent, TASK, thread_id="rec")
        submit(agent, TASK, thread_id="good")
    damage_thread_record(ledger, "rec")
    damage_checkpoint(checkpoints, "ckpt")


def _check(sd: StateDir, record_table: str, checkpoint_tables: str) -> None:
    sdir = ["--state-dir", str(sd.root)]
    listed = eg("threads", *sdir, "--json")
    assert listed.code == 1, listed.stderr
    assert "threads" in listed.json, listed.stdout
    by_id = {t["thread_id"]: t for t in listed.json["threads"]}
    assert set(by_id) == {"ckpt", "rec", "good"}
    assert by_id["good"]["status"] == "not_started"
    assert by_id["rec"]["status"] == "unreadable"
    assert f"table {record_table}" in by_id["rec"]["why"] and "input_json" in by_id["rec"]["why"]
    assert by_id["ckpt"]["status"] == "unreadable"
    assert checkpoint_tables in by_id["ckpt"]["why"] and "'ckpt'" in by_id["ckpt"]["why"]

    text = eg("threads", *sdir)
    assert text.code == 1 and "good" in text.stdout
    assert "unreadable thread rec" in text.stdout.replace("\n", " ")

    pending = eg("pending", *sdir, "--json")
    assert pending.code == 1, pending.stderr
    assert set(pending.json["unreadable_threads"]) == {"ckpt", "rec"}
    one = eg("pending", *sdir, "--thread", "rec", "--json")
    assert one.code == 1 and set(one.json["unreadable_threads"]) == {"rec"}, one.stderr

    for thread in ("ckpt", "rec"):
        resumed = eg("resume", *sdir, "--thread", thread)
        assert resumed.code == 1
        (line,) = [x for x in resumed.stderr.splitlines() if x.strip()]
        assert f"'{thread}'" in line

    code, lines, err = _worker(sd)
    assert code == 0, err[-2000:]
    assert {"thread_id": "good", "was": "new", "status": "done"} in lines
    skipped = [str(line["thread_id"]) for line in lines if "skipped" in line]
    assert sorted(skipped) == ["ckpt", "rec"]  # each said once
    with open_agent(sd) as agent:
        assert agent.status("good").status.value == "done"
    for out in (listed, text, pending, one):
        assert "Traceback" not in out.stderr + out.stdout
    assert "Traceback" not in err


def test_sqlite_damaged_thread_record_and_checkpoint_are_isolated(tmp_path: Path) -> None:
    sd = StateDir.open(tmp_path / "state")
    _damaged_state(sd, str(sd.ledger), str(sd.checkpoints))
    _check(sd, "threads", "checkpoint file")


@pytest.mark.slow
def test_postgres_damaged_thread_record_and_checkpoint_are_isolated(
    tmp_path: Path, postgres_url: str
) -> None:
    sd = StateDir.open(tmp_path / "state", store=postgres_url)
    _damaged_state(sd, postgres_url, postgres_url)
    _check(sd, "ledger_threads", "checkpoint_blobs")
