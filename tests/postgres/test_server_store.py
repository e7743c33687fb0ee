"""The served graph (``effectgate.server``) on a state directory whose ledger is in PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from effectgate import StateDir, server
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState, PostgresLedger
from effectgate.testing.oracle import world

TASK = "Check the order service's error rate and handle any incident."


def _serve(state_dir: StateDir, services: DemoServices, monkeypatch: pytest.MonkeyPatch) -> Any:
    endpoints = services.endpoints
    monkeypatch.setenv(server.STATE_DIR_ENV, str(state_dir.root))
    address = {
        "ticket_url": endpoints.ticket_url,
        "smtp_host": endpoints.smtp_host,
        "smtp_port": endpoints.smtp_port,
        "mail_url": endpoints.mail_url,
    }
    monkeypatch.setenv(server.SERVICES_ENV, json.dumps(address))
    # The server sets its own checkpointer; an in-memory one stands for it here.
    return server._build().copy(update={"checkpointer": InMemorySaver()})


def _run_to_end(graph: Any, thread_id: str) -> None:
    config: Any = {"configurable": {"thread_id": thread_id}}
    value: Any = {"messages": [("user", TASK)]}
    for _ in range(20):
        graph.invoke(value, config, durability="sync")
        state = graph.get_state(config)
        if not state.interrupts:
            return
        answers = {
            i.id: {"decisions": [{"type": "approve"} for _ in i.value["action_requests"]]}
            for i in state.interrupts
        }
        value = Command(resume=answers)
    raise AssertionError("the thread did not finish")


def test_a_directory_that_records_a_store_is_served_with_that_ledger(
    postgres_url: str,
    state_dir: StateDir,
    services: DemoServices,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No SQLite ledger beside the recorded store: the served graph's effects land in PostgreSQL.

    Before, the server opened the directory's SQLite ledger whatever the
    directory recorded, so a thread served there and one run by workers on
    the store could each send the same mail.
    """
    monkeypatch.delenv(server.STORE_ENV, raising=False)
    StateDir.open(state_dir.root, store=postgres_url)  # recorded, as `--store` does once
    graph = _serve(state_dir, services, monkeypatch)
    _run_to_end(graph, "served-1")
    assert not state_dir.ledger.exists()
    w = world(state_dir)
    assert (w.tickets, w.mails) == (1, 1)
    with PostgresLedger(postgres_url) as ledger:
        assert {op.tool: op.state for op in ledger.list(thread_id="served-1")} == {
            t: OpState.SUCCEEDED for t in ("create_ticket", "send_email", "write_file")
        }


def test_the_store_variable_binds_a_new_directory(
    postgres_url: str,
    tmp_path: Any,
    services: DemoServices,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EFFECTGATE_STORE does for the server what --store does for the CLI, recorded once."""
    root = tmp_path / "served"
    monkeypatch.setenv(server.STORE_ENV, postgres_url)
    monkeypatch.setenv(server.STATE_DIR_ENV, str(root))
    monkeypatch.delenv(server.SERVICES_ENV, raising=False)
    server._build()
    again = StateDir.open(root, create=False)
    assert again.store is not None and not again.ledger.exists()
