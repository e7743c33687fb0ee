"""A follow-up sent as new input while a reconciliation verdict waits (the served path).

A LangGraph client (``langgraph dev``, or ``graph.invoke`` on a thread at an
interrupt) that sends a new message writes it into the state and drops the
pending interrupt. A call that may have started cannot be closed by the
message. Before, the agent node refused it with ``FollowUpError`` on every
later run: the thread was wedged, its verdict could never be given (break
test of issue #33). Now the node writes nothing, the open call goes back
through the review to its effect node, which asks the verdict again; the
message is answered once the verdict is in, with the call's answer moved
before it. Driven on the compiled graph itself, as the server drives it; the
assertions read the mail sink's own rows and the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.demo import DemoServices
from effectgate.graph import Policy, build_agent
from effectgate.ledger import OpState
from effectgate.models import make_model

TASK = "Check the order service and handle any incident."
EFFECTS = frozenset({"create_ticket", "send_email", "write_file"})


def _mail_fails_graph(sd: StateDir, svc: DemoServices, ledger: Any) -> Any:
    """The incident graph, every effect auto-approved, whose mail arrives while its
    reply and its lookup fail (so it parks at a reconciliation), run as a server runs it."""
    svc.set_error_rate("orders", 0.12)
    svc.set_fault("mail", "timeout-after-commit", lookups="unavailable", delay_s=8)
    return build_agent(
        make_model("scripted:incident"),
        default_tools(sd.workspace, svc.endpoints),
        ledger=ledger,
        checkpointer=InMemorySaver(),
        policy=Policy(auto_approve=EFFECTS),
    ).graph


def _interrupts(graph: object, cfg: dict[str, object]) -> list[object]:
    state = graph.get_state(cfg)  # type: ignore[attr-defined]
    return [i for task in state.tasks for i in task.interrupts]


def test_a_follow_up_while_a_verdict_waits_is_answered_after_the_verdict(tmp_path: Path) -> None:
    sd = StateDir.open(tmp_path / "state")
    with DemoServices(sd.services) as svc, sd.open_ledger() as ledger:
        graph = _mail_fails_graph(sd, svc, ledger)
        cfg: dict[str, object] = {"configurable": {"thread_id": "f1"}}
        graph.invoke({"messages": [HumanMessage(TASK)]}, cfg)
        (asked,) = _interrupts(graph, cfg)
        assert asked.value["type"] == "reconciliation"  # type: ignore[attr-defined]
        op_id = asked.value["operation_id"]  # type: ignore[attr-defined]
        assert ledger.get(op_id).state is OpState.NEEDS_RECONCILIATION  # type: ignore[union-attr]
        assert len(svc.mails()) == 1  # it did arrive; the lookup could not say so

        # the follow-up, as a client's new input: it drops the interrupt
        graph.invoke({"messages": [HumanMessage("Also, what is the ticket id?")]}, cfg)
        (again,) = _interrupts(graph, cfg)  # asked again, not wedged
        assert again.value["type"] == "reconciliation"  # type: ignore[attr-defined]
        assert again.value["operation_id"] == op_id  # type: ignore[attr-defined]
        assert ledger.get(op_id).state is OpState.NEEDS_RECONCILIATION  # type: ignore[union-attr]

        svc.set_fault("mail", "normal")
        (mail,) = svc.mails()
        verdict = {
            "verdict": "succeeded",
            "attempt": again.value["attempt"],  # type: ignore[attr-defined]
            "reference": mail["message_id"],
            "evidence": "seen in the mail sink",
            "reviewer": "test",
        }
        graph.invoke(Command(resume={again.id: verdict}), cfg)  # type: ignore[attr-defined]
        # the model answered the follow-up (the scripted model starts its
        # script again: a new mail proposal waits for its own review)
        assert all(i.value["type"] == "review" for i in _interrupts(graph, cfg))  # type: ignore[attr-defined]
        messages = graph.get_state(cfg).values["messages"]
        follow = [i for i, m in enumerate(messages) if m.content == "Also, what is the ticket id?"]
        assert len(follow) == 1 and isinstance(messages[follow[0] + 1], AIMessage)
        # before the follow-up, every call is answered right after its AI message
        for i, m in enumerate(messages[: follow[0]]):
            if isinstance(m, AIMessage) and m.tool_calls:
                ids = {c["id"] for c in m.tool_calls}
                after = messages[i + 1 : i + 1 + len(ids)]
                assert all(isinstance(t, ToolMessage) for t in after), messages
                assert {t.tool_call_id for t in after} == ids
        assert ledger.get(op_id).state is OpState.SUCCEEDED  # type: ignore[union-attr]
    assert len(svc.mails()) == 1  # one mail, never sent again


def test_mark_as_resolved_at_a_reconciliation_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """``Command(goto="__end__")`` closes a review; at a reconciliation LangGraph
    dropped it and asked the same question again while the client was told the
    run succeeded (break test). The served graph (``guard_resumes``) refuses it
    before the run: the same interrupt waits, the ledger is unchanged."""
    import pytest
    from langgraph.graph import END

    from effectgate.errors import UnknownInterruptError
    from effectgate.graph import guard_resumes

    sd = StateDir.open(tmp_path / "state")
    with DemoServices(sd.services) as svc, sd.open_ledger() as ledger:
        graph = guard_resumes(_mail_fails_graph(sd, svc, ledger))
        cfg: dict[str, object] = {"configurable": {"thread_id": "g1"}}
        graph.invoke({"messages": [HumanMessage(TASK)]}, cfg)
        (asked,) = _interrupts(graph, cfg)
        head = graph.get_state(cfg).config
        with pytest.raises(UnknownInterruptError, match="no review waits here"):
            graph.invoke(Command(goto=END), cfg)
        (still,) = _interrupts(graph, cfg)
        assert still.id == asked.id  # type: ignore[attr-defined]
        assert graph.get_state(cfg).config == head  # nothing written
        op = ledger.get(asked.value["operation_id"])  # type: ignore[attr-defined]
        assert op is not None and op.state is OpState.NEEDS_RECONCILIATION
