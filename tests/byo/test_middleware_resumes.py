"""A resume no node can take, in ``create_agent`` + ``EffectGateMiddleware`` (``gate.guard``).

Two leftovers of issue #33, on the middleware path:

- F6: ``Command(resume={id: ...})`` to a finished thread, keyed by the id of
  its last (answered) review or by a random id, ran no node (LangGraph has no
  task for it) and returned the state as it was: no error, nothing applied.
  The served graph refused it already; the middleware's agent now refuses it
  with the same rule and words (``answers.refuse_resume_of_idle``).
- F5: a resume keyed by an unknown id at a waiting review was refused inside
  the run, so LangGraph kept the refusal as the review task's error on the
  checkpoint; after the next (malformed) answer re-asked the review,
  ``get_state`` still showed the first refusal's text as the task's error.

Real ``create_agent``, real SQLite checkpointer, the demo ticket service and
mail sink; what happened is read from their files, the ledger and the
checkpoints.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.answers import refuse_resume_of_idle
from effectgate.demo.services import DemoServices
from effectgate.errors import UnknownInterruptError
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import make_model
from effectgate.testing.oracle import world
from tests.byo._agents import middleware_agent

pytest.importorskip("langchain.agents")

CONFIG: Any = {"configurable": {"thread_id": "t1"}}
RANDOM = "0123456789abcdef0123456789abcdef"
"""Shaped like an interrupt id (32 hex digits), so LangGraph reads the resume as a map."""
APPROVE = {"decisions": [{"type": "approve"}]}


def _finish(graph: Any) -> str:
    """Run the incident, approving each review; return the first review's id."""
    out = graph.invoke({"messages": [HumanMessage("handle it")]}, CONFIG, version="v2")
    first = out.interrupts[0].id
    while out.interrupts:
        (pending,) = out.interrupts
        n = len(pending.value["action_requests"])
        out = graph.invoke(
            Command(resume={pending.id: {"decisions": [{"type": "approve"}] * n}}),
            CONFIG,
            version="v2",
        )
    return first


def _recorded(state_dir: StateDir, ledger: SqliteLedger) -> tuple[Any, ...]:
    """Everything a resume could change: the world, the ledger, the checkpoints."""
    w = world(state_dir)
    with sqlite3.connect(state_dir.checkpoints) as conn:
        checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        writes = conn.execute("SELECT count(*) FROM writes").fetchone()[0]
    return (
        w.tickets,
        w.mails,
        [(op.operation_id, op.state, op.attempt) for op in ledger.list()],
        len(list(ledger.events())),
        checkpoints,
        writes,
    )


def _words(resume: Any) -> str:
    """What the served graph says for this resume to a thread that waits on nothing."""
    with pytest.raises(UnknownInterruptError) as said:
        refuse_resume_of_idle(resume)
    return str(said.value)


@pytest.mark.parametrize("key", ["stale", "random", "plain"])
def test_a_resume_to_a_finished_thread_is_refused_and_applies_nothing(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir, key: str
) -> None:
    graph, ledger = agent
    first = _finish(graph)
    before = _recorded(state_dir, ledger)
    assert before[:2] == (1, 1)
    resume: Any = {"stale": {first: APPROVE}, "random": {RANDOM: APPROVE}, "plain": APPROVE}[key]

    with pytest.raises(UnknownInterruptError) as refused:
        graph.invoke(Command(resume=resume), CONFIG, version="v2")

    message = str(refused.value)
    assert message == _words(resume)  # the served graph's rule and words
    assert "\n" not in message and "nothing was applied" in message
    if key != "plain":
        assert next(iter(resume)) in message
    # Nothing was applied or written: no ticket or mail, no ledger row or event, no checkpoint.
    assert _recorded(state_dir, ledger) == before
    assert {op.state for op in ledger.list()} == {OpState.SUCCEEDED}
    # The thread still takes a new message: the model answers it.
    seen = len(graph.get_state(CONFIG).values["messages"])
    out = graph.invoke({"messages": [HumanMessage("thanks")]}, CONFIG, version="v2")
    assert len(out.value["messages"]) > seen + 1


