"""Refused answers on the served path: a stopped step, a lost review, a refusal's status.

Three findings of a break test of ``langgraph dev`` serving effectgate's
graph, driven only through ``langgraph_sdk`` against one server for the
module (a model that opens a ticket, then mails about it):

- a stale answer (a reject of a review answered before) to a thread whose run
  was cancelled inside its effect step (``next`` tasks, no interrupt) was
  dropped without a word and the approved calls went on;
- after ``kill -9`` of the server (its in-memory checkpoints lost, the ledger
  kept) an answer to the review it showed was refused as "mistyped";
- a refused answer leaves the review pending; the thread's status is the
  server's (``error`` after any failed run).

Each test reads the server's state (``get_state``, ``threads.get``), the
ledger and the demo services' own files (tickets, mails).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from effectgate.ledger import OpState
from tests.server.test_server_faults import (
    SLOW_S,
    TASK,
    Served,
    _finish,
    _idle,
    _interrupts,
    _until,
)

pytestmark = pytest.mark.slow

WRONG = "0123456789abcdef0123456789abcdef"
"""Shaped like a LangGraph interrupt id (32 hex digits), so LangGraph reads the resume as a map."""


TICKET_THEN_MAIL = {
    "name": "ticket-then-mail",
    "turns": [
        {
            "say": "Opening a ticket.",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {"title": "orders: error rate", "body": "high", "severity": "high"},
                }
            ],
        },
        {
            "say": "Mailing the on-call engineer.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "args": {
                        "to": ["oncall@example.com"],
                        "subject": "TICKET-{{ result.create_ticket.ticket_id }}",
                        "body": "orders: error rate high",
                    },
                }
            ],
        },
    ],
    "final": "Ticket opened, on-call mailed.",
}


class Incident(Served):
    """``Served`` with a model that opens a ticket, then mails about it (one review each).

    No alert id: each thread's ticket is its own operation, and each mail names
    its own ticket, so no thread's review is flagged a duplicate of another's.
    """

    def start(self, **env: str) -> None:
        script = self.model.with_name("ticket-then-mail.yaml")
        script.write_text(yaml.safe_dump(TICKET_THEN_MAIL))
        self.server.start(EFFECTGATE_MODEL=f"scripted:{script}", **env)

    def mails(self) -> int:
        return len(self.services.mails())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Incident]:
    s = Incident(tmp_path_factory.mktemp("refusals"))
    try:
        s.start()
        yield s
    finally:
        s.close()


def _at_review(client: Any) -> tuple[str, Any]:
    thread_id = str(client.threads.create()["thread_id"])
    client.runs.wait(
        thread_id, "effectgate", input={"messages": [{"role": "user", "content": TASK}]}
    )
    [first] = _interrupts(client, thread_id)
    assert [a["name"] for a in first["value"]["action_requests"]] == ["create_ticket"]
    return thread_id, first


def _answer(interrupt: Any, kind: str, key: str | None = None) -> dict[str, Any]:
    n = len(interrupt["value"]["action_requests"])
    decision = {"type": kind, **({"message": "no"} if kind == "reject" else {})}
    return {"resume": {key or interrupt["id"]: {"decisions": [decision] * n}}}


def _refusal(client: Any, thread_id: str, command: dict[str, Any]) -> str:
    """Send ``command``; the run's error message (the test fails if the run did not fail)."""
    out = client.runs.wait(thread_id, "effectgate", command=command, raise_error=False)
    assert isinstance(out, dict) and "__error__" in out, out
    message = str(out["__error__"].get("message"))
    assert "\n" not in message, message
    return message


def test_a_stale_reject_after_a_cancel_inside_the_effect_step_is_refused(
    served: Incident,
) -> None:
    """``runs.cancel(action="interrupt")`` while the approved ticket runs, then a reject of it.

    The thread has ``next`` = the ticket's effect node and no interrupt. The
    reject names a review that does not wait: refused, nothing applied (no
    review asked, no mail); a run with no input finishes the step.
    """
    client = served.client()
    tickets, mails = served.tickets(), served.mails()
    thread_id, first = _at_review(client)
    served.services.set_fault("tickets", "slow", delay_s=SLOW_S)
    try:
        run = client.runs.create(thread_id, "effectgate", command=_answer(first, "approve"))
        _until("the ticket is in flight", lambda: served.in_flight(thread_id))
        client.runs.cancel(thread_id, run["run_id"], wait=True, action="interrupt")
        _idle(client, thread_id)
        _until(
            "the ticket operation is SUCCEEDED",
            lambda: [o.state for o in served.op_of(thread_id)] == [OpState.SUCCEEDED],
        )
    finally:
        served.services.set_fault("tickets", "normal")
    before = client.threads.get_state(thread_id)
    assert (before["next"], before["interrupts"]) == (["effect.create_ticket"], [])

    message = _refusal(client, thread_id, _answer(first, "reject"))
    assert f"interrupt '{first['id']}' is not pending on this thread" in message, message
    assert "effect.create_ticket" in message and "Run the thread with no input" in message
    plain = _refusal(client, thread_id, {"resume": {"decisions": [{"type": "reject"}]}})
    assert "names no interrupt that waits" in plain, plain
    after = client.threads.get_state(thread_id)
    assert after["checkpoint"] == before["checkpoint"]  # nothing written
    assert (after["next"], after["interrupts"]) == (["effect.create_ticket"], [])
    assert not served.op_of(thread_id, "send_email")  # no review of the mail was opened
    assert (served.tickets() - tickets, served.mails() - mails) == (1, 0)

    client.runs.wait(thread_id, "effectgate", input=None)  # finishes the step
    [second] = _interrupts(client, thread_id)
    assert [a["name"] for a in second["value"]["action_requests"]] == ["send_email"]
    _finish(client, thread_id)
    assert (served.tickets() - tickets, served.mails() - mails) == (1, 1)
    [ticket] = served.op_of(thread_id)
    assert (ticket.state, ticket.attempt) == (OpState.SUCCEEDED, 1)


