"""Ledger retention: terminal operations compact to tombstones; a replay onto one is reviewed."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

import pytest

from effectgate._app import StateDir
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.graph import RunStatus
from effectgate.ledger import OpState
from effectgate.retention import PrunePolicy
from tests.answers._bind import bound
from tests.retention.test_prune import APPROVE, _agent, _finish


def test_compaction_keeps_a_tombstone_with_intent_and_receipt_then_drops_it(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Compacted: the row, approvals and events go; the tombstone answers until its window ends."""
    sd = state_dir
    with _agent(sd, services, "c", calls=2) as agent:
        _finish(agent, "c", 2)
        ops = agent.ledger.list(thread_id="c")
        assert [op.state for op in ops] == [OpState.SUCCEEDED, OpState.SUCCEEDED]
        kept = agent.prune(PrunePolicy(operations_after=timedelta(days=30)))
        assert kept.operations_compacted == 0
        report = agent.prune(PrunePolicy(operations_after=timedelta(0), tombstones_after=None))
        assert report.operations_compacted == 2
        assert agent.ledger.list(thread_id="c") == []
        assert agent.ledger.events(thread_id="c") == []
        with agent.ledger.store.read() as r:
            tombs = [r.get_operation_tombstone(op.operation_id) for op in ops]
        for op, tomb in zip(ops, tombs, strict=True):
            assert tomb is not None
            assert (tomb.intent_hash, tomb.state, tomb.tool) == (
                op.intent_hash,
                OpState.SUCCEEDED,
                "create_ticket",
            )
            assert tomb.receipt == op.receipt
        dropped = agent.prune(PrunePolicy(operations_after=None, tombstones_after=timedelta(0)))
        assert dropped.operation_tombstones_removed == 2
        with agent.ledger.store.read() as r:
            assert r.get_operation_tombstone(ops[0].operation_id) is None


def test_operations_are_still_never_deleted_by_hand(
    services: DemoServices, state_dir: StateDir
) -> None:
    """The ledger's delete guards hold for a row without a tombstone."""
    sd = state_dir
    with _agent(sd, services, "g") as agent:
        _finish(agent, "g", 1)
    conn = sqlite3.connect(sd.ledger)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="only once compacted"):
            conn.execute("DELETE FROM operations")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("DELETE FROM events")
    finally:
        conn.close()


def test_a_replay_onto_a_compacted_operation_is_reviewed_not_executed(
    services: DemoServices, state_dir: StateDir
) -> None:
    """Time travel to before a call whose operation was compacted asks the reviewer again."""
    sd = state_dir
    with _agent(sd, services, "r", calls=1) as agent:
        _finish(agent, "r", 1)
        (op,) = agent.ledger.list(thread_id="r")
        cfg: Any = {"configurable": {"thread_id": "r"}}
        history = list(agent.graph.get_state_history(cfg))
        # the checkpoint where the review node is about to run for the call
        before_review = next(s for s in reversed(history) if "review" in s.next)
        agent.prune(PrunePolicy(operations_after=timedelta(0), tombstones_after=None))
        result = agent.replay("r", before_review.config["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW, result.error
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["operation_id"] == op.operation_id
        assert action["intent_hash"] == op.intent_hash
        assert len(read_tickets(sd.services)) == 1  # nothing ran
        # approving it again sends the same idempotency key: the service does not repeat it
        again = agent.resume("r", decisions=bound(agent, "r", APPROVE))
        assert again.status is RunStatus.DONE, again.error
        # the ledger flags the reopened id with what its tombstone said
        created = agent.ledger.events(operation_id=op.operation_id)
        flag = created[0].detail["compacted_earlier"]
        assert flag["intent_hash"] == op.intent_hash and flag["state"] == "SUCCEEDED"
        assert op.receipt is not None and flag["reference"] == op.receipt.reference
    assert len(read_tickets(sd.services)) == 1
