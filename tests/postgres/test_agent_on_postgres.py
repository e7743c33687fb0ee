"""``open_agent(store="postgresql://...")``: ledger and checkpoints in PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.errors import ConfigError
from effectgate.graph._pg_saver import StepDurablePostgresSaver, open_postgres_saver
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing.oracle import checkpoint_problems, world

TASK = "Check the order service's error rate and handle any incident."


def _approve_all(request: dict[str, Any]) -> dict[str, Any]:
    return {"decisions": [{"type": "approve"} for _ in request["action_requests"]]}


def test_incident_end_to_end_on_postgres(
    services: DemoServices, state_dir: StateDir, postgres_url: str
) -> None:
    """The demo incident runs to the end with its ledger and checkpoints in PostgreSQL only."""
    with open_agent(state_dir, endpoints=services.endpoints, store=postgres_url) as agent:
        result = agent.start(TASK, thread_id="t1")
        while result.status == "waiting_review":
            result = agent.resume(
                "t1",
                answers={result.interrupts[0].id: _approve_all(dict(result.interrupts[0].value))},
            )
        assert result.status == "done", result.error
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets) == (1, 1, 0)
    with PostgresLedger(postgres_url) as ledger:
        ops = ledger.list(thread_id="t1")
        assert {op.tool: op.state for op in ops} == {
            t: OpState.SUCCEEDED for t in ("create_ticket", "send_email", "write_file")
        }
        assert ledger.get_thread("t1") is not None
    assert checkpoint_problems(postgres_url, "t1") == []
    # nothing of the ledger or the checkpoints went to the state directory's SQLite files
    assert not state_dir.ledger.exists() and not state_dir.checkpoints.exists()
    with open_agent(state_dir, endpoints=services.endpoints, store=postgres_url) as agent:
        assert agent.messages("t1")  # a new process-worth of pools reads the thread back


def test_a_store_that_is_not_postgres_is_refused(state_dir: StateDir) -> None:
    """Only postgresql:// URLs are stores; anything else is a ConfigError naming the scheme."""
    with (
        pytest.raises(ConfigError, match="'mysql': expected a postgresql:// URL"),
        open_agent(state_dir, store="mysql://root@localhost/x"),
    ):
        pass


def test_an_unreachable_server_is_a_config_error(state_dir: StateDir) -> None:
    """A server that refuses connections is one ConfigError line, without the password."""
    url = "postgresql://who:secret@127.0.0.1:1/nothing?connect_timeout=2"
    with pytest.raises(ConfigError) as info, open_agent(state_dir, store=url):
        pass
    assert "127.0.0.1:1/nothing" in str(info.value) and "secret" not in str(info.value)


