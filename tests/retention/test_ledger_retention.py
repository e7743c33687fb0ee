"""Ledger retention: terminal operations compact to tombstones; a replay onto one is reviewed."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from typing import Any

import pytest

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.errors import DecisionError, IntentConflictError
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.retention import PrunePolicy
from effectgate.tools import intent_hash
from tests.answers._bind import bound
from tests.retention.test_prune import APPROVE, _agent, _finish


def test_compaction_keeps_a_tombstone_with_intent_and_receipt_then_drops_it(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """Compacted: the row, approvals and events go; the tombstone answers until its window ends."""
    sd = state_dir
    with _agent(sd, services, "c", calls=2, store=store) as agent:
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
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """Time travel to before a call whose operation was compacted asks the reviewer again.

    The review request says so (``compacted_operation``: the id, when, its
    intent hash and receipt), and a policy that approves the tool without
    asking does not approve this call: nothing runs until a person says yes.
    """
    sd = state_dir
    auto = Policy(auto_approve=frozenset({"create_ticket"}))
    with _agent(sd, services, "r", calls=1, store=store) as agent:
        _finish(agent, "r", 1)
        (op,) = agent.ledger.list(thread_id="r")
        cfg: Any = {"configurable": {"thread_id": "r"}}
        history = list(agent.graph.get_state_history(cfg))
        # the checkpoint where the review node is about to run for the call
        before_review = next(s for s in reversed(history) if "review" in s.next)
        agent.prune(PrunePolicy(operations_after=timedelta(0), tombstones_after=None))
    assert op.receipt is not None
    with _agent(sd, services, "r", calls=1, store=store, policy=auto) as agent:
        result = agent.replay("r", before_review.config["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW, result.error
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["operation_id"] == op.operation_id
        assert action["intent_hash"] == op.intent_hash
        flag = action["compacted_operation"]
        assert (flag["operation_id"], flag["intent_hash"], flag["state"]) == (
            op.operation_id,
            op.intent_hash,
            "SUCCEEDED",
        )
        assert flag["reference"] == op.receipt.reference
        assert f"operation {op.operation_id} was compacted on " in flag["message"]
        assert f"receipt {op.receipt.reference}" in flag["message"]
        assert len(read_tickets(sd.services)) == 1  # nothing ran
        # approving it again sends the same idempotency key: the service does not repeat it
        again = agent.resume("r", decisions=bound(agent, "r", APPROVE))
        assert again.status is RunStatus.DONE, again.error
        # the ledger flags the reopened id with what its tombstone said
        created = agent.ledger.events(operation_id=op.operation_id)
        earlier = created[0].detail["compacted_earlier"]
        assert earlier["intent_hash"] == op.intent_hash and earlier["state"] == "SUCCEEDED"
        assert earlier["reference"] == op.receipt.reference
    assert len(read_tickets(sd.services)) == 1


def _write_twice(sd: StateDir, name: str) -> str:
    call = {"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}}
    path = sd.root / f"{name}.json"
    path.write_text(json.dumps({"name": name, "turns": [{"say": "write", "tool_calls": [call]}]}))
    return f"scripted:{path}"


def test_a_repeat_of_a_compacted_intent_is_still_a_possible_duplicate(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """Thread w1 writes a file; its operation is compacted; thread w2 proposes the same write.

    w2's call has another operation id but the intent hash the tombstone
    kept: it is flagged as a possible duplicate of w1's (compacted)
    operation, and the policy that approves write_file without asking does
    not approve it.
    """
    sd = state_dir
    auto = Policy(auto_approve=frozenset({"write_file"}))
    model = _write_twice(sd, "w")
    with open_agent(sd, model=model, store=store, policy=auto) as agent:
        assert agent.start("go", thread_id="w1").status is RunStatus.DONE
        (first,) = agent.ledger.list(thread_id="w1")
        report = agent.prune(PrunePolicy(operations_after=timedelta(0), tombstones_after=None))
        assert report.operations_compacted == 1
        result = agent.start("go", thread_id="w2")
        assert result.status is RunStatus.WAITING_REVIEW, result.error
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["operation_id"] != first.operation_id
        assert action["possible_duplicate_of"] == first.operation_id
        flag = action["possible_duplicate_compacted"]
        assert (flag["intent_hash"], flag["thread_id"]) == (first.intent_hash, "w1")
        assert agent.ledger.list(thread_id="w2") == []  # nothing approved, nothing ran
        # once the tombstone is gone too (past the deduplication window), nothing is left to flag
        agent.prune(PrunePolicy(operations_after=None, tombstones_after=timedelta(0)))
        result = agent.start("go", thread_id="w3")
        assert result.status is RunStatus.DONE, result.error


def test_a_compacted_id_stays_bound_to_its_intent_at_review_and_dispatch(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """After compaction, an edit to other arguments under the same id is refused, as before it.

    The service still remembers the idempotency key, so dispatching new
    arguments under it would fail there (HTTP 409) and wedge the business
    key. The review refuses the edit with the same line as without the
    prune, nothing is dispatched, and ``Ledger.open`` (dispatch's create-or-get)
    refuses the id for another intent too.
    """
    sd = state_dir
    with _agent(sd, services, "b", calls=1, store=store) as agent:
        _finish(agent, "b", 1)
        (op,) = agent.ledger.list(thread_id="b")
        cfg: Any = {"configurable": {"thread_id": "b"}}
        history = list(agent.graph.get_state_history(cfg))
        before_review = next(s for s in reversed(history) if "review" in s.next)
        agent.prune(PrunePolicy(operations_after=timedelta(0), tombstones_after=None))
    with _agent(sd, services, "b", calls=1, store=store) as agent:
        result = agent.replay("b", before_review.config["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW, result.error
        (action,) = result.interrupts[0].value["action_requests"]
        assert action["operation_id"] == op.operation_id and action["conflict"] is None
        edit = {
            "type": "edit",
            "edited_action": {"name": "create_ticket", "args": {**op.args, "title": "other"}},
        }
        answer = bound(agent, "b", {"decisions": [edit], "reviewer": "t"})
        try:
            again = agent.resume("b", decisions=answer)
            refusal = str(again.interrupts[0].value.get("error")) if again.interrupts else ""
            assert again.status is RunStatus.WAITING_REVIEW, again.error
        except DecisionError as exc:
            refusal = str(exc)
        assert f"edited arguments map to operation {op.operation_id!r}" in refusal
        assert "which is bound to other arguments" in refusal
        assert agent.ledger.get(op.operation_id) is None  # nothing opened, nothing dispatched
        with pytest.raises(IntentConflictError):
            agent.ledger.open(
                operation_id=op.operation_id,
                thread_id="b",
                tool_call_id="other-call",
                tool=op.tool,
                tool_version=op.tool_version,
                args={**op.args, "title": "other"},
                intent_hash=intent_hash(op.tool, op.tool_version, {**op.args, "title": "other"}),
            )
        assert agent.ledger.get(op.operation_id) is None
    assert len(read_tickets(sd.services)) == 1