def test_a_refused_answer_keeps_the_review_pending(served: Incident) -> None:
    """An answer keyed by an id that does not wait: refused; the review waits under its id.

    The refusal is the run's error message; ``get_state`` shows the same
    interrupt and no task error. The thread's status is set by the server
    from the run's outcome: ``error`` (docs/async-and-server.md); the next
    answer by the right id brings it back to ``interrupted`` / ``idle``.
    """
    client = served.client()
    tickets, mails = served.tickets(), served.mails()
    thread_id, first = _at_review(client)
    before = client.threads.get_state(thread_id)
    assert client.threads.get(thread_id)["status"] == "interrupted"

    message = _refusal(client, thread_id, _answer(first, "approve", key=WRONG))
    assert WRONG in message and first["id"] in message, message
    after = client.threads.get_state(thread_id)
    assert after["checkpoint"] == before["checkpoint"]
    assert [i["id"] for i in after["interrupts"]] == [first["id"]]
    assert after["next"] == before["next"] == ["review"]
    assert [t.get("error") for t in after["tasks"]] == [None]
    thread = client.threads.get(thread_id)
    # The server's own rule: a run that raised leaves the thread "error"; its
    # interrupts (kept from before, the run wrote no checkpoint) still list the review.
    assert thread["status"] == "error"
    assert thread_id not in [t["thread_id"] for t in client.threads.search(status="interrupted")]
    assert [i["id"] for group in thread["interrupts"].values() for i in group] == [first["id"]]
    assert served.op_of(thread_id) == []  # nothing recorded: a review opens no operation
    assert (served.tickets() - tickets, served.mails() - mails) == (0, 0)

    client.runs.wait(thread_id, "effectgate", command=_answer(first, "approve"))
    assert client.threads.get(thread_id)["status"] == "interrupted"  # at the mail's review
    _finish(client, thread_id)
    assert client.threads.get(thread_id)["status"] == "idle"
    assert (served.tickets() - tickets, served.mails() - mails) == (1, 1)


def test_an_answer_after_kill_9_of_the_server_says_the_review_was_lost(
    served: Incident,
) -> None:
    """``kill -9`` of ``langgraph dev`` while the mail's review waits, a restart, then its answer.

    The restarted server holds no checkpoint of the thread; the ledger holds
    the thread's ticket, approved and created before. The answer to the mail's
    review is refused as a review lost with the server (not "mistyped"), with
    the way on, and nothing is applied; the task sent again reads the ticket
    back, asks about the mail again, and answering it makes one mail.
    """
    client = served.client()
    tickets, mails = served.tickets(), served.mails()
    thread_id, first = _at_review(client)
    client.runs.wait(thread_id, "effectgate", command=_answer(first, "approve"))
    [review] = _interrupts(client, thread_id)
    assert [a["name"] for a in review["value"]["action_requests"]] == ["send_email"]
    [ticket] = served.op_of(thread_id)
    assert ticket.state is OpState.SUCCEEDED
    proc = served.server.proc
    assert proc is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    served.start()
    client = served.client()

    client.threads.create(thread_id=thread_id, if_exists="do_nothing")
    state = client.threads.get_state(thread_id)
    assert (state["next"], state["interrupts"]) == ([], [])  # no checkpoint came back
    message = _refusal(client, thread_id, _answer(review, "approve"))
    assert "lost with the server's checkpoints" in message, message
    assert "mistyped" not in message and "Send the task again" in message, message
    assert ticket.operation_id in message and review["id"] in message, message
    assert served.op_of(thread_id, "send_email") == []
    assert (served.tickets() - tickets, served.mails() - mails) == (1, 0)

    client.runs.wait(
        thread_id, "effectgate", input={"messages": [{"role": "user", "content": TASK}]}
    )
    [again] = _interrupts(client, thread_id)  # the ticket read back, the mail asked again
    assert [a["name"] for a in again["value"]["action_requests"]] == ["send_email"]
    _finish(client, thread_id)
    assert (served.tickets() - tickets, served.mails() - mails) == (1, 1)
    [ticket_after] = served.op_of(thread_id)
    assert (ticket_after.operation_id, ticket_after.state, ticket_after.attempt) == (
        ticket.operation_id,
        OpState.SUCCEEDED,
        1,
    )
    [mail] = served.op_of(thread_id, "send_email")
    assert mail.state is OpState.SUCCEEDED
