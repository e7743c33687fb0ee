"""The messages channel snapshots by bytes: a thread of large messages stores O(history).

LangGraph's ``DeltaChannel`` snapshots every 100 updates, so the snapshots of
a long thread of large messages add up to O(updates^2 x message size). These
tests run a loop of 1,000 message updates through effectgate's channel and
check what the checkpointer stored: all the snapshots together stay within
``(1 + GROWTH) / GROWTH`` times the final history, a read replays at most
``GROWTH`` times its snapshot, and every checkpoint still reads back as a
prefix of the final history.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph

from effectgate.graph import AgentState
from effectgate.graph._state import SizedDeltaChannel, approx_bytes

UPDATES = 1_000
SIZE = 2_000


def _node(state: AgentState) -> dict[str, Any]:
    n = len(state["messages"])
    return {"messages": [AIMessage(content=f"{n:06d}" + "m" * SIZE, id=f"m{n}")]}


def _more(state: AgentState) -> str:
    return "n" if len(state["messages"]) <= UPDATES else END


@pytest.fixture(scope="module")
def thread() -> tuple[Any, InMemorySaver]:
    """One thread of ``UPDATES`` messages of ``SIZE`` bytes, one per superstep."""
    saver = InMemorySaver()
    graph = (
        StateGraph(AgentState)
        .add_node("n", _node)
        .add_edge(START, "n")
        .add_conditional_edges("n", _more)
        .compile(checkpointer=saver)
    )
    cfg: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": UPDATES + 10}
    graph.invoke({"messages": [HumanMessage(content="go", id="h")]}, cfg, durability="sync")
    return graph, saver


def test_snapshots_add_up_to_a_constant_times_the_history(
    thread: tuple[Any, InMemorySaver],
) -> None:
    """All snapshots stored hold at most (1 + GROWTH) / GROWTH histories, plus the floor."""
    graph, saver = thread
    cfg: Any = {"configurable": {"thread_id": "t"}}
    final = graph.get_state(cfg).values["messages"]
    assert len(final) == UPDATES + 1
    history = approx_bytes(final)
    snaps = [
        t.checkpoint["channel_values"]["messages"]
        for t in saver.list(cfg)
        if isinstance(t.checkpoint["channel_values"].get("messages"), _DeltaSnapshot)
    ]
    stored = sum(approx_bytes(s.value) for s in snaps)
    g = SizedDeltaChannel.GROWTH
    # With a snapshot every 100 updates this is about 5.5 histories.
    assert stored <= (1 + g) / g * history + SizedDeltaChannel.MIN_BYTES + 2 * SIZE
    assert 5 <= len(snaps) <= 25


def test_every_checkpoint_reads_back_and_replays_a_bounded_tail(
    thread: tuple[Any, InMemorySaver],
) -> None:
    """Sampled checkpoints are prefixes of the final history; a read replays <= GROWTH x seed."""
    graph, saver = thread
    cfg: Any = {"configurable": {"thread_id": "t"}}
    latest = [m.id for m in graph.get_state(cfg).values["messages"]]
    for tup in list(saver.list(cfg))[::97]:
        snap = graph.get_state(tup.config)
        got = [m.id for m in snap.values.get("messages", [])]
        assert got == latest[: len(got)]
        hist = saver.get_delta_channel_history(config=snap.config, channels=["messages"])
        if "messages" not in hist:
            continue  # the checkpoint holds its own snapshot
        seed = hist["messages"].get("seed")
        seed_bytes = approx_bytes(seed.value) if isinstance(seed, _DeltaSnapshot) else 0
        replayed = sum(approx_bytes(w[2]) for w in hist["messages"]["writes"])
        limit = max(SizedDeltaChannel.MIN_BYTES, SizedDeltaChannel.GROWTH * seed_bytes)
        assert replayed <= limit + SIZE + 200


def test_the_channel_is_the_one_langgraph_compiles() -> None:
    """The compiled graph keeps the byte-counting channel (LangGraph rebuilds annotated ones)."""
    graph = StateGraph(AgentState).add_node("n", _node).add_edge(START, "n").compile()
    assert isinstance(graph.channels["messages"], SizedDeltaChannel)


def _one_step(state: AgentState) -> dict[str, Any]:
    n = len(state["messages"])
    return {"messages": [AIMessage(content="a" * SIZE, id=f"a{n}")]}


def test_runs_of_one_step_each_still_snapshot_on_time() -> None:
    """One invoke per message, as effectgate resumes once per call: the bound holds.

    Each invoke loads the channel (seed plus replayed writes), runs two
    supersteps and stops; a channel that asks for a snapshot at load time
    must still get it at the next checkpoint, not forget it on its first write.
    """
    saver = InMemorySaver()
    graph = (
        StateGraph(AgentState)
        .add_node("n", _one_step)
        .add_edge(START, "n")
        .compile(checkpointer=saver)
    )
    cfg: Any = {"configurable": {"thread_id": "r"}}
    for k in range(150):
        msg = HumanMessage(content="h" * SIZE, id=f"h{k}")
        graph.invoke({"messages": [msg]}, cfg, durability="sync")
    latest = saver.get_tuple(cfg)
    assert latest is not None
    hist = saver.get_delta_channel_history(config=latest.config, channels=["messages"])
    seed = hist["messages"].get("seed") if "messages" in hist else None
    seed_bytes = approx_bytes(seed.value) if isinstance(seed, _DeltaSnapshot) else 0
    replayed = sum(approx_bytes(w[2]) for w in hist.get("messages", {"writes": []})["writes"])
    total = approx_bytes(graph.get_state(cfg).values["messages"])
    assert seed_bytes >= total / 2  # a recent snapshot exists
    assert replayed <= SizedDeltaChannel.GROWTH * seed_bytes + 2 * SIZE + 400


def _reference_size(value: Any) -> int:
    """The estimate as first written: ``isinstance`` checks and a plain ``getattr``."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, BaseMessage):
        size = 64 + _reference_size(value.content) + _reference_size(value.additional_kwargs)
        calls = getattr(value, "tool_calls", None)
        return size + (_reference_size(calls) if calls else 0)
    if isinstance(value, dict):
        return sum(len(str(k)) + _reference_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_reference_size(v) for v in value)
    return 8


