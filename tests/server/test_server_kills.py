"""``langgraph dev`` killed at every seam of an approved effect, then restarted.

The server is started with ``EFFECTGATE_FAILPOINT`` armed, so its own process
dies (``os._exit(137)``, as a SIGKILL) at one seam while it runs the approved
calls of the demo thread. A new server on the same state directory must make
the thread usable again in bounded time (no run left pending or running), and
driving it to its end through ``langgraph_sdk`` (answering whatever review the
restarted server shows, or running it on with no input) must leave exactly one
ticket, one mail and one incident note, counted in the ticket service's and the
mail sink's own storage and in the workspace, with every operation
``SUCCEEDED`` in the ledger.

Each seam costs about a minute (three server starts and the in-memory
runtime's 10 s flushes), so the suite runs one seam
(``AFTER_EXTERNAL_COMMIT``, in ``test_langgraph_dev.py``) and ``make
server-kills`` runs them all (``EG_SERVER_KILLS=1``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.ledger import SqliteLedger
from effectgate.testing.langgraph_dev import LangGraphDev as Server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("EG_SERVER_KILLS") != "1",
        reason="make server-kills runs every seam (EG_SERVER_KILLS=1); the suite runs "
        "AFTER_EXTERNAL_COMMIT in tests/server/test_langgraph_dev.py",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
TASK = "Check the orders error rate and open a ticket if needed"
FLUSH_S = 12.0
"""The in-memory runtime writes its state to disk every 10 s; 2 s to spare."""

SEAMS = [
    "AFTER_REVIEW_RECORDED#1",
    "AFTER_IN_FLIGHT_COMMIT@create_ticket",
    "AFTER_EXTERNAL_COMMIT@create_ticket",
    "AFTER_LEDGER_RESULT@create_ticket",
    "AFTER_IN_FLIGHT_COMMIT@send_email",
    "AFTER_EXTERNAL_COMMIT@send_email",
    "MID_SUPERSTEP",
]


@pytest.fixture
def server(tmp_path: Path, state_dir: StateDir, services: DemoServices) -> Iterator[Server]:
    work = tmp_path / "server"
    srv = Server(work, state_dir.root, services.endpoints, dependencies=[str(ROOT)])
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(work / ".langgraph_api", ignore_errors=True)


def _until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.5)


def _interrupts(client: Any, thread_id: str) -> list[Mapping[str, Any]]:
    return list(client.threads.get_state(thread_id).get("interrupts") or [])


def _approve_all(client: Any, thread_id: str, item: Mapping[str, Any]) -> None:
    n = len(item["value"]["action_requests"])
    answer = {item["id"]: {"decisions": [{"type": "approve"}] * n}}
    client.runs.wait(thread_id, "effectgate", command={"resume": answer})


def _task() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": TASK}]}


def _ended(client: Any, thread_id: str) -> bool:
    """The last message is the model's, with no tool call left to run."""
    messages = client.threads.get_state(thread_id)["values"].get("messages") or []
    last = messages[-1] if messages else {}
    return last.get("type") == "ai" and not last.get("tool_calls")


@pytest.mark.parametrize("seam", SEAMS)
def test_a_server_killed_at_a_seam_is_usable_again_and_acts_once(
    seam: str, server: Server, services: DemoServices, state_dir: StateDir
) -> None:
    server.start(EFFECTGATE_FAILPOINT=seam)
    client = get_sync_client(url=server.url)
    thread_id = str(client.threads.create()["thread_id"])
    client.runs.wait(thread_id, "effectgate", input=_task())
    for _ in range(3):  # the ticket's review, then the mail and note's review
        pending = _interrupts(client, thread_id)
        assert pending, "the server answered every review without reaching the seam"
        time.sleep(FLUSH_S)  # the thread, waiting at this review, is on disk
        with contextlib.suppress(Exception):  # the server dies mid-request, as intended
            _approve_all(client, thread_id, pending[0])
        if server.proc is not None and server.proc.poll() is not None:
            break
    assert server.wait_dead() == 137, server.log()[-2000:]

    server.start()
    client = get_sync_client(url=server.url)
    for _ in range(6):
        _until(
            "no run of the thread is pending or running",
            lambda: all(
                r["status"] not in ("pending", "running") for r in client.runs.list(thread_id)
            ),
            timeout=60,
        )
        pending = _interrupts(client, thread_id)
        messages = client.threads.get_state(thread_id)["values"].get("messages") or []
        if pending:
            _approve_all(client, thread_id, pending[0])
        elif not messages:
            # The in-memory runtime kept no checkpoint of the thread (docs/async-and-server.md,
            # Limits): the client sends the task again on the same thread; the ledger settles
            # what had run and the reviewer is asked again only for what had not.
            client.runs.wait(thread_id, "effectgate", input=_task())
        elif _ended(client, thread_id):
            break
        else:
            client.runs.wait(thread_id, "effectgate", input=None)
    assert _ended(client, thread_id) and not _interrupts(client, thread_id)

    files = sorted(
        str(p.relative_to(state_dir.workspace))
        for p in state_dir.workspace.rglob("*")
        if p.is_file()
    )
    assert (len(services.tickets()), len(services.mails()), files) == (
        1,
        1,
        ["incidents/orders-error-rate.md"],
    )
    with SqliteLedger(state_dir.ledger) as ledger:
        states = {op.tool: op.state.value for op in ledger.list()}
    assert states == {
        "create_ticket": "SUCCEEDED",
        "send_email": "SUCCEEDED",
        "write_file": "SUCCEEDED",
    }, states
