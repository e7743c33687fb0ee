"""``StepDurableSaver``: task writes commit at NORMAL, checkpoints at FULL, nothing else changes."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from effectgate.graph import StepDurableSaver

_WHO = threading.local()


class _ProbedConnection(sqlite3.Connection):
    """Records, at every commit, which saver method made it and the ``synchronous`` level."""

    commits: list[tuple[str, int]]

    def commit(self) -> None:
        level = int(self.execute("PRAGMA synchronous").fetchone()[0])
        self.commits.append((getattr(_WHO, "method", "?"), level))
        super().commit()


class _Probe(StepDurableSaver):
    def put(self, *args: Any, **kwargs: Any) -> Any:
        _WHO.method = "put"
        try:
            return super().put(*args, **kwargs)
        finally:
            _WHO.method = "?"

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        _WHO.method = "put_writes"
        try:
            super().put_writes(*args, **kwargs)
        finally:
            _WHO.method = "?"


class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: SqliteSaver) -> Any:
    def ask(state: _State) -> dict[str, Any]:
        return {"log": [f"asked:{interrupt('go?')}"]}

    def fan(state: _State) -> dict[str, Any]:
        return {"log": ["fanned"]}

    return (
        StateGraph(_State)
        .add_node("ask", ask)
        .add_node("a", fan)
        .add_node("b", fan)
        .add_edge(START, "ask")
        .add_edge("ask", "a")
        .add_edge("ask", "b")
        .add_edge("a", END)
        .add_edge("b", END)
        .compile(checkpointer=saver)
    )


def _connect(path: Path) -> _ProbedConnection:
    conn = sqlite3.connect(path, check_same_thread=False, factory=_ProbedConnection)
    assert isinstance(conn, _ProbedConnection)
    conn.commits = []
    return conn


def _invoke(graph: Any, value: Any, config: Any, *, path: str) -> None:
    """Run the graph through LangGraph's sync or async path (the saver's sync or async methods)."""
    if path == "sync":
        graph.invoke(value, config, durability="sync")
    else:
        asyncio.run(graph.ainvoke(value, config, durability="sync"))


@pytest.mark.parametrize("path", ["sync", "async"])
def test_writes_commit_at_normal_and_checkpoints_at_full(tmp_path: Path, path: str) -> None:
    conn = _connect(tmp_path / "c.sqlite3")
    graph = _graph(_Probe(conn))
    config = {"configurable": {"thread_id": "t"}}
    _invoke(graph, {"log": []}, config, path=path)
    _invoke(graph, Command(resume="yes"), config, path=path)
    by_method: dict[str, set[int]] = {}
    for method, level in conn.commits:
        by_method.setdefault(method, set()).add(level)
    assert by_method["put_writes"] == {1}  # NORMAL: the interrupt, resume and task writes
    assert by_method["put"] == {2}  # FULL: every checkpoint
    assert sum(m == "put_writes" for m, _ in conn.commits) >= 4
    assert int(conn.execute("PRAGMA synchronous").fetchone()[0]) == 2
    assert graph.get_state(config).values["log"] == ["asked:yes", "fanned", "fanned"]
    conn.close()


def test_same_rows_as_sqlite_saver(tmp_path: Path) -> None:
    """Only durability changes: the stored checkpoints and writes equal SqliteSaver's."""

    def rows(saver_cls: type[SqliteSaver], name: str) -> tuple[Any, ...]:
        conn = sqlite3.connect(tmp_path / name, check_same_thread=False)
        graph = _graph(saver_cls(conn))
        config = {"configurable": {"thread_id": "t"}}
        graph.invoke({"log": []}, config, durability="sync")
        graph.invoke(Command(resume="yes"), config, durability="sync")
        out = (
            conn.execute("SELECT count(*) FROM checkpoints").fetchone(),
            conn.execute("SELECT channel, count(*) FROM writes GROUP BY channel").fetchall(),
            conn.execute("PRAGMA journal_mode").fetchone(),
        )
        conn.close()
        return out

    assert rows(StepDurableSaver, "new.sqlite3") == rows(SqliteSaver, "old.sqlite3")


def test_a_failed_write_restores_full(tmp_path: Path) -> None:
    """An error inside put_writes leaves the connection at FULL, not NORMAL."""
    conn = sqlite3.connect(tmp_path / "c.sqlite3", check_same_thread=False)
    saver = StepDurableSaver(conn)
    saver.setup()
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "x"}}
    with pytest.raises(TypeError):
        saver.put_writes(config, [("log", object())], task_id="task")  # not serializable
    assert int(conn.execute("PRAGMA synchronous").fetchone()[0]) == 2
    conn.close()