class _Text(str):
    pass


def test_the_size_estimate_is_cheap_and_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pydantic attribute miss per message (4 us each, on every state load); same sizes."""
    values: list[Any] = [
        HumanMessage("do it"),
        HumanMessage("extra field", tool_calls=[{"name": "x", "args": {}}]),
        AIMessage("ok", tool_calls=[{"name": "record", "args": {"key": "k"}, "id": "c1"}]),
        AIMessageChunk(content="chunk"),
        ToolMessage('{"ok": true}', tool_call_id="c1"),
        SystemMessage([{"type": "text", "text": "x" * 50}]),
        AIMessage("", additional_kwargs={"a": {"b": [1, 2.5, None, True, _Text("abc"), (1, "x")]}}),
        b"bytes",
        {1: "non-str key"},
        3,
        None,
    ]
    for value in values:
        assert approx_bytes(value) == _reference_size(value)
    assert approx_bytes(values) == _reference_size(values)
    misses: list[str] = []
    for cls in (HumanMessage, ToolMessage, SystemMessage):

        def miss(self: Any, name: str, _real: Any = cls.__getattr__) -> Any:
            misses.append(name)
            return _real(self, name)

        monkeypatch.setattr(cls, "__getattr__", miss)
    assert _reference_size(values) and misses  # the plain ``getattr`` misses
    misses.clear()
    approx_bytes(values)
    assert misses == []


def test_a_load_sizes_the_history_only_when_a_decision_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading a long thread that wrote little since its snapshot does not walk the history."""
    from effectgate.graph import _state

    history = [HumanMessage(content="h" * 100, id=f"h{n}") for n in range(500)]
    sized: list[int] = []
    real = _state.approx_bytes

    def counted(value: Any) -> int:
        if isinstance(value, list) and len(value) >= len(history):
            sized.append(len(value))
        return real(value)

    monkeypatch.setattr(_state, "approx_bytes", counted)
    channel = SizedDeltaChannel(_state._messages_delta_reducer)
    loaded = channel.from_checkpoint(_DeltaSnapshot(list(history)))
    loaded.replay_writes([("task", "messages", [AIMessage(content="small", id="a")])])
    assert loaded.snapshot_frequency == loaded.max_updates  # no snapshot asked
    assert sized == []
    # enough written since: now the snapshot's size decides, and it is the seed's
    big = AIMessage(content="b" * SizedDeltaChannel.MIN_BYTES, id="b")
    assert loaded.update([big])
    assert sized == [len(history)]
    assert loaded.snapshot_frequency == loaded.max_updates  # 16 KiB < half of ~82 KiB
