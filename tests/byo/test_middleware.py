"""``EffectGateMiddleware`` in a LangChain ``create_agent`` agent, in one process."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.demo.services import DemoServices, read_tickets
from effectgate.dispatch import Dispatcher
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import make_model
from effectgate.testing.oracle import world
from tests.byo._agents import middleware_agent
from tests.byo.conftest import all_checkpoint_problems

pytest.importorskip("langchain.agents")

CONFIG: Any = {"configurable": {"thread_id": "t1"}}
HITL_DECISIONS = {"approve", "edit", "reject", "respond"}


def start(graph: Any) -> Any:
    return graph.invoke({"messages": [HumanMessage("handle it")]}, CONFIG, version="v2")


def test_interrupt_has_hitl_shape_plus_operation_ids(agent: tuple[Any, SqliteLedger]) -> None:
    """HITL's request keys and decision names, with effectgate's operation id and intent hash."""
    graph, ledger = agent
    (pending,) = start(graph).interrupts
    value = pending.value
    (action,) = value["action_requests"]
    (config,) = value["review_configs"]
    assert {"name", "args", "description"} <= set(action)
    assert action["name"] == config["action_name"] == "create_ticket"
    assert set(config["allowed_decisions"]) <= HITL_DECISIONS
    assert action["operation_id"] == "ticket:orders-error-rate"
    assert len(action["intent_hash"]) == 64
    assert ledger.list(thread_id="t1") == []  # nothing recorded before the answer


def test_edit_runs_the_edited_call_once(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir
) -> None:
    """An edit is stored as the operation's arguments and is what the ticket service saw."""
    graph, ledger = agent
    (pending,) = start(graph).interrupts
    args = {**pending.value["action_requests"][0]["args"], "title": "orders: edited title"}
    edit = {"type": "edit", "edited_action": {"name": "create_ticket", "args": args}}
    out = graph.invoke(Command(resume={"decisions": [edit]}), CONFIG, version="v2")
    (ticket,) = read_tickets(state_dir.services)
    assert ticket["title"] == "orders: edited title"
    (op,) = ledger.list(thread_id="t1", tool="create_ticket")
    assert op.args["title"] == "orders: edited title" and op.state is OpState.SUCCEEDED
    answer = next(
        m for m in out.value["messages"] if isinstance(m, ToolMessage) and m.name == "create_ticket"
    )
    assert "edited title" in str(answer.content)


def test_reject_runs_nothing(agent: tuple[Any, SqliteLedger], state_dir: StateDir) -> None:
    """A rejected call is answered in after_model and never reaches the tool node."""
    graph, ledger = agent
    start(graph)
    reject = {"type": "reject", "message": "not now"}
    out = graph.invoke(Command(resume={"decisions": [reject]}), CONFIG, version="v2")
    assert world(state_dir).tickets == 0
    (op,) = ledger.list(thread_id="t1")
    assert op.state is OpState.REJECTED
    (answer,) = [m for m in out.value["messages"] if getattr(m, "name", "") == "create_ticket"]
    assert answer.status == "error" and "not now" in str(answer.content)
    assert out.interrupts == ()


def test_bad_answer_is_asked_again_and_runs_nothing(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir
) -> None:
    """A malformed answer is refused by asking again with the error, as in effectgate's graph."""
    graph, ledger = agent
    start(graph)
    out = graph.invoke(Command(resume={"decisions": []}), CONFIG, version="v2")
    (pending,) = out.interrupts
    assert "0 decision(s) for 1 pending call(s)" in pending.value["error"]
    assert world(state_dir).tickets == 0 and ledger.list(thread_id="t1") == []


