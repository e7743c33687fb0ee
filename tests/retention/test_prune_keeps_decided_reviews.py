"""Compaction never takes the operations of a thread that has not finished.

A reviewer rejects the ticket; the process dies right after the reject is
recorded (``AFTER_REVIEW_RECORDED``), so the thread's checkpoint still holds
the review. Compacting that REJECTED operation used to reopen the review
(nothing recorded any more), and ``--approve all`` then created the ticket a
person had refused. The thread's operations now wait until it finishes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import eg, world


def test_a_recorded_reject_survives_prune_after_a_crash(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    waiting = eg("demo", *sd, "--thread", "w", "--json")
    assert waiting.code == 4, waiting.stderr
    [review] = waiting.json["interrupts"]
    n = len(review["value"]["action_requests"])
    reject = tmp_path / "reject.json"
    no = [{"type": "reject", "message": "not this one"}] * n
    reject.write_text(json.dumps({"interrupt_id": review["id"], "decisions": no}))
    died = eg("resume", *sd, "--thread", "w", "--decisions", str(reject),
              "--crash-at", "AFTER_REVIEW_RECORDED")  # fmt: skip
    assert died.code == 137, died.stdout + died.stderr
    pruned = eg("prune", *sd, "--operations-after", "0s", "--tombstones-after", "none", "--json")
    assert pruned.code == 0, pruned.stdout + pruned.stderr
    assert pruned.json["operations_compacted"] == 0, pruned.json
    listed = eg("ledger", "list", *sd, "--json").json
    [ticket] = [o for o in listed["operations"] if o["tool"] == "create_ticket"]
    assert ticket["state"] == "REJECTED"
    blanket = eg("resume", *sd, "--thread", "w", "--approve", "all")
    assert blanket.code in (0, 4), blanket.stdout + blanket.stderr
    assert world(state)["tickets"] == []  # the reject stands: no ticket, ever
