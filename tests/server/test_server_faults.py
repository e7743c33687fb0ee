"""What a server does to a run, under the effectgate agent: kills, double texts, cancels, deletes.

LangGraph's Agent Server runs are at-least-once: a run can be killed at any
seam, sent twice, interrupted by a second run (``multitask_strategy``),
cancelled or have its thread deleted while an effect is in flight. Every test
counts the effect in the external system's own storage (the demo ticket
service's tickets), never in effectgate's logs.

The first tests need no server: they drive effectgate's own checkpointers
(what ``open_agent`` and a self-hosted server with effectgate's saver use) the
way the server's ``threads.delete`` does. The rest share one ``langgraph dev``
per module (in-memory runtime, the state directory's ledger).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.graph import RunStatus
from effectgate.ledger import OpState
from tests.answers._bind import bound

APPROVE: dict[str, Any] = {"decisions": [{"type": "approve"}], "reviewer": "t"}
DEADLINE_S = 20.0


def _until(what: str, condition: Any, timeout: float = DEADLINE_S) -> Any:
    """Poll ``condition()`` until it is truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"not within {timeout} s: {what}")


def _checkpoint_rows(sd: StateDir, thread_id: str, store: str | None) -> int:
    if store is not None:
        with psycopg.connect(store) as pg:
            row = pg.execute(
                "SELECT COUNT(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchone()
            assert row is not None
            return int(row[0])
    conn = sqlite3.connect(sd.checkpoints)
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)
        ).fetchone()
        return int(n)
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str | None:
    """``None`` (the SQLite files of the state directory) or a ``postgresql://`` URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))


def test_delete_thread_while_an_effect_runs_stays_deleted(
    services: DemoServices, state_dir: StateDir, store: str | None
) -> None:
    """``delete_thread`` of effectgate's saver while the approved ticket is being created.

    The worker's late checkpoint is refused (the late-writer guard), so the
    thread stays deleted: no checkpoint comes back and no next review is
    raised on it. The ticket is created at most once and its operation stays
    in the ledger, ended honestly.
    """
    sd = state_dir
    with open_agent(sd, endpoints=services.endpoints, store=store) as agent:
        tid = "deleted-mid-effect"
        assert agent.start("Check the orders error rate", thread_id=tid).status is (
            RunStatus.WAITING_REVIEW
        )
        services.set_fault("tickets", "slow", delay_s=2.0)
        answer = bound(agent, tid, APPROVE)
        outcome: dict[str, Any] = {}

        def approve() -> None:
            try:
                outcome["result"] = agent.resume(tid, decisions=answer)
            except Exception as exc:  # noqa: BLE001 - the refused late write may surface here
                outcome["error"] = exc

        worker = threading.Thread(target=approve)
        worker.start()
        _until(
            "the ticket operation is IN_FLIGHT",
            lambda: any(
                op.tool == "create_ticket" and op.state is OpState.IN_FLIGHT
                for op in agent.ledger.list()
            ),
        )
        saver = agent.graph.checkpointer
        assert saver is not None
        saver.delete_thread(tid)
        worker.join(timeout=DEADLINE_S)
        assert not worker.is_alive()
        services.set_fault("tickets", "normal")
        assert _checkpoint_rows(sd, tid, store) == 0
        [ticket_op] = [op for op in agent.ledger.list() if op.tool == "create_ticket"]
        assert ticket_op.state in (OpState.SUCCEEDED, OpState.IN_FLIGHT, OpState.UNKNOWN)
    assert len(read_tickets(sd.services)) <= 1


# ---------------------------------------------------------------- the served graph

ROOT = Path(__file__).resolve().parents[2]
TASK = "Check the orders error rate and open a ticket if needed"
ONE_TICKET = {
    "name": "one-ticket",
    "turns": [
        {
            "say": "Opening a ticket.",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {"title": "orders: error rate", "body": "high", "severity": "high"},
                }
            ],
        }
    ],
    "final": "Ticket opened.",
}
SLOW_S = 3.0
"""Seconds the ticket service sleeps before it creates a ticket (the effect in flight)."""


class Served:
    """One ``langgraph dev`` for the module, with its state directory and demo services."""

    def __init__(self, root: Path) -> None:
        from effectgate.testing.langgraph_dev import LangGraphDev

        self.state = StateDir.open(root / "state")
        self.services = DemoServices(self.state.services)
        self.services.start()
        self.services.set_error_rate("orders", 0.12)
        self.server = LangGraphDev(
            root / "server", self.state.root, self.services.endpoints, dependencies=[str(ROOT)]
        )
        # One ticket per thread, no alert id: each thread's ticket is its own
        # operation (an alert id would make every thread's ticket one keyed effect).
        self.model = root / "one-ticket.yaml"
        self.model.write_text(yaml.safe_dump(ONE_TICKET))

    def start(self, **env: str) -> None:
        self.server.start(EFFECTGATE_MODEL=f"scripted:{self.model}", **env)

    def client(self) -> Any:
        from langgraph_sdk import get_sync_client

        return get_sync_client(url=self.server.url, timeout=60)

    def tickets(self) -> int:
        return len(read_tickets(self.state.services))

    def ops(self, tool: str = "create_ticket") -> list[Any]:
        from effectgate.ledger import SqliteLedger

        with SqliteLedger(self.state.ledger) as ledger:
            return [op for op in ledger.list() if op.tool == tool]

    def op_of(self, thread_id: str, tool: str = "create_ticket") -> Any:
        return [op for op in self.ops(tool) if op.thread_id == thread_id]

    def in_flight(self, thread_id: str) -> bool:
        return any(op.state is OpState.IN_FLIGHT for op in self.op_of(thread_id))

    def close(self) -> None:
        self.server.stop()
        self.services.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("served"))
    try:
        s.start()
        yield s
    finally:
        s.close()


@pytest.fixture
def slow(served: Served) -> Iterator[None]:
    served.services.set_fault("tickets", "slow", delay_s=SLOW_S)
    try:
        yield
    finally:
        served.services.set_fault("tickets", "normal")


def _interrupts(client: Any, thread_id: str) -> list[Any]:
    return list(client.threads.get_state(thread_id).get("interrupts") or [])


def _at_review(client: Any) -> tuple[str, Any]:
    """A new thread, run to its first review (the ticket); its id and the interrupt."""
    thread_id = str(client.threads.create()["thread_id"])
    client.runs.wait(
        thread_id, "effectgate", input={"messages": [{"role": "user", "content": TASK}]}
    )
    [first] = _interrupts(client, thread_id)
    assert [a["name"] for a in first["value"]["action_requests"]] == ["create_ticket"]
    return thread_id, first


def _approve(interrupt: Any) -> dict[str, Any]:
    n = len(interrupt["value"]["action_requests"])
    return {"resume": {interrupt["id"]: {"decisions": [{"type": "approve"}] * n}}}


def _idle(client: Any, thread_id: str) -> None:
    """Wait until no run of the thread is pending or running (bounded: none left running)."""
    _until(
        "every run of the thread has ended",
        lambda: all(r["status"] not in ("pending", "running") for r in client.runs.list(thread_id)),
        timeout=30,
    )


def _finish(client: Any, thread_id: str) -> list[Any]:
    """Answer every review left until the thread has none (at most three); the reviews seen.

    A call flagged ``possible_duplicate_of`` is rejected (what the flag is
    for); every other call is approved.
    """
    seen: list[Any] = []
    for _ in range(3):
        _idle(client, thread_id)
        pending = _interrupts(client, thread_id)
        if not pending:
            return seen
        seen.append(pending[0])
        decisions = [
            {"type": "reject", "message": "a duplicate"}
            if a.get("possible_duplicate_of")
            else {"type": "approve"}
            for a in pending[0]["value"]["action_requests"]
        ]
        client.runs.wait(
            thread_id,
            "effectgate",
            command={"resume": {pending[0]["id"]: {"decisions": decisions}}},
        )
    assert _interrupts(client, thread_id) == []
    return seen


def _settled(served: Served, thread_id: str) -> list[Any]:
    """Wait until no ticket operation of the thread is IN_FLIGHT; its operations."""
    _until("the ticket operation has ended", lambda: not served.in_flight(thread_id))
    return served.op_of(thread_id)


def _tool_answers(client: Any, thread_id: str) -> list[str]:
    messages = client.threads.get_state(thread_id)["values"].get("messages") or []
    return [str(m["content"]) for m in messages if m["type"] == "tool"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["reject", "enqueue", "interrupt", "rollback"])
def test_double_text_during_a_slow_effect_makes_one_ticket(
    served: Served, slow: None, strategy: str
) -> None:
    """A second message while the approved ticket is in flight, under each multitask strategy.

    ``reject``: refused (409). ``enqueue``: runs after the first; the agent's
    new proposal of the same ticket is flagged ``possible_duplicate_of`` the
    first operation (the reviewer rejects it). ``interrupt`` / ``rollback``:
    the first run is stopped mid-effect, yet the effect ends in the ledger
    (SUCCEEDED, never erased by the rollback); the second run waits for that
    attempt, reads its receipt back and answers the message after it. One
    ticket in every case.
    """
    client = served.client()
    before = served.tickets()
    thread_id, first = _at_review(client)
    client.runs.create(thread_id, "effectgate", command=_approve(first))
    _until("the ticket is in flight", lambda: served.in_flight(thread_id))
    again = {"messages": [{"role": "user", "content": "any news?"}]}
    if strategy == "reject":
        with pytest.raises(Exception, match="already running"):
            client.runs.create(thread_id, "effectgate", input=again, multitask_strategy=strategy)
    else:
        client.runs.create(thread_id, "effectgate", input=again, multitask_strategy=strategy)
    _idle(client, thread_id)
    [op] = _settled(served, thread_id)
    assert (op.state, op.attempt) == (OpState.SUCCEEDED, 1)
    assert served.tickets() - before == 1
    if strategy in ("interrupt", "rollback"):
        # The stopped run never wrote its ToolMessage. The second run's agent
        # node sends the call, which may have started, back to its effect
        # node: it waits for the live attempt, reads its receipt back, and the
        # message is answered after it. Before, that run ended in error over
        # the unanswered call and the thread had to be forked at the review.
        answers = _tool_answers(client, thread_id)
        assert len(answers) == 1 and '"reused": true' in answers[0], answers
        assert "error" not in [r["status"] for r in client.runs.list(thread_id)]
    seen = _finish(client, thread_id)
    if strategy == "enqueue":
        [again_review] = seen
        [request] = again_review["value"]["action_requests"]
        # The same intent ended before (here, or on an earlier thread of this module).
        done = {o.operation_id for o in served.ops() if o.state is OpState.SUCCEEDED}
        assert request["possible_duplicate_of"] in done
    assert served.tickets() - before == 1
    assert any("TICKET-" in answer for answer in _tool_answers(client, thread_id))
    assert [o.operation_id for o in served.op_of(thread_id) if o.state is OpState.SUCCEEDED] == [
        op.operation_id
    ]


@pytest.mark.slow
@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_cancel_during_a_slow_effect_ends_honest_with_one_ticket(
    served: Served, slow: None, action: str
) -> None:
    """``runs.cancel(action=...)`` of the run whose approved ticket is in flight.

    The cancel does not stop the tool's request: the ticket service still
    commits and the ledger ends the operation SUCCEEDED at attempt 1 (never
    left IN_FLIGHT, never lost), but the stopped run wrote no ToolMessage.
    ``interrupt`` keeps the run (status ``interrupted``) and the checkpoint
    whose next task is the effect node; ``rollback`` deletes the run and its
    checkpoints, back to the review's, where a second answer to the review is
    refused with the way on. Either way a run with no input finishes the step
    by reading the receipt back from the ledger: one ticket, one ToolMessage.
    """
    client = served.client()
    before = served.tickets()
    thread_id, first = _at_review(client)
    at_review = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    run = client.runs.create(thread_id, "effectgate", command=_approve(first))
    _until("the ticket is in flight", lambda: served.in_flight(thread_id))
    client.runs.cancel(thread_id, run["run_id"], wait=True, action=action)
    _idle(client, thread_id)
    head = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    _until(
        "the ticket operation is SUCCEEDED",
        lambda: [o.state for o in served.op_of(thread_id)] == [OpState.SUCCEEDED],
    )
    [op] = served.op_of(thread_id)
    assert op.attempt == 1
    assert served.tickets() - before == 1
    state = client.threads.get_state(thread_id)
    assert state["checkpoint"]["checkpoint_id"] == head  # no late checkpoint
    assert _tool_answers(client, thread_id) == []
    assert _interrupts(client, thread_id) == []
    statuses = [r["status"] for r in client.runs.list(thread_id)]
    if action == "interrupt":
        assert statuses.count("interrupted") == 1
        assert state["next"] == ["effect.create_ticket"]
    else:
        assert "interrupted" not in statuses  # the run is deleted
        assert (head, state["next"]) == (at_review, [])
        with pytest.raises(Exception, match="Run the thread with no input"):
            client.runs.wait(thread_id, "effectgate", command=_approve(first))
    client.runs.wait(thread_id, "effectgate", input=None)
    _finish(client, thread_id)
    assert served.tickets() - before == 1
    assert sum("TICKET-" in a for a in _tool_answers(client, thread_id)) == 1
    [op] = served.op_of(thread_id)
    assert (op.state, op.attempt) == (OpState.SUCCEEDED, 1)


@pytest.mark.slow
def test_delete_thread_during_a_slow_effect_stays_deleted(served: Served, slow: None) -> None:
    """``threads.delete`` while the approved ticket is in flight: the thread stays deleted.

    The server's own runtime keeps the checkpoints of ``langgraph dev``; the
    ledger keeps the operation, which ends SUCCEEDED with one ticket.
    """
    from langgraph_sdk.errors import NotFoundError

    client = served.client()
    before = served.tickets()
    thread_id, first = _at_review(client)
    client.runs.create(thread_id, "effectgate", command=_approve(first))
    _until("the ticket is in flight", lambda: served.in_flight(thread_id))
    client.threads.delete(thread_id)
    [op] = _settled(served, thread_id)
    assert op.state is OpState.SUCCEEDED
    assert served.tickets() - before == 1
    with pytest.raises(NotFoundError):
        client.threads.get(thread_id)
    with pytest.raises(NotFoundError):
        client.threads.get_state(thread_id)


@pytest.mark.slow
def test_the_same_run_twice_acts_once(served: Served) -> None:
    """The approving run executed twice from its start checkpoint (a server's retry)."""
    client = served.client()
    before = served.tickets()
    thread_id, first = _at_review(client)
    at_review = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    for _ in range(2):
        client.runs.wait(thread_id, "effectgate", command=_approve(first), checkpoint_id=at_review)
        assert _interrupts(client, thread_id) == []
        assert sum("TICKET-" in a for a in _tool_answers(client, thread_id)) == 1
    assert served.tickets() - before == 1
    [op] = served.op_of(thread_id)
    assert (op.state, op.attempt) == (OpState.SUCCEEDED, 1)


@pytest.mark.slow
def test_a_deleted_threads_queued_runs_do_not_jam_the_queue(served: Served, slow: None) -> None:
    """``threads.delete`` with one run in flight and two enqueued behind it.

    The approved ticket still ends SUCCEEDED (one ticket), no run of the
    deleted thread is left pending or running, and a new thread on the same
    server reaches its review and its ticket within the usual deadline.
    """
    from langgraph_sdk.errors import NotFoundError

    client = served.client()
    before = served.tickets()
    thread_id, first = _at_review(client)
    client.runs.create(thread_id, "effectgate", command=_approve(first))
    _until("the ticket is in flight", lambda: served.in_flight(thread_id))
    for text in ("any news?", "and now?"):
        message = {"messages": [{"role": "user", "content": text}]}
        client.runs.create(thread_id, "effectgate", input=message, multitask_strategy="enqueue")
    client.threads.delete(thread_id)
    [op] = _settled(served, thread_id)
    assert op.state is OpState.SUCCEEDED
    with pytest.raises(NotFoundError):
        client.threads.get(thread_id)

    served.services.set_fault("tickets", "normal")
    other, review = _at_review(client)  # the queue is free: the next thread runs at once
    client.runs.wait(other, "effectgate", command=_approve(review))
    _finish(client, other)
    assert served.tickets() - before == 2  # one for each thread, none repeated
    [done] = served.op_of(other)
    assert (done.state, done.attempt) == (OpState.SUCCEEDED, 1)
    assert op.attempt == 1


@pytest.mark.slow
def test_kill_9_of_the_server_during_a_slow_effect_then_the_task_again_makes_one_ticket(
    tmp_path: Path,
) -> None:
    """``kill -9`` of the ``langgraph dev`` process group while the approved ticket is in flight.

    The in-memory runtime keeps no checkpoint of the thread (docs/async-and-server.md,
    Limits); the ledger keeps the operation IN_FLIGHT at attempt 1. The client
    sends the task again on the same thread id: the same call (same operation
    id) is recovered by the ticket's idempotency key without a new review,
    found (attempt 1) or, when the killed request never reached the service's
    commit, sent again under that key (attempt 2). One ticket either way.
    """
    import os
    import signal

    served = Served(tmp_path)
    try:
        served.start()
        client = served.client()
        thread_id, first = _at_review(client)
        served.services.set_fault("tickets", "slow", delay_s=SLOW_S)
        client.runs.create(thread_id, "effectgate", command=_approve(first))
        _until("the ticket is in flight", lambda: served.in_flight(thread_id))
        proc = served.server.proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        [op] = served.op_of(thread_id)
        assert (op.state, op.attempt) == (OpState.IN_FLIGHT, 1)
        time.sleep(SLOW_S + 1)  # past the service's hold: whatever it commits is in
        committed = served.tickets()
        assert committed in (0, 1)
        served.services.set_fault("tickets", "normal")

        served.start()
        client = served.client()
        client.threads.create(thread_id=thread_id, if_exists="do_nothing")
        state = client.threads.get_state(thread_id)
        assert not (state.get("values") or {}).get("messages")  # no checkpoint came back
        client.runs.wait(
            thread_id, "effectgate", input={"messages": [{"role": "user", "content": TASK}]}
        )
        assert _interrupts(client, thread_id) == []  # not asked again: approved in the ledger
        assert served.tickets() == 1
        [op] = served.op_of(thread_id)
        assert op.state is OpState.SUCCEEDED
        # found by the lookup when the service had committed; else sent again under the key
        assert op.attempt in ((1,) if committed else (1, 2))
        assert sum("TICKET-" in a for a in _tool_answers(client, thread_id)) == 1
    finally:
        served.close()
