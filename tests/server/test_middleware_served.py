"""``create_agent`` + ``EffectGateMiddleware`` served by ``langgraph dev``: what a client reads.

Issue #33, F8. The LangGraph server hands a client the text of a run's
error only for the exception classes it lists (``langgraph_api.serde.default``:
``ValueError``, ``TypeError``, ``KeyError``, ``RuntimeError`` and a few
more); any other class reaches the client as "An internal error occurred".

- A user's tool wrapper that catches ``Exception`` swallows effectgate's
  re-review interrupt; the run ends in ``OrphanedOperationError``. Before,
  an ``EffectgateError`` only, the client read "An internal error occurred";
  now (a ``RuntimeError`` too) it reads the operation id and the way on, and
  following it (a run from the checkpoint before the tool step) asks about
  the call again and opens one ticket.
- A user's sync-only ``wrap_tool_call`` before effectgate's, in a served
  (always async) run: the client reads one line naming the class and
  ``awrap_tool_call`` (``MissingHookError``), not LangChain's text that names
  neither.

Driven only through ``langgraph_sdk``; counts from the ticket service's own
file and the ledger.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing.langgraph_dev import LangGraphDev
from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LANGGRAPH = Path(sys.executable).with_name("langgraph")
TICKET = {
    "title": "orders: error rate above 5%",
    "body": "The order service's error rate is above 5%.",
    "severity": "high",
    "alert_id": "orders-error-rate",
}
GRAPHS = {
    "swallowing": "tests.server._middleware_graphs:swallowing",
    "sync_only": "tests.server._middleware_graphs:sync_only",
}


def _reply(body: dict[str, Any]) -> Any:
    if any(m.get("role") == "tool" for m in body["messages"]):
        return chat_reply("Done.")
    return chat_reply("Opening a ticket.", [{"name": "create_ticket", "arguments": TICKET}])


@pytest.fixture
def served(tmp_path: Path, state_dir: StateDir, services: DemoServices) -> Iterator[LangGraphDev]:
    if not LANGGRAPH.exists():
        pytest.fail(f"{LANGGRAPH} is missing: install the test extra (langgraph-cli[inmem])")
    work = tmp_path / "server"
    with FakeOpenAIServer(_reply) as model:
        srv = LangGraphDev(
            work, state_dir.root, services.endpoints, dependencies=[str(ROOT)], graphs=GRAPHS
        )
        srv.start(BYO_OPENAI_URL=model.base_url)
        try:
            yield srv
        finally:
            srv.stop()
            shutil.rmtree(work / ".langgraph_api", ignore_errors=True)


def _error(out: Any) -> str:
    assert isinstance(out, dict) and "__error__" in out, out
    return str(out["__error__"].get("message"))


def _review(client: Any, thread_id: str) -> dict[str, Any]:
    (item,) = client.threads.get_state(thread_id)["interrupts"]
    return dict(item)


def test_a_swallowed_interrupt_reaches_the_client_with_the_operation_and_the_way_on(
    served: LangGraphDev, services: DemoServices, state_dir: StateDir
) -> None:
    client = get_sync_client(url=served.url)
    thread = str(client.threads.create()["thread_id"])
    client.runs.wait(
        thread, "swallowing", input={"messages": [{"role": "user", "content": "open a ticket"}]}
    )
    review = _review(client, thread)
    (action,) = review["value"]["action_requests"]
    op_id = action["operation_id"]

    out = client.runs.wait(
        thread,
        "swallowing",
        command={"resume": {review["id"]: {"decisions": [{"type": "approve"}]}}},
        raise_error=False,
    )

    message = _error(out)
    assert "internal error" not in message, message  # before: all the client read
    assert f"create_ticket ({op_id}, PROPOSED at attempt 0)" in message, message
    assert "GraphBubbleUp" in message and "checkpoint_id" in message, message
    assert "\n" not in message
    with SqliteLedger(state_dir.ledger) as ledger:
        op = ledger.get(op_id)
    assert op is not None and op.state is OpState.PROPOSED
    assert services.tickets() == []

    # The way on the message names: the wrapper fixed (it swallows once), a run
    # from the checkpoint before the tool step asks about the call again.
    history = client.threads.get_history(thread, limit=50)
    (before_tools,) = [s for s in history if s["next"] == ["tools"]]
    client.runs.wait(thread, "swallowing", checkpoint_id=before_tools["checkpoint_id"])
    again = _review(client, thread)
    assert [a["operation_id"] for a in again["value"]["action_requests"]] == [op_id]
    client.runs.wait(
        thread,
        "swallowing",
        command={"resume": {again["id"]: {"decisions": [{"type": "approve"}]}}},
    )
    assert len(services.tickets()) == 1
    with SqliteLedger(state_dir.ledger) as ledger:
        done = ledger.get(op_id)
    assert done is not None and (done.state, done.attempt) == (OpState.SUCCEEDED, 1)


def test_a_sync_only_wrapper_is_named_in_one_line(
    served: LangGraphDev, services: DemoServices, state_dir: StateDir
) -> None:
    client = get_sync_client(url=served.url)
    thread = str(client.threads.create()["thread_id"])
    client.runs.wait(
        thread, "sync_only", input={"messages": [{"role": "user", "content": "open a ticket"}]}
    )
    review = _review(client, thread)

    out = client.runs.wait(
        thread,
        "sync_only",
        command={"resume": {review["id"]: {"decisions": [{"type": "approve"}]}}},
        raise_error=False,
    )

    message = _error(out)
    assert out["__error__"]["error"] == "MissingHookError", out
    assert "SyncOnly" in message and "awrap_tool_call" in message, message
    assert "\n" not in message
    assert services.tickets() == []  # nothing ran for the call
    with SqliteLedger(state_dir.ledger) as ledger:
        (op,) = ledger.list()
    assert (op.state, op.attempt) == (OpState.APPROVED, 0)
