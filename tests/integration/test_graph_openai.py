"""The whole graph driven by ChatOpenAI over real HTTP, against a local OpenAI-compatible server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from langchain_core.messages import AIMessage, ToolMessage
from tests.answers._bind import bound

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.graph import Agent, RunStatus
from effectgate.ledger import OpState
from effectgate.models import make_model
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply, error_reply
from effectgate.testing.oracle import checkpoint_problems, world


@contextmanager
def _agent(
    sd: StateDir, svc: DemoServices, server: FakeOpenAIServer, *, retries: int
) -> Iterator[Agent]:
    model = make_model(
        "openai:test-model", base_url=server.base_url, api_key="test", max_retries=retries
    )
    with open_agent(sd, model=model, endpoints=svc.endpoints) as agent:
        yield agent


def test_openai_model_drives_review_and_effect(services: DemoServices, state_dir: StateDir) -> None:
    """Tool calls parsed from real HTTP go through review and the ledger; the history the
    server receives on the second call pairs every tool call with its answer."""
    replies = [
        chat_reply(
            tool_calls=[
                {
                    "name": "write_file",
                    "id": "call_w1",
                    "arguments": {"path": "a.txt", "content": "hello"},
                }
            ]
        ),
        chat_reply("written"),
    ]
    with FakeOpenAIServer(replies) as server:
        with _agent(state_dir, services, server, retries=0) as agent:
            ledger = agent.ledger
            result = agent.start("write a file", thread_id="t1")
            assert result.status is RunStatus.WAITING_REVIEW
            result = agent.resume(
                "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
            )
            assert result.status is RunStatus.DONE and result.final_message == "written"
            (op,) = ledger.list(thread_id="t1")
            assert (op.operation_id, op.state) == ("t1:call_w1", OpState.SUCCEEDED)
        second = server.requests[1]["messages"]
        assistant = next(m for m in second if m["role"] == "assistant")
        tool = next(m for m in second if m["role"] == "tool")
        assert assistant["tool_calls"][0]["id"] == tool["tool_call_id"] == "call_w1"
        assert json.loads(tool["content"])["status"] == "succeeded"
    assert world(state_dir).files == {"a.txt": b"hello"}


def test_model_error_leaves_thread_resumable(services: DemoServices, state_dir: StateDir) -> None:
    """A 500 with retries off stops the run; the thread resumes and finishes with no lost call."""
    replies = [
        chat_reply(
            tool_calls=[
                {
                    "name": "write_file",
                    "id": "call_w1",
                    "arguments": {"path": "a.txt", "content": "x"},
                }
            ]
        ),
        error_reply(500),
        chat_reply("done"),
    ]
    with FakeOpenAIServer(replies) as server:
        with _agent(state_dir, services, server, retries=0) as agent:
            ledger = agent.ledger
            result = agent.start("go", thread_id="t1")
            result = agent.resume(
                "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
            )
            assert result.status is RunStatus.INCOMPLETE  # the step failed, the thread is kept
            assert result.error is not None and "500" in result.error
            result = agent.resume("t1")
            assert result.status is RunStatus.DONE and result.final_message == "done"
            (op,) = ledger.list(thread_id="t1")
            assert op.attempt == 1
        assert len(server.requests) == 3
    assert checkpoint_problems(state_dir.checkpoints, "t1") == []


def test_tool_call_without_id_and_bad_json_are_answered(
    services: DemoServices, state_dir: StateDir
) -> None:
    """A response with an id-less call and unparsable arguments yields a valid history."""
    replies = [
        chat_reply(
            tool_calls=[
                {"name": "write_file", "id": None, "arguments": {"path": "b.txt", "content": "y"}},
                {"name": "write_file", "id": "call_bad", "arguments": "{oops"},
            ]
        ),
        chat_reply("ok"),
    ]
    with FakeOpenAIServer(replies) as server:
        with _agent(state_dir, services, server, retries=0) as agent:
            result = agent.start("go", thread_id="t1")
            assert result.status is RunStatus.WAITING_REVIEW
            result = agent.resume(
                "t1", decisions=bound(agent, "t1", {"decisions": [{"type": "approve"}]})
            )
            assert result.status is RunStatus.DONE
            msgs = agent.messages("t1")
            ai = next(
                m
                for m in msgs
                if isinstance(m, AIMessage) and (m.tool_calls or m.invalid_tool_calls)
            )
            answered = {m.tool_call_id for m in msgs if isinstance(m, ToolMessage)}
            ids = {c["id"] for c in ai.tool_calls} | {c["id"] for c in ai.invalid_tool_calls}
            assert answered == ids and len(ids) == 2
        second = server.requests[1]["messages"]
        assistant = next(m for m in second if m["role"] == "assistant")
        assert all(tc["id"] for tc in assistant["tool_calls"])
    assert world(state_dir).files == {"b.txt": b"y"}