def test_an_async_resume_to_a_finished_thread_is_refused(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``ainvoke`` (what ``langgraph dev`` runs) takes the same check."""
    with SqliteLedger(state_dir.ledger) as ledger:
        graph = middleware_agent(
            make_model("scripted:incident"),
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            checkpointer=InMemorySaver(),
        )

        async def run() -> tuple[str, str]:
            out = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, version="v2")
            first = out.interrupts[0].id
            while out.interrupts:
                (pending,) = out.interrupts
                n = len(pending.value["action_requests"])
                answer = {pending.id: {"decisions": [{"type": "approve"}] * n}}
                out = await graph.ainvoke(Command(resume=answer), CONFIG, version="v2")
            with pytest.raises(UnknownInterruptError) as refused:
                await graph.ainvoke(Command(resume={first: APPROVE}), CONFIG, version="v2")
            return first, str(refused.value)

        first, message = asyncio.run(run())
        assert message == _words({first: APPROVE})
        w = world(state_dir)
        assert (w.tickets, w.mails) == (1, 1)
        assert {op.state for op in ledger.list()} == {OpState.SUCCEEDED}


def test_a_refused_resume_leaves_no_error_on_the_review_it_missed(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir
) -> None:
    """F5: the refusal of an unknown id is not kept as the task's error beside later reviews."""
    graph, ledger = agent
    (pending,) = graph.invoke(
        {"messages": [HumanMessage("handle it")]}, CONFIG, version="v2"
    ).interrupts
    before = _recorded(state_dir, ledger)
    with pytest.raises(UnknownInterruptError, match=RANDOM):
        graph.invoke(Command(resume={RANDOM: APPROVE}), CONFIG, version="v2")
    assert _recorded(state_dir, ledger) == before  # nothing written, not even the error
    # A malformed answer by the right id: the review is asked again with its own error.
    out = graph.invoke(Command(resume={pending.id: {"decisions": []}}), CONFIG, version="v2")
    (again,) = out.interrupts
    assert "0 decision(s) for 1 pending call(s)" in again.value["error"]
    state = graph.get_state(CONFIG)
    errors = [str(t.error) for t in state.tasks if t.error is not None]
    assert errors == [], errors  # before: the first refusal's text, still on the review task
    assert RANDOM not in again.value["error"]
    # The review is answered by its id; one ticket.
    graph.invoke(Command(resume={again.id: APPROVE}), CONFIG, version="v2")
    assert world(state_dir).tickets == 1


@pytest.mark.parametrize("when", ["waiting", "finished"])
def test_an_empty_resume_is_refused_by_the_guard_before_the_run(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir, when: str
) -> None:
    """``Command(resume=None)`` (an empty command): the guard's own error, nothing written.

    LangGraph's own loop meets it with ``UnboundLocalError`` (``resume_is_map``
    is set only for a resume that is not None), a traceback naming no answer.
    """
    graph, ledger = agent
    (pending,) = graph.invoke(
        {"messages": [HumanMessage("handle it")]}, CONFIG, version="v2"
    ).interrupts
    if when == "finished":
        _finish_from(graph, pending)
    before = _recorded(state_dir, ledger)

    with pytest.raises(UnknownInterruptError) as refused:
        graph.invoke(Command(resume=None), CONFIG, version="v2")

    message = str(refused.value)
    assert "\n" not in message and "nothing was applied" in message
    assert "Command(resume=None)" in message
    if when == "waiting":
        assert pending.id in message  # names what waits
    assert _recorded(state_dir, ledger) == before  # no ticket, mail, ledger row or checkpoint
    if when == "waiting":
        # The review still waits under its id and takes its answer: one ticket.
        assert [i.id for i in graph.get_state(CONFIG).interrupts] == [pending.id]
        graph.invoke(Command(resume={pending.id: APPROVE}), CONFIG, version="v2")
        assert world(state_dir).tickets == 1


def test_an_async_empty_resume_is_refused_by_the_guard(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``ainvoke`` (what ``langgraph dev`` runs) refuses ``Command(resume=None)`` the same way."""
    with SqliteLedger(state_dir.ledger) as ledger:
        graph = middleware_agent(
            make_model("scripted:incident"),
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            checkpointer=InMemorySaver(),
        )

        async def run() -> tuple[str, str]:
            out = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, version="v2")
            with pytest.raises(UnknownInterruptError) as refused:
                await graph.ainvoke(Command(resume=None), CONFIG, version="v2")
            return out.interrupts[0].id, str(refused.value)

        first, message = asyncio.run(run())
        assert "Command(resume=None)" in message and first in message
        assert world(state_dir).tickets == 0
        assert ledger.list() == []  # the review opened no row yet; none was added


def _finish_from(graph: Any, pending: Any) -> None:
    """Approve ``pending`` and every review after it."""
    out = None
    while pending is not None:
        n = len(pending.value["action_requests"])
        out = graph.invoke(
            Command(resume={pending.id: {"decisions": [{"type": "approve"}] * n}}),
            CONFIG,
            version="v2",
        )
        pending = out.interrupts[0] if out.interrupts else None


@pytest.mark.parametrize("key", ["stale", "random", "plain"])
def test_without_guard_a_resume_to_a_finished_thread_returns_having_done_nothing(
    services: DemoServices, state_dir: StateDir, key: str
) -> None:
    """What docs/bring-your-own-graph.md says of an agent not wrapped in ``gate.guard``.

    No node runs for a resume to a finished thread (LangGraph has no task for
    it), so no hook of the middleware can refuse it: ``invoke`` returns the
    state as it was, with no error. Nothing reaches the world or the ledger.
    """
    from langchain.agents import create_agent
    from langgraph.checkpoint.sqlite import SqliteSaver

    from effectgate.middleware import EffectGateMiddleware

    conn = sqlite3.connect(state_dir.checkpoints, check_same_thread=False)
    with SqliteLedger(state_dir.ledger) as ledger:
        gate = EffectGateMiddleware(
            default_tools(state_dir.workspace, services.endpoints), ledger=ledger
        )
        graph = create_agent(
            make_model("scripted:incident"), middleware=[gate], checkpointer=SqliteSaver(conn)
        )
        first = _finish(graph)
        w = world(state_dir)
        rows = [(op.operation_id, op.state, op.attempt) for op in ledger.list()]
        events = len(list(ledger.events()))
        resume: Any = {"stale": {first: APPROVE}, "random": {RANDOM: APPROVE}, "plain": APPROVE}
        out = graph.invoke(Command(resume=resume[key]), CONFIG, version="v2")
        assert out.interrupts == ()
        assert (world(state_dir).tickets, world(state_dir).mails) == (w.tickets, w.mails) == (1, 1)
        assert [(op.operation_id, op.state, op.attempt) for op in ledger.list()] == rows
        assert len(list(ledger.events())) == events
        assert graph.get_state(CONFIG).next == ()
    conn.close()
