"""A hostile resume under ``langgraph dev``: an answer keyed by an interrupt id that is not pending.

A LangGraph client answers a review with ``Command(resume={interrupt_id:
answer})``. LangGraph ignores a key that names no interrupt of the thread and
runs the review again, which asks the same question: the run used to return
200 with nothing applied and no error, and the client could not tell its
answer was lost. The run must end in error naming the unknown id and the
pending one, with nothing applied, and the review must stay answerable.
Driven only through ``langgraph_sdk`` against the real server (the fixtures of
``tests/server/test_langgraph_dev.py``); what was applied is read from the
ticket service's and mail sink's own files, the workspace and the ledger.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command
from langgraph_sdk import get_sync_client

from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.errors import DecisionError, UnknownInterruptError
from effectgate.graph import Agent, RunStatus
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing.oracle import world
from tests.answers._bind import bound
from tests.integration.test_graph import TASK, decide, make_agent
from tests.server.test_langgraph_dev import (
    Server,
    _answer,
    _counts,
    _interrupts,
    _start,
    server,
)

__all__ = ["server"]  # the fixture, imported to be used here

WRONG = "0123456789abcdef0123456789abcdef"
"""Shaped like a LangGraph interrupt id (32 hex digits), so LangGraph reads the resume as a map."""


def _ledger_rows(state_dir: StateDir) -> tuple[list[Any], list[Any]]:
    with SqliteLedger(state_dir.ledger) as ledger:
        return ledger.list(), list(ledger.events())


@pytest.mark.slow
def test_resume_keyed_by_an_unknown_interrupt_id_fails_the_run_and_applies_nothing(
    server: Server, services: DemoServices, state_dir: StateDir
) -> None:
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [pending] = _interrupts(client, thread_id)
    before = _counts(services, state_dir), _ledger_rows(state_dir)

    out = client.runs.wait(
        thread_id,
        "effectgate",
        command={"resume": {WRONG: {"decisions": [_answer("approve")]}}},
        raise_error=False,
    )

    # The client sees the refusal: the run ended in error, one line naming both ids.
    assert isinstance(out, dict) and "__error__" in out, out
    message = str(out["__error__"].get("message"))
    assert "\n" not in message, message
    assert WRONG in message and pending["id"] in message, message
    [run, *_] = client.runs.list(thread_id)
    assert run["status"] == "error"
    # Nothing was applied: no ticket, mail or file, no ledger row or event.
    assert (_counts(services, state_dir), _ledger_rows(state_dir)) == before
    assert before[0] == (0, 0, [])
    # The review still waits under the same id, and the right id answers it, once.
    assert [i["id"] for i in _interrupts(client, thread_id)] == [pending["id"]]
    client.runs.wait(
        thread_id,
        "effectgate",
        command={"resume": {pending["id"]: {"decisions": [_answer("approve")]}}},
    )
    [second] = _interrupts(client, thread_id)
    assert [a["name"] for a in second["value"]["action_requests"]] == ["send_email", "write_file"]
    assert _counts(services, state_dir) == (1, 0, [])
    with SqliteLedger(state_dir.ledger) as ledger:
        [ticket] = [op for op in ledger.list() if op.tool == "create_ticket"]
        assert (ticket.state.value, ticket.attempt) == ("SUCCEEDED", 1)


# The same rule in one process: the compiled graph resumed as a LangGraph client
# resumes it, the review's node and the effect node's reconciliation, and the
# library path, which refuses the same id before the graph runs.


def _refused(agent: Agent, thread_id: str, resume: dict[str, Any]) -> str:
    config = {"configurable": {"thread_id": thread_id}}
    with pytest.raises(UnknownInterruptError) as refused:
        agent.graph.invoke(Command(resume=resume), config, durability="sync")
    return str(refused.value)


def test_the_graph_refuses_an_unknown_interrupt_id_at_a_review(
    services: DemoServices, state_dir: StateDir
) -> None:
    with make_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="t1")
        (review,) = waiting.interrupts
        answer = decide(waiting, "approve")
        message = _refused(agent, "t1", {WRONG: answer})
        assert WRONG in message and review.id in message and "\n" not in message
        assert "names no interrupt" in _refused(agent, "t1", {})
        with pytest.raises(DecisionError, match="is not pending") as library:
            agent.resume("t1", answers={WRONG: answer})
        assert review.id in str(library.value)
        assert (world(state_dir).tickets, agent.ledger.list()) == (0, [])
        status = agent.status("t1")
        assert [i.id for i in status.interrupts] == [review.id]
        moved = agent.resume("t1", answers={review.id: answer})
        # Answered by its own id: the ticket exists once and the next review is another one.
        assert world(state_dir).tickets == 1
        assert moved.status in (RunStatus.DONE, RunStatus.WAITING_REVIEW), moved
        assert review.id not in [i.id for i in moved.interrupts]
        if moved.interrupts:  # a stale answer (a second client's) to the closed review
            stale = _refused(agent, "t1", {review.id: answer})
            assert review.id in stale and moved.interrupts[0].id in stale, stale
            assert world(state_dir).tickets == 1


def test_the_graph_refuses_an_unknown_interrupt_id_at_a_reconciliation(
    services: DemoServices, state_dir: StateDir
) -> None:
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
    with make_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="t1")
        parked = agent.resume("t1", decisions=bound(agent, "t1", decide(waiting, "approve")))
        assert parked.status is RunStatus.WAITING_RECONCILIATION
        (asked,) = parked.interrupts
        verdict = {"verdict": "succeeded", "reference": "TICKET-1", "evidence": "seen in the UI"}
        message = _refused(agent, "t1", {WRONG: verdict})
        assert WRONG in message and asked.id in message
        (op,) = agent.ledger.list(thread_id="t1")
        assert (op.state, op.attempt, world(state_dir).tickets) == (
            OpState.NEEDS_RECONCILIATION,
            1,
            1,
        )
        done = agent.resume("t1", answers={asked.id: verdict})
        assert done.status is RunStatus.DONE
        (op,) = agent.ledger.list(thread_id="t1")
        assert op.state is OpState.SUCCEEDED and world(state_dir).tickets == 1


# A key that is not shaped like an id is no map to LangGraph: the whole dict
# arrives as the plain answer. It used to be taken as a (malformed) answer:
# the run went on, asked again and succeeded, and the client saw no error.


def test_the_graph_refuses_a_resume_keyed_by_a_non_id_at_a_review(
    services: DemoServices, state_dir: StateDir
) -> None:
    with make_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="t1")
        (review,) = waiting.interrupts
        answer = decide(waiting, "approve")
        message = _refused(agent, "t1", {"review-1": answer})
        assert "'review-1'" in message and review.id in message and "\n" not in message
        two = _refused(agent, "t1", {"a": answer, "b": "approve"})
        assert "'a', 'b' are not interrupt ids" in two, two
        assert (world(state_dir).tickets, agent.ledger.list()) == (0, [])
        assert [i.id for i in agent.status("t1").interrupts] == [review.id]
        assert "error" not in agent.status("t1").interrupts[0].value  # not asked again
        # The answer under its own id still applies, once.
        moved = agent.resume("t1", answers={review.id: answer})
        assert world(state_dir).tickets == 1
        assert review.id not in [i.id for i in moved.interrupts]
        # A malformed answer (not a dict of answers) is still worded at the review.
        config = {"configurable": {"thread_id": "t1"}}
        if moved.interrupts:
            agent.graph.invoke(Command(resume={"decisions": "all"}), config, durability="sync")
            (again,) = agent.status("t1").interrupts
            assert "a review answer must look like" in again.value["error"]


def test_the_graph_refuses_a_resume_keyed_by_a_non_id_at_a_reconciliation(
    services: DemoServices, state_dir: StateDir
) -> None:
    services.set_fault("tickets", "ambiguous-unqueryable", delay_s=8)
    with make_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="t1")
        parked = agent.resume("t1", decisions=bound(agent, "t1", decide(waiting, "approve")))
        assert parked.status is RunStatus.WAITING_RECONCILIATION
        (asked,) = parked.interrupts
        verdict = {"verdict": "succeeded", "reference": "TICKET-1", "evidence": "seen in the UI"}
        message = _refused(agent, "t1", {"op-1": verdict})
        assert "'op-1'" in message and asked.id in message
        (op,) = agent.ledger.list(thread_id="t1")
        assert (op.state, op.attempt) == (OpState.NEEDS_RECONCILIATION, 1)
        done = agent.resume("t1", answers={asked.id: verdict})
        assert done.status is RunStatus.DONE
        assert world(state_dir).tickets == 1


def test_the_library_refuses_an_empty_answers_map(
    services: DemoServices, state_dir: StateDir
) -> None:
    with make_agent(state_dir, services) as agent:
        waiting = agent.start(TASK, thread_id="t1")
        (review,) = waiting.interrupts
        with pytest.raises(UnknownInterruptError, match="names no interrupt") as refused:
            agent.resume("t1", answers={})
        assert review.id in str(refused.value)
        assert (world(state_dir).tickets, agent.ledger.list()) == (0, [])
        assert [i.id for i in agent.status("t1").interrupts] == [review.id]


@pytest.mark.slow
def test_a_resume_to_a_finished_thread_fails_the_run_and_applies_nothing(
    server: Server, services: DemoServices, state_dir: StateDir
) -> None:
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    first = None
    while pending := _interrupts(client, thread_id):
        [item] = pending
        first = first or item
        n = len(item["value"]["action_requests"])
        client.runs.wait(
            thread_id,
            "effectgate",
            command={"resume": {item["id"]: {"decisions": [_answer("approve")] * n}}},
        )
    assert first is not None
    before = _counts(services, state_dir), _ledger_rows(state_dir)
    assert before[0][0] == 1
    runs_before = len(client.runs.list(thread_id))

    # A second client's late answer to the first review, and a plain answer.
    for command in (
        {"resume": {first["id"]: {"decisions": [_answer("approve")]}}},
        {"resume": {"decisions": [_answer("approve")]}},
    ):
        out = client.runs.wait(thread_id, "effectgate", command=command, raise_error=False)
        assert isinstance(out, dict) and "__error__" in out, out
        message = str(out["__error__"].get("message"))
        assert "resume refused" in message and "\n" not in message, message
    assert len(client.runs.list(thread_id)) == runs_before + 2
    assert [r["status"] for r in client.runs.list(thread_id)[:2]] == ["error", "error"]
    assert (_counts(services, state_dir), _ledger_rows(state_dir)) == before
    # A new message still starts a new turn on the thread.
    client.runs.wait(
        thread_id, "effectgate", input={"messages": [{"role": "user", "content": "thanks"}]}
    )
    assert client.runs.list(thread_id)[0]["status"] == "success"
