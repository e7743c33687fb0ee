"""Models that reuse tool-call ids (``call_0`` in every response) lose no action.

The default operation id is ``{thread_id}:{tool_call_id}``; a reused call id
would otherwise alias a new action onto a finished operation (replayed, never
sent) or onto one bound to other arguments (a conflict nobody can approve).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel
from tests.answers._bind import bound
from tests.integration._approvals import record_approval

from effectgate import StateDir, open_agent
from effectgate.graph import Agent, Policy, RunResult, RunStatus, history_problems
from effectgate.graph._nodes import make_agent_node
from effectgate.ledger import OpState, SqliteLedger
from effectgate.models import ScriptedChatModel, make_model
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply
from effectgate.testing.oracle import checkpoint_problems
from effectgate.tools import EffectKind, ToolContext, ToolResult, ToolSpec


class MailArgs(BaseModel):
    to: str
    body: str


Sent = list[dict[str, str]]


def _mail_tool(sent: Sent) -> ToolSpec:
    """A mail tool whose outbox is ``sent``: one entry per real delivery."""

    def send(args: MailArgs, ctx: ToolContext) -> ToolResult:
        sent.append({"to": args.to, "body": args.body, "operation_id": ctx.operation_id})
        return ToolResult(value={"delivered_to": args.to}, reference=f"mail-{len(sent)}")

    return ToolSpec(
        name="send_email",
        description="Send an email.",
        args_schema=MailArgs,
        func=send,
        kind=EffectKind.KEYED,
    )


def _call(args: dict[str, str], call_id: str = "call_1") -> dict[str, Any]:
    return {"name": "send_email", "args": args, "id": call_id}


HI = {"to": "alice@x", "body": "hi"}
BYE = {"to": "alice@x", "body": "bye"}
REUSED_ACROSS_TURNS = {
    "name": "reused-across-turns",
    "turns": [
        {"say": "first", "tool_calls": [_call(HI)]},
        {"say": "again", "tool_calls": [_call(HI)]},
        {"say": "other", "tool_calls": [_call(BYE)]},
    ],
    "final": "All sent.",
}


@contextmanager
def _agent(sd: StateDir, script: dict[str, Any], sent: Sent) -> Iterator[Agent]:
    model = ScriptedChatModel.from_script(script)
    with open_agent(
        sd, model=model, tools=[_mail_tool(sent)], policy=Policy(approval_ttl=None)
    ) as agent:
        yield agent


def _approve_all(agent: Agent, result: RunResult, thread: str = "t1") -> list[dict[str, Any]]:
    """Approve every review until the run ends; return the actions that were reviewed."""
    reviewed: list[dict[str, Any]] = []
    while result.status is RunStatus.WAITING_REVIEW:
        actions = result.interrupts[0].value["action_requests"]
        for action in actions:
            assert action["conflict"] is None, action  # approvable, not bound elsewhere
        reviewed += actions
        result = agent.resume(
            thread,
            decisions=bound(agent, thread, {"decisions": [{"type": "approve"}] * len(actions)}),
        )
    assert result.status is RunStatus.DONE, result
    return reviewed


def _call_ids(messages: list[AnyMessage]) -> list[str]:
    return [
        str(tc["id"])
        for m in messages
        if isinstance(m, AIMessage)
        for tc in [*m.tool_calls, *m.invalid_tool_calls]
    ]


def _assert_paired(messages: list[AnyMessage]) -> None:
    """Every tool-call id is unique in the thread and answered by exactly one ToolMessage."""
    ids = _call_ids(messages)
    answers = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert len(set(ids)) == len(ids), ids
    assert sorted(answers) == sorted(ids), (ids, answers)
    assert history_problems(messages, allow_pending=False) == []


def test_reused_id_across_turns_reviews_and_runs_every_call(state_dir: StateDir) -> None:
    """Three turns calling with ``call_1``: three reviews, three deliveries, three operations."""
    sent: Sent = []
    with _agent(state_dir, REUSED_ACROSS_TURNS, sent) as agent:
        reviewed = _approve_all(agent, agent.start("mail alice", thread_id="t1"))
        assert [a["args"]["body"] for a in reviewed] == ["hi", "hi", "bye"]
        assert [a["tool_call_id"] for a in reviewed] == ["call_1", "call_1~2", "call_1~3"]
        # the second "hi" is a new action that looks like the first: flagged, still asked
        assert reviewed[1]["possible_duplicate_of"] == "t1:call_1"
        ops = agent.ledger.list(thread_id="t1")
        messages = agent.messages("t1")
    assert [(m["body"], m["operation_id"]) for m in sent] == [
        ("hi", "t1:call_1"),
        ("hi", "t1:call_1~2"),
        ("bye", "t1:call_1~3"),
    ]
    assert sorted(op.operation_id for op in ops) == ["t1:call_1", "t1:call_1~2", "t1:call_1~3"]
    assert all(op.state is OpState.SUCCEEDED and op.attempt == 1 for op in ops)
    _assert_paired(messages)
    answers = [json.loads(str(m.content)) for m in messages if isinstance(m, ToolMessage)]
    assert [a["reused"] for a in answers] == [False, False, False]
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


@pytest.mark.parametrize("second", [HI, BYE], ids=["same-args", "other-args"])
def test_reused_id_within_one_message_reviews_and_runs_both(
    state_dir: StateDir, second: dict[str, str]
) -> None:
    """Two calls sharing an id in one message: both are reviewed and both run."""
    script = {
        "name": "reused-in-message",
        "turns": [{"tool_calls": [_call(HI), _call(second)]}],
    }
    sent: Sent = []
    with _agent(state_dir, script, sent) as agent:
        reviewed = _approve_all(agent, agent.start("mail alice twice", thread_id="t1"))
        assert [a["tool_call_id"] for a in reviewed] == ["call_1", "call_1~2"]
        messages = agent.messages("t1")
    assert sorted((m["body"], m["operation_id"]) for m in sent) == sorted(
        [("hi", "t1:call_1"), (second["body"], "t1:call_1~2")]
    )
    _assert_paired(messages)
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_unique_ids_kept_and_replay_keeps_renamed_ids(state_dir: StateDir) -> None:
    """Unique ids pass unchanged; replaying from any checkpoint renames alike and sends nothing."""
    script = {
        "name": "mixed",
        "turns": [
            {"tool_calls": [_call(HI), _call(BYE, "functions.send_email:1")]},
            {"tool_calls": [_call({"to": "bob@x", "body": "yo"}, "call_unique"), _call(BYE)]},
        ],
    }
    sent: Sent = []
    with _agent(state_dir, script, sent) as agent:
        _approve_all(agent, agent.start("mail people", thread_id="t1"))
        before_ids = _call_ids(agent.messages("t1"))
        before_ops = sorted(op.operation_id for op in agent.ledger.list(thread_id="t1"))
        assert before_ids == ["call_1", "functions.send_email:1", "call_unique", "call_1~2"]
        assert len(sent) == 4
        config = {"configurable": {"thread_id": "t1"}}
        checkpoints = [
            s.config["configurable"]["checkpoint_id"] for s in agent.graph.get_state_history(config)
        ]
        for cid in checkpoints:
            reviewed = _approve_all(agent, agent.replay("t1", cid))
            assert reviewed == [], cid  # every call maps onto its settled operation
            assert _call_ids(agent.messages("t1")) == before_ids, cid
        after_ops = sorted(op.operation_id for op in agent.ledger.list(thread_id="t1"))
    assert after_ops == before_ops
    assert len(sent) == 4  # no effect repeated by any replay
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_openai_server_numbering_calls_per_message_gets_a_valid_history(
    state_dir: StateDir,
) -> None:
    """Over real HTTP, a server answering ``call_0`` every time gets unique, paired ids back."""
    replies = [
        chat_reply(tool_calls=[{"name": "send_email", "id": "call_0", "arguments": HI}]),
        chat_reply(tool_calls=[{"name": "send_email", "id": "call_0", "arguments": HI}]),
        chat_reply("sent twice"),
    ]
    sent: Sent = []
    with FakeOpenAIServer(replies) as server:
        model = make_model(
            "openai:test-model", base_url=server.base_url, api_key="test", max_retries=0
        )
        with open_agent(
            state_dir, model=model, tools=[_mail_tool(sent)], policy=Policy(approval_ttl=None)
        ) as agent:
            reviewed = _approve_all(agent, agent.start("mail alice twice", thread_id="t1"))
            assert [a["tool_call_id"] for a in reviewed] == ["call_0", "call_0~2"]
            _assert_paired(agent.messages("t1"))
        last = server.requests[-1]["messages"]
    assert [m["operation_id"] for m in sent] == ["t1:call_0", "t1:call_0~2"]
    asked = [tc["id"] for m in last if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert asked == answered == ["call_0", "call_0~2"]


class _OneReply(BaseChatModel):
    """Answers every prompt with one fixed message (as a client that keeps the raw form)."""

    reply: AIMessage

    @property
    def _llm_type(self) -> str:
        return "one-reply"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        return ChatResult(generations=[ChatGeneration(message=self.reply)])


def _raw(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_agent_node_renames_parsed_and_invalid_calls_and_drops_the_raw_copy(
    tmp_path: Path,
) -> None:
    """Valid and invalid calls get fresh ids; the provider's raw copy of the calls is
    dropped (as for calls given ids by ``with_call_ids``), so no stale id is sent back."""
    earlier: list[AnyMessage] = [
        HumanMessage("mail alice"),
        AIMessage("", id="ai-1", tool_calls=[{"name": "send_email", "args": HI, "id": "c0"}]),
        ToolMessage("{}", tool_call_id="c0", name="send_email"),
    ]
    raw = [
        _raw("c0", "send_email", "{not json"),
        _raw("c0", "send_email", json.dumps(BYE)),
        _raw("fresh", "send_email", json.dumps(HI)),
    ]
    reply = AIMessage(
        "",
        id="ai-2",
        tool_calls=[
            {"name": "send_email", "args": BYE, "id": "c0"},
            {"name": "send_email", "args": HI, "id": "fresh"},
        ],
        invalid_tool_calls=[
            {"name": "send_email", "args": "{not json", "id": "c0", "error": "bad JSON"}
        ],
        additional_kwargs={"tool_calls": raw, "refusal": None},
    )
    spec = _mail_tool([])
    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        node = make_agent_node(
            _OneReply(reply=reply), {spec.name: spec}, None, ledger=ledger, clock=ledger.clock
        )
        (out,) = node({"messages": earlier}, {"configurable": {"thread_id": "t"}})["messages"]
    assert out.id == "ai-2"
    assert [tc["id"] for tc in out.tool_calls] == ["c0~2", "fresh"]
    assert [tc["id"] for tc in out.invalid_tool_calls] == ["c0~3"]
    assert "tool_calls" not in out.additional_kwargs
    assert out.additional_kwargs == {"refusal": None}
    assert history_problems([*earlier, out]) == []


def test_an_approved_same_intent_call_in_another_thread_is_a_possible_duplicate(
    state_dir: StateDir,
) -> None:
    """Two runs of one task at once: the second sees the first's approved (not yet
    finished) operation and flags it, so no policy or blanket approval passes it."""
    sent: Sent = []
    script = {"name": "one", "turns": [{"say": "x", "tool_calls": [_call(HI)]}], "final": "ok"}
    with _agent(state_dir, script, sent) as agent:
        first = agent.start("mail alice", thread_id="a")
        (req,) = first.interrupts[0].value["action_requests"]
        # Record thread a's approval only (its effect has not run yet): APPROVED.
        record_approval(agent.ledger, req, thread_id="a", tool="send_email", reviewer="t")
        assert agent.ledger.get(req["operation_id"]).state is OpState.APPROVED  # type: ignore[union-attr]
        second = agent.start("mail alice", thread_id="b")
        (dup,) = second.interrupts[0].value["action_requests"]
        assert dup["possible_duplicate_of"] == req["operation_id"]
        # a's review is decided (its approval is recorded): resuming runs it
        assert agent.resume("a").status is RunStatus.DONE
    assert len(sent) == 1
