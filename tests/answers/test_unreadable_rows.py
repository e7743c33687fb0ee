"""Stored rows of an unexpected shape never break a command: "unreadable (...)", no traceback.

Verdicts, receipts and decisions written by an older version or by hand are
put straight into the ledger file, then every reading command runs.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from effectgate import StateDir, open_agent
from effectgate.graph import RunStatus
from tests.answers import _parking_agent
from tests.cli.conftest import eg

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.answers._parking_agent:build"
BAD_DETAILS = [
    {"verdict": "succeeded", "reference": 123},
    {"ticket_id": 1},
    [1, 2],
    "x" * 200_000,
    {"verdict": ["succeeded"], "reviewer": {"name": 1}, "evidence": 5},
]


def _damage(ledger: Path, op_id: str) -> None:
    db = sqlite3.connect(ledger)
    with db:
        for detail in BAD_DETAILS:
            db.execute(
                "INSERT INTO events (operation_id, kind, src, dst, attempt, at_ms, detail_json) "
                "VALUES (?, 'transition', 'NEEDS_RECONCILIATION', 'SUCCEEDED', 1, "
                "1764560000000, ?)",
                (op_id, json.dumps(detail)),
            )
        (text,) = db.execute(
            "SELECT receipt_json FROM operations WHERE operation_id = ?", (op_id,)
        ).fetchone()
        receipt = {**json.loads(text), "reference": 123, "result": {"ticket_id": "y" * 100_000}}
        db.execute(
            "UPDATE operations SET receipt_json = ? WHERE operation_id = ?",
            (json.dumps(receipt), op_id),
        )
        db.execute(
            "INSERT INTO approvals (operation_id, thread_id, tool_call_id, decision, intent_hash, "
            "reviewer, edited_args_json, message, decided_at_ms) SELECT operation_id, thread_id, "
            "tool_call_id, 'approve', intent_hash, 'hand', '[1, 2]', ?, 1764560000001 "
            "FROM operations WHERE operation_id = ?",
            ("m" * 100_000, op_id),
        )
    db.close()


@pytest.mark.slow
def test_bad_verdicts_receipts_and_decisions_are_shown_unreadable(
    state_dir: StateDir, tmp_path: Path
) -> None:
    sd = ["--state-dir", str(state_dir.root)]
    parked = eg("run", "ring", "--thread", "t", "--agent", AGENT, "--approve", "all", *sd,
                cwd=ROOT)  # fmt: skip
    assert parked.code == 3, parked.stderr
    (line,) = (state_dir.workspace / "rings.txt").read_text().splitlines()
    op_id = line.rsplit(":", 1)[0]
    verdict = tmp_path / "v.json"
    verdict.write_text(
        json.dumps({"verdicts": {op_id: {"verdict": "succeeded", "reference": "B"}}})
    )
    assert eg("resume", "--thread", "t", "--decisions", str(verdict), *sd, cwd=ROOT).code == 0
    waiting = eg("run", "ring", "--thread", "u", "--agent", AGENT, *sd, cwd=ROOT)
    assert waiting.code == 4, waiting.stderr
    _damage(state_dir.ledger, op_id)

    commands = {
        ("ledger", "list"): 0,
        ("ledger", "show", op_id): 0,
        ("pending",): 0,
        ("threads",): 0,
        ("resume", "--thread", "t"): 0,
    }
    for command, code in commands.items():
        for extra in ((), ("--json",)):
            ran = eg(*command, *extra, *sd, cwd=ROOT)
            assert ran.code == code, (command, extra, ran.stdout[-500:], ran.stderr[-500:])
            assert "Traceback" not in ran.stderr + ran.stdout, (command, ran.stderr[-2000:])
            if command[:2] == ("ledger", "show") and not extra:
                assert "unreadable (int: 123)" in ran.stdout  # the receipt's reference
                assert "unreadable (expected a JSON object, got list" in ran.stdout
                assert len(ran.stdout) < 60_000  # the huge strings are cut
            if command[:2] == ("ledger", "list") and not extra:
                assert "unreadable (int: 123)" in ran.stdout
    recipe = _parking_agent.build(state_dir)
    with open_agent(state_dir, model=recipe.model or "", tools=recipe.tools) as agent:
        assert agent.status("t").status is RunStatus.DONE
        assert agent.status("u").status is RunStatus.WAITING_REVIEW