class _Probe(StepDurablePostgresSaver):
    """Records ``synchronous_commit`` as each write transaction sees it."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.seen: list[tuple[str, str]] = []

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
        with super()._cursor(pipeline=pipeline) as cur:
            yield cur
            if pipeline:
                kind = "writes" if getattr(self._local, "writes", False) else "checkpoint"
                cur.execute("SELECT current_setting('synchronous_commit') AS s")
                self.seen.append((kind, cur.fetchone()["s"]))


def test_task_writes_and_checkpoints_commit_synchronously(postgres_url: str) -> None:
    """put_writes and put (the superstep's checkpoint) both run at synchronous_commit=on.

    A task write at off is lost by a server crash while its worker goes on
    (tests/postgres/test_checkpoint_server_crash.py).
    """
    from langgraph.checkpoint.base import empty_checkpoint

    with open_postgres_saver(postgres_url) as plain:
        probe = _Probe(plain.conn)
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saved = probe.put(config, empty_checkpoint(), {"source": "input", "step": 0}, {})
        probe.put_writes(saved, [("x", 1)], task_id="task-1")
        probe.put(saved, empty_checkpoint(), {"source": "loop", "step": 1}, {})
        assert probe.seen == [("checkpoint", "on"), ("writes", "on"), ("checkpoint", "on")]
        tup = probe.get_tuple(saved)
        assert tup is not None and tup.pending_writes == [("task-1", "x", 1)]


def test_the_async_path_keeps_the_commit_rule(postgres_url: str) -> None:
    """aput_writes and aput at synchronous_commit=on: the async methods run the sync ones."""
    from langgraph.checkpoint.base import empty_checkpoint

    async def go(probe: _Probe) -> Any:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saved = await probe.aput(config, empty_checkpoint(), {"source": "input", "step": 0}, {})
        await probe.aput_writes(saved, [("x", 1)], task_id="task-1")
        await probe.aput(saved, empty_checkpoint(), {"source": "loop", "step": 1}, {})
        listed = [t async for t in probe.alist({"configurable": {"thread_id": "t"}})]
        return await probe.aget_tuple(saved), listed

    with open_postgres_saver(postgres_url) as plain:
        probe = _Probe(plain.conn)
        tup, listed = asyncio.run(go(probe))
        assert probe.seen == [("checkpoint", "on"), ("writes", "on"), ("checkpoint", "on")]
        assert tup is not None and tup.pending_writes == [("task-1", "x", 1)]
        assert len(listed) == 2


def test_incident_end_to_end_through_langgraphs_async_path(
    services: DemoServices, state_dir: StateDir, postgres_url: str
) -> None:
    """graph.astream on the PostgreSQL store: reviews answered by interrupt id, each effect once.

    LangGraph's async path calls the checkpointer's async methods, which
    ``PostgresSaver`` does not have (NotImplementedError before).
    """
    from langgraph.types import Command

    async def run(graph: Any) -> None:
        config: Any = {"configurable": {"thread_id": "a1"}}
        value: Any = {"messages": [("user", TASK)]}
        for _ in range(20):
            async for _chunk in graph.astream(value, config, durability="sync"):
                pass
            state = await graph.aget_state(config)
            if not state.interrupts:
                break
            value = Command(resume={i.id: _approve_all(dict(i.value)) for i in state.interrupts})
        assert not state.next and not state.interrupts

    with open_agent(state_dir, endpoints=services.endpoints, store=postgres_url) as agent:
        asyncio.run(run(agent.graph))
    w = world(state_dir)
    assert (w.tickets, w.mails, w.duplicate_tickets) == (1, 1, 0)
    with PostgresLedger(postgres_url) as ledger:
        assert {op.tool: op.state for op in ledger.list(thread_id="a1")} == {
            t: OpState.SUCCEEDED for t in ("create_ticket", "send_email", "write_file")
        }
    assert checkpoint_problems(postgres_url, "a1") == []


def test_setup_is_shared_by_workers_starting_together(postgres_url: str) -> None:
    """Two savers opened on one empty schema both work (setup runs once, under a lock)."""
    with open_postgres_saver(postgres_url) as a, open_postgres_saver(postgres_url) as b:
        assert a.get_tuple({"configurable": {"thread_id": "none", "checkpoint_ns": ""}}) is None
        assert b.get_tuple({"configurable": {"thread_id": "none", "checkpoint_ns": ""}}) is None
    with psycopg.connect(postgres_url) as conn:
        (n,) = conn.execute("SELECT COUNT(*) FROM checkpoint_migrations").fetchone() or (0,)
    assert n > 0


def test_task_writes_are_all_or_nothing_and_leave_the_pool_usable(postgres_url: str) -> None:
    """A put_writes whose second row the server refuses commits none of its rows.

    The writes, ``BEGIN``, ``SET LOCAL`` and ``COMMIT`` go out in one
    pipeline: a refused row makes the server skip the rest, ``COMMIT``
    included, so the first row is rolled back too; the connection goes back
    to the pool usable, and the next put_writes commits.
    """
    from langgraph.checkpoint.base import empty_checkpoint

    with open_postgres_saver(postgres_url) as saver:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saved = saver.put(config, empty_checkpoint(), {"source": "input", "step": 0}, {})
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.channel = 'bad' THEN RAISE EXCEPTION 'refused'; END IF; "
                "RETURN NEW; END $$"
            )
            conn.execute(
                "CREATE TRIGGER refuse_bad BEFORE INSERT ON checkpoint_writes "
                "FOR EACH ROW EXECUTE FUNCTION refuse_bad()"
            )
            with pytest.raises(psycopg.Error, match="refused"):
                saver.put_writes(saved, [("good", 1), ("bad", 2)], task_id="task-1")
            saver.put_writes(saved, [("good", 3)], task_id="task-2")
            rows = conn.execute(
                "SELECT task_id, channel FROM checkpoint_writes ORDER BY task_id, idx"
            ).fetchall()
        assert rows == [("task-2", "good")]
        tup = saver.get_tuple(saved)
        assert tup is not None and tup.pending_writes == [("task-2", "good", 3)]
