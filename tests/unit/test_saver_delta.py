"""``StepDurableSaver.get_delta_channel_history`` gives upstream's answer for every checkpoint.

The saver walks remembered lineage instead of deserializing every ancestor.
These tests build threads with two delta channels (snapshots every
3 and every 5 updates), forks from old checkpoints and replays, and compare
every checkpoint's history with ``SqliteSaver``'s own method on the same file:
from the saver that wrote the thread (lineage remembered at ``put``), from a
fresh saver (lineage learned by the SQL walk), and from a saver whose memory
was made wrong on purpose.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from effectgate.graph import StepDurableSaver
from effectgate.graph._saver import _Lineage

CHANNELS = ["a", "b"]


def _extend(state: list[Any] | None, writes: list[list[Any]]) -> list[Any]:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class _State(TypedDict):
    a: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=3)]
    b: Annotated[list[Any], DeltaChannel(_extend, snapshot_frequency=5)]


def _node(state: _State) -> dict[str, Any]:
    n = len(state["a"])
    return {"a": [n], **({"b": [f"b{n}"]} if n % 2 else {})}


def _graph(saver: SqliteSaver) -> Any:
    return (
        StateGraph(_State)
        .add_node("n", _node)
        .add_edge(START, "n")
        .add_edge("n", END)
        .compile(checkpointer=saver)
    )


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, check_same_thread=False)


def _upstream(saver: SqliteSaver, config: Any) -> Any:
    return SqliteSaver.get_delta_channel_history(saver, config=config, channels=CHANNELS)


def _assert_same_everywhere(path: Path, writer: StepDurableSaver, thread: str) -> int:
    """Every checkpoint of ``thread``: writer, fresh saver and upstream agree. Returns the count."""
    fresh = StepDurableSaver(_connect(path))
    plain = SqliteSaver(_connect(path))
    try:
        configs = [t.config for t in plain.list({"configurable": {"thread_id": thread}})]
        for config in configs:
            expected = _upstream(plain, config)
            assert writer.get_delta_channel_history(config=config, channels=CHANNELS) == expected
            assert fresh.get_delta_channel_history(config=config, channels=CHANNELS) == expected
            # once more: now from what the fresh saver learned on the way
            assert fresh.get_delta_channel_history(config=config, channels=CHANNELS) == expected
        return len(configs)
    finally:
        fresh.conn.close()
        plain.conn.close()


def test_a_thread_with_snapshots_reads_back_as_upstream_does(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    saver = StepDurableSaver(_connect(path))
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "t"}}
    for i in range(12):
        graph.invoke({"a": [100 + i]}, config)
    # a snapshot is crossed several times on each channel
    assert _assert_same_everywhere(path, saver, "t") == 36
    assert graph.get_state(config).values["a"][:4] == [100, 1, 101, 3]


def test_a_wrong_memory_changes_nothing(tmp_path: Path) -> None:
    """Lineage that claims snapshots where none are, or hides real ones: same answers."""
    path = tmp_path / "c.sqlite3"
    saver = StepDurableSaver(_connect(path))
    graph = _graph(saver)
    for i in range(9):
        graph.invoke({"a": [i]}, {"configurable": {"thread_id": "t"}})
    plain = SqliteSaver(_connect(path))
    configs = [t.config for t in plain.list({"configurable": {"thread_id": "t"}})]
    for n, key in enumerate(list(saver._lineage)):
        node = saver._lineage[key]
        # every other checkpoint: claim both channels are there, else claim none
        wrong = frozenset(CHANNELS) if n % 2 else frozenset()
        saver._lineage[key] = _Lineage(node.parent, wrong)
    for config in configs:
        got = saver.get_delta_channel_history(config=config, channels=CHANNELS)
        assert got == _upstream(plain, config)
    plain.conn.close()


@settings(max_examples=25, deadline=None)
@given(
    plan=st.lists(
        st.one_of(
            st.tuples(st.just("run"), st.integers(0, 9)),
            st.tuples(st.just("fork"), st.integers(0, 200), st.integers(0, 9)),
            st.tuples(st.just("replay"), st.integers(0, 200)),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_forks_and_replays_read_back_as_upstream_does(
    tmp_path_factory: Any, plan: list[tuple[Any, ...]]
) -> None:
    path = tmp_path_factory.mktemp("delta") / "c.sqlite3"
    saver = StepDurableSaver(_connect(path))
    graph = _graph(saver)
    head = {"configurable": {"thread_id": "t"}}
    for step in plan:
        history = [s.config for s in graph.get_state_history(head)]
        if step[0] == "run" or not history:
            graph.invoke({"a": [step[-1]]}, head)
        elif step[0] == "fork":
            graph.invoke({"a": [step[2]]}, history[step[1] % len(history)])
        else:
            graph.invoke(None, history[step[1] % len(history)])
    _assert_same_everywhere(path, saver, "t")
    saver.conn.close()


def test_checkpoints_deleted_by_another_connection_are_not_remembered(tmp_path: Path) -> None:
    """Rows deleted from outside (a prune, another process's delete_thread): upstream's answer.

    The writer remembered every checkpoint's parent when it wrote it; another
    connection's commit (SQLite's data version moves) makes it forget.
    """
    path = tmp_path / "c.sqlite3"
    saver = StepDurableSaver(_connect(path))
    graph = _graph(saver)
    for i in range(6):
        graph.invoke({"a": [i]}, {"configurable": {"thread_id": "t"}})
    plain = SqliteSaver(_connect(path))
    configs = [t.config for t in plain.list({"configurable": {"thread_id": "t"}})]
    for config in configs:  # warm: every lineage remembered and used
        saver.get_delta_channel_history(config=config, channels=CHANNELS)
    middle = configs[len(configs) // 2]["configurable"]["checkpoint_id"]
    with _connect(path) as other:
        other.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (middle,))
    for config in configs:
        got = saver.get_delta_channel_history(config=config, channels=CHANNELS)
        assert got == _upstream(plain, config)
    saver.delete_thread("t")  # its own delete: forgets too
    for config in configs:
        assert saver.get_delta_channel_history(config=config, channels=CHANNELS) == _upstream(
            plain, config
        )
    plain.conn.close()