def test_fork_from_before_the_writes_repeats_none(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replaying the thread from a checkpoint before its tool node reuses the stored receipts."""
    graph, _ = agent
    out = start(graph)
    while out.interrupts:
        (pending,) = out.interrupts
        decisions = [{"type": "approve"} for _ in pending.value["action_requests"]]
        out = graph.invoke(Command(resume={"decisions": decisions}), CONFIG, version="v2")
    assert (world(state_dir).tickets, world(state_dir).mails) == (1, 1)
    before_tools = [
        s
        for s in graph.get_state_history(CONFIG)
        if s.next == ("tools", "tools") and not s.interrupts
    ]
    assert before_tools, "no checkpoint before the mail and note ran"
    dispatched: list[str] = []
    original = Dispatcher.dispatch

    def counting(self: Dispatcher, call: Any) -> Any:
        dispatched.append(call.tool)
        return original(self, call)

    monkeypatch.setattr(Dispatcher, "dispatch", counting)
    fork = graph.invoke(None, before_tools[0].config, version="v2")
    assert fork.interrupts == ()
    assert sorted(dispatched) == ["send_email", "write_file"]  # the fork did run the tool node
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
    assert all_checkpoint_problems(state_dir.checkpoints, "t1") == []


def _approve_all_async(services: DemoServices, state_dir: StateDir, *, guard: Any) -> None:
    """Run the incident with ``ainvoke``, approving every review, inside ``guard``; count."""
    import asyncio

    from langgraph.checkpoint.memory import InMemorySaver

    with SqliteLedger(state_dir.ledger) as ledger:
        graph = middleware_agent(
            make_model("scripted:incident"),
            default_tools(state_dir.workspace, services.endpoints),
            ledger=ledger,
            checkpointer=InMemorySaver(),
        )

        async def run() -> Any:
            with guard:
                out = await graph.ainvoke({"messages": [HumanMessage("go")]}, CONFIG, version="v2")
                while out.interrupts:
                    (pending,) = out.interrupts
                    count = len(pending.value["action_requests"])
                    answer = {"decisions": [{"type": "approve"}] * count}
                    out = await graph.ainvoke(Command(resume=answer), CONFIG, version="v2")
            return out

        asyncio.run(run())
        w = world(state_dir)
        assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
        assert {op.state for op in ledger.list(thread_id="t1")} == {OpState.SUCCEEDED}


def test_async_run_dispatches_through_the_ledger(
    services: DemoServices, state_dir: StateDir
) -> None:
    """``ainvoke`` takes the same path: one review per turn, each write once, receipts stored."""
    import contextlib

    _approve_all_async(services, state_dir, guard=contextlib.nullcontext())


def test_async_run_never_blocks_the_event_loop(services: DemoServices, state_dir: StateDir) -> None:
    """The async hooks run the ledger and the tools off the event loop.

    Under ``blockbuster`` (what ``langgraph dev`` turns on), a blocking call
    on the loop raises ``BlockingError``. Before, the async hooks called the
    ledger and the tools' HTTP and SMTP I/O on the loop, so a plain
    ``langgraph dev`` failed unless started with ``--allow-blocking``.
    """
    from blockbuster import blockbuster_ctx

    _approve_all_async(services, state_dir, guard=blockbuster_ctx())


def test_respond_is_a_reject_with_the_persons_text_marked_not_executed(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir
) -> None:
    """HITL's ``respond``: nothing runs, REJECTED in the ledger, the model reads executed: false."""
    import json

    graph, ledger = agent
    (_pending,) = start(graph).interrupts
    answer = {"decisions": [{"type": "respond", "message": "A ticket exists already: OPS-7."}]}
    graph.invoke(Command(resume=answer), CONFIG, version="v2")
    (op,) = [o for o in ledger.list(thread_id="t1") if o.tool == "create_ticket"]
    assert op.state is OpState.REJECTED
    assert read_tickets(state_dir.services) == []
    messages = graph.get_state(CONFIG).values["messages"]
    (reply,) = [m for m in messages if isinstance(m, ToolMessage) and m.name == "create_ticket"]
    payload = json.loads(str(reply.content))
    assert payload["status"] == "responded" and payload["executed"] is False
    assert payload["message"] == "A ticket exists already: OPS-7."


def test_a_follow_up_after_a_rollback_answers_a_finished_effect_from_the_ledger(
    agent: tuple[Any, SqliteLedger], state_dir: StateDir
) -> None:
    """The checkpoint lost the call's answer, the ledger kept it: the follow-up uses the ledger.

    A double-text with ``multitask_strategy="rollback"`` (or ``"interrupt"``)
    while an approved effect runs leaves the thread at the review checkpoint
    with the ticket created and the operation SUCCEEDED. Before, every later
    message raised FollowUpError naming the SUCCEEDED operation and nothing
    was left to answer: the thread was wedged. Reproduced here by sending the
    follow-up from the review's checkpoint after the effect ran.
    """
    import json

    graph, ledger = agent
    start(graph)
    at_review = graph.get_state(CONFIG).config  # the checkpoint a rollback returns to
    graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CONFIG, version="v2")
    (ticket_op,) = [o for o in ledger.list(thread_id="t1") if o.tool == "create_ticket"]
    assert ticket_op.state is OpState.SUCCEEDED

    graph.invoke({"messages": [HumanMessage("and page the on-call")]}, at_review, version="v2")
    messages = graph.get_state(CONFIG).values["messages"]
    (reply,) = [
        m
        for m in messages
        if isinstance(m, ToolMessage) and m.tool_call_id == ticket_op.tool_call_id
    ]
    payload = json.loads(str(reply.content))
    assert payload["status"] == "succeeded" and payload["reused"] is True, payload
    assert payload["reference"] == "TICKET-1"
    assert len(read_tickets(state_dir.services)) == 1  # answered from the ledger, not run again
