"""The agent served by ``langgraph dev`` and driven only through ``langgraph_sdk``.

Each test starts the LangGraph development server (in-memory runtime) on a
free loopback port in its own working directory, with the graph factory of
``langgraph.json`` and the demo services started by the test. Answers go
through the SDK exactly as a LangGraph client sends them
(``Command(resume={interrupt_id: ...})``); counts are read from the ticket
service's and mail sink's own SQLite files and from the workspace.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.testing.langgraph_dev import LangGraphDev as Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LANGGRAPH = Path(sys.executable).with_name("langgraph")
TASK = "Check the orders error rate and open a ticket if needed"
FLUSH_S = 10.0
"""The in-memory runtime writes its state to disk every 10 s (langgraph_runtime_inmem)."""


@pytest.fixture
def server(tmp_path: Path, state_dir: StateDir, services: DemoServices) -> Iterator[Server]:
    if not LANGGRAPH.exists():
        pytest.fail(f"{LANGGRAPH} is missing: install the test extra (langgraph-cli[inmem])")
    work = tmp_path / "server"
    work.mkdir()
    srv = Server(work, state_dir.root, services.endpoints, dependencies=[str(ROOT)])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(work / ".langgraph_api", ignore_errors=True)


def _run(client: Any, thread_id: str, **kwargs: Any) -> None:
    client.runs.wait(thread_id, "effectgate", **kwargs)


def _interrupts(client: Any, thread_id: str) -> list[Mapping[str, Any]]:
    state = client.threads.get_state(thread_id)
    return list(state.get("interrupts") or [])


def _answer(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, **extra}


def _resume(client: Any, thread_id: str, answers: Mapping[str, Any], **kwargs: Any) -> None:
    _run(client, thread_id, command={"resume": dict(answers)}, **kwargs)


def _quiet_resume(client: Any, thread_id: str, answers: Mapping[str, Any]) -> None:
    """``_resume`` for a server about to die: whatever the SDK raises is expected."""
    with contextlib.suppress(Exception):
        _resume(client, thread_id, answers)


def _counts(services: DemoServices, state: StateDir) -> tuple[int, int, list[str]]:
    files = sorted(
        str(p.relative_to(state.workspace)) for p in state.workspace.rglob("*") if p.is_file()
    )
    return len(services.tickets()), len(services.mails()), files


def _start(client: Any) -> str:
    thread_id = str(client.threads.create()["thread_id"])
    _run(client, thread_id, input={"messages": [{"role": "user", "content": TASK}]})
    return thread_id


def _review(item: Mapping[str, Any]) -> Mapping[str, Any]:
    value = item["value"]
    assert value["type"] == "review"
    # The shape of LangChain's HumanInTheLoopMiddleware, plus effectgate's fields.
    assert len(value["action_requests"]) == len(value["review_configs"])
    for action, config in zip(value["action_requests"], value["review_configs"], strict=True):
        assert {"name", "args", "description"} <= set(action)
        assert {"operation_id", "intent_hash", "effect_kind"} <= set(action)
        assert config["action_name"] == action["name"]
    return value


def test_approve_through_the_sdk_runs_each_effect_once(server: Server, services, state_dir):
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    assert [a["name"] for a in _review(first)["action_requests"]] == ["create_ticket"]
    _resume(client, thread_id, {first["id"]: {"decisions": [_answer("approve")]}})
    [second] = _interrupts(client, thread_id)
    names = [a["name"] for a in _review(second)["action_requests"]]
    assert names == ["send_email", "write_file"]
    _resume(
        client,
        thread_id,
        {second["id"]: {"decisions": [_answer("approve"), _answer("approve")]}},
    )
    assert _interrupts(client, thread_id) == []
    tickets, mails, files = _counts(services, state_dir)
    assert (tickets, mails) == (1, 1)
    assert files == ["incidents/orders-error-rate.md"]


def test_edit_and_reject_through_the_sdk(server: Server, services, state_dir):
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    action = first["value"]["action_requests"][0]
    edited = {**action["args"], "title": "orders: edited by the reviewer"}
    _resume(
        client,
        thread_id,
        {
            first["id"]: {
                "decisions": [
                    _answer("edit", edited_action={"name": "create_ticket", "args": edited})
                ]
            }
        },
    )
    [second] = _interrupts(client, thread_id)
    _resume(
        client,
        thread_id,
        {second["id"]: {"decisions": [_answer("reject", message="not now"), _answer("reject")]}},
    )
    assert _interrupts(client, thread_id) == []
    tickets, mails, files = _counts(services, state_dir)
    assert [t["title"] for t in services.tickets()] == ["orders: edited by the reviewer"]
    assert (tickets, mails, files) == (1, 0, [])


def test_resume_pinned_to_the_head_checkpoint_is_a_plain_resume(
    server: Server, services, state_dir
):
    # Studio and the API server send the head checkpoint_id with every resume;
    # LangGraph has treated that as a replay, dropping the approved call.
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    head = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    _resume(
        client,
        thread_id,
        {first["id"]: {"decisions": [_answer("approve")]}},
        checkpoint_id=head,
    )
    [second] = _interrupts(client, thread_id)
    assert [a["name"] for a in second["value"]["action_requests"]] == ["send_email", "write_file"]
    assert len(services.tickets()) == 1


def test_resume_pinned_to_an_older_checkpoint_replays_with_the_receipts(
    server: Server, services, state_dir
):
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    at_review = client.threads.get_state(thread_id)["checkpoint"]["checkpoint_id"]
    _resume(client, thread_id, {first["id"]: {"decisions": [_answer("approve")]}})
    [second] = _interrupts(client, thread_id)
    _resume(client, thread_id, {second["id"]: {"decisions": [_answer("approve")] * 2}})
    before = _counts(services, state_dir)
    assert before[:2] == (1, 1)
    # Time travel: the thread forks at the first review. Its calls keep their
    # tool-call ids, so their operations have ended with these very
    # arguments: nothing is asked again and every receipt is read back.
    _run(client, thread_id, input=None, checkpoint_id=at_review)
    assert _interrupts(client, thread_id) == []
    assert _counts(services, state_dir) == before
    messages = client.threads.get_state(thread_id)["values"]["messages"]
    answers = [json.loads(m["content"]) for m in messages if m["type"] == "tool"]
    ticket = [a for a in answers if a.get("tool") == "create_ticket" or "TICKET-" in json.dumps(a)]
    assert ticket and "TICKET-1" in json.dumps(ticket[0])
    assert "TICKET-2" not in json.dumps(messages)


def test_server_killed_after_the_external_commit_resumes_with_one_ticket(
    tmp_path: Path, server: Server, services, state_dir
):
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    # A stop (SIGTERM) makes the in-memory runtime write its state to disk as it
    # shuts down (langgraph_runtime_inmem's stop_pool), the thread waiting at
    # review included: no need to wait for its periodic flush (FLUSH_S). The
    # server then restarts with the seam armed, and the review must still be there.
    server.stop()
    server.start(EFFECTGATE_FAILPOINT="AFTER_EXTERNAL_COMMIT@create_ticket")
    client = get_sync_client(url=server.url)
    assert [i["id"] for i in _interrupts(client, thread_id)] == [first["id"]]
    # The server dies mid-request, as intended. The SDK would go on reconnecting
    # for about a minute, so the answer goes from a thread and the test waits for
    # the server's death, not for the SDK to give up. Its reconnects only join
    # the run (GET); they never send the answer again.
    answer = {first["id"]: {"decisions": [_answer("approve")]}}
    sender = threading.Thread(target=_quiet_resume, args=(client, thread_id, answer), daemon=True)
    sender.start()
    assert server.wait_dead() != 0
    assert len(services.tickets()) == 1  # the ticket service committed; the ledger did not
    server.start()
    client = get_sync_client(url=server.url)
    pending = _interrupts(client, thread_id)
    if pending:  # the server's own state lost the answer: the reviewer answers again
        assert [p["value"]["action_requests"][0]["name"] for p in pending] == ["create_ticket"]
        _resume(client, thread_id, {pending[0]["id"]: {"decisions": [_answer("approve")]}})
    else:
        _run(client, thread_id, input=None)
    [second] = _interrupts(client, thread_id)
    _resume(client, thread_id, {second["id"]: {"decisions": [_answer("approve")] * 2}})
    tickets, mails, files = _counts(services, state_dir)
    assert (tickets, mails, files) == (1, 1, ["incidents/orders-error-rate.md"])
    from effectgate.ledger import SqliteLedger

    with SqliteLedger(state_dir.ledger) as ledger:
        [ticket_op] = [op for op in ledger.list() if op.tool == "create_ticket"]
        assert ticket_op.state.value == "SUCCEEDED"
        assert ticket_op.attempt == 1
        states = [e.dst.value for e in ledger.events(operation_id=ticket_op.operation_id) if e.dst]
    assert "UNKNOWN" in states  # recovered by lookup, not sent again


def test_a_new_message_and_mark_as_resolved_through_the_sdk(server: Server, services, state_dir):
    """A new run with input while a review waits: the call is answered "superseded" before
    the message and the run reaches the model (before: the run ended in error and the
    review vanished). On a second thread, command goto __end__ closes the review as resolved."""
    client = get_sync_client(url=server.url)
    thread_id = _start(client)
    [first] = _interrupts(client, thread_id)
    call_id = first["value"]["action_requests"][0]["tool_call_id"]
    _run(client, thread_id, input={"messages": [{"role": "user", "content": "never mind"}]})
    state = client.threads.get_state(thread_id)
    # the run went on to the model, which proposed its ticket again: a new review
    assert [i["value"]["action_requests"][0]["tool_call_id"] for i in state["interrupts"]] != [
        call_id
    ]
    messages = state["values"]["messages"]
    kinds = [(m["type"], m.get("tool_call_id")) for m in messages]
    answer = kinds.index(("tool", call_id))
    assert json.loads(messages[answer]["content"])["status"] == "superseded"
    assert answer < max(i for i, (t, _) in enumerate(kinds) if t == "human")

    other = _start(client)
    [review] = _interrupts(client, other)
    _run(client, other, command={"goto": "__end__"})
    assert _interrupts(client, other) == []
    last = client.threads.get_state(other)["values"]["messages"][-1]
    assert last["type"] == "tool" and "resolved by the reviewer" in last["content"]
    assert review["id"]
    assert _counts(services, state_dir)[:2] == (0, 0)
