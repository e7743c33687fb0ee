"""The async API (``astart``, ``aresume``, ``areplay``, ``astatus``): the sync guarantees.

The crash tests drive a worker process through either API
(``tests/crash/test_graph_crash.py``, parametrized by ``api``); the saver's
durability rules are checked on LangGraph's async path in
``tests/unit/test_saver.py``. Here: one agent running many threads at once
from one event loop, each effect exactly once; cancellation stopping one run
at a step boundary while the others go on.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel

from effectgate import StateDir, open_agent
from effectgate.graph import Policy, RunStatus
from effectgate.ledger import OpState
from effectgate.testing.oracle import checkpoint_problems
from effectgate.tools import EffectKind, ToolResult, ToolSpec


class EchoModel(BaseChatModel):
    """Calls ``record(text=<the human message>)`` once, then answers "done"."""

    @property
    def _llm_type(self) -> str:
        return "echo"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> EchoModel:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            text = str(last.content)
            call_id = "call_" + hashlib.sha256(text.encode()).hexdigest()[:12]
            reply = AIMessage(
                content="", tool_calls=[{"name": "record", "args": {"text": text}, "id": call_id}]
            )
        else:
            reply = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=reply)])


class RecordArgs(BaseModel):
    text: str
    pause_s: float = 0.0


class Rows:
    """The external system: rows keyed by idempotency key, and every call made."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, str] = {}
        self.calls: list[str] = []

    def spec(self, pause_s: float = 0.0) -> ToolSpec:
        def record(args: RecordArgs, ctx: Any) -> ToolResult:
            time.sleep(pause_s)
            with self.lock:
                self.calls.append(ctx.operation_id)
                self.rows[ctx.operation_id] = args.text
            return ToolResult(value={"recorded": args.text})

        return ToolSpec(
            name="record",
            description="Record a line.",
            args_schema=RecordArgs,
            func=record,
            kind=EffectKind.IDEMPOTENT,
            requires_approval=False,
        )


def test_many_threads_at_once_from_one_event_loop(state_dir: StateDir) -> None:
    rows = Rows()
    n = 16
    with open_agent(
        state_dir, model=EchoModel(), tools=[rows.spec(0.05)], policy=Policy(approval_ttl=None)
    ) as agent:

        async def main() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(agent.astart(f"item {i}", thread_id=f"t{i}") for i in range(n))
                )
            )

        results = asyncio.run(main())
        assert [r.status for r in results] == [RunStatus.DONE] * n, [r.error for r in results]
        statuses = asyncio.run(agent.astatus("t3"))
        assert statuses.status is RunStatus.DONE
        ops = agent.ledger.list()
    assert sorted(rows.rows.values()) == sorted(f"item {i}" for i in range(n))
    assert len(rows.calls) == n  # each effect once
    assert {(op.state, op.attempt) for op in ops} == {(OpState.SUCCEEDED, 1)}
    for i in range(n):
        assert checkpoint_problems(state_dir.checkpoints, f"t{i}") == []


def test_cancelling_one_run_stops_it_at_a_step_boundary_and_leaves_the_others(
    state_dir: StateDir,
) -> None:
    rows = Rows()
    with open_agent(
        state_dir, model=EchoModel(), tools=[rows.spec(0.5)], policy=Policy(approval_ttl=None)
    ) as agent:

        async def main() -> Any:
            slow = asyncio.ensure_future(agent.astart("cancelled", thread_id="c"))
            other = asyncio.ensure_future(agent.astart("kept", thread_id="k"))
            await asyncio.sleep(0.2)  # both are inside their effect's 0.5 s call
            slow.cancel()
            try:
                await slow
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("the cancelled run returned")
            return await other

        kept = asyncio.run(main())
        assert kept.status is RunStatus.DONE
        stopped = agent.status("c")
        # The effect under way finished and was recorded; the run stopped before the model.
        assert stopped.status is RunStatus.INCOMPLETE
        assert [op.state for op in stopped.operations] == [OpState.SUCCEEDED]
        # ... and its step's checkpoint holds the ToolMessage: the resume asks the model.
        (answer,) = [m for m in agent.messages("c") if isinstance(m, ToolMessage)]
        assert '"recorded": "cancelled"' in str(answer.content)
        resumed = agent.resume("c")
        assert resumed.status is RunStatus.DONE
        assert [m.content for m in agent.messages("c") if isinstance(m, ToolMessage)] == [
            answer.content
        ]
    assert sorted(rows.calls) == sorted(rows.rows)  # each effect once
    assert sorted(rows.rows.values()) == ["cancelled", "kept"]


def test_astream_yields_each_update_then_the_result(state_dir: StateDir) -> None:
    rows = Rows()
    reviewed = ToolSpec(
        name="record",
        description="Record a line.",
        args_schema=RecordArgs,
        func=rows.spec().func,
        kind=EffectKind.IDEMPOTENT,
    )
    with open_agent(
        state_dir, model=EchoModel(), tools=[reviewed], policy=Policy(approval_ttl=None)
    ) as agent:

        async def collect(**kwargs: Any) -> list[tuple[str, Any]]:
            return [item async for item in agent.astream("s", **kwargs)]

        first = asyncio.run(collect(task="streamed"))
        kinds = [k for k, _ in first]
        assert kinds[-1] == "result" and set(kinds[:-1]) == {"updates"}
        nodes = [next(iter(chunk)) for _, chunk in first[:-1]]
        assert nodes[0] == "agent" and nodes[-1] == "__interrupt__"
        result = first[-1][1]
        assert result.status is RunStatus.WAITING_REVIEW
        assert rows.calls == []  # nothing ran before the review
        (pending,) = result.interrupts
        answer = {"decisions": [{"type": "approve"}], "interrupt_id": pending.id}
        second = asyncio.run(collect(decisions=answer))
        nodes = [next(iter(chunk)) for kind, chunk in second if kind == "updates"]
        assert nodes[:2] == ["review", "effect.record"]
        assert second[-1][1].status is RunStatus.DONE
    assert list(rows.rows.values()) == ["streamed"]
