"""Scripts and helpers shared by the conversation tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.graph import Agent, RunResult, RunStatus
from effectgate.models import ScriptedChatModel
from tests.answers._bind import bound

TASK = "Check the order service; above 5% open a ticket and mail the on-call engineer."
ALSO_LEAD = "Also copy the on-call lead."
TICKET_AGAIN = "Which ticket tracks this? Open one if there is none."

TICKET = {
    "name": "create_ticket",
    "args": {
        "title": "orders: error rate above 5%",
        "body": "The order service's error rate is above 5%.",
        "severity": "high",
        "alert_id": "orders-error-rate",
    },
}

CONVERSATION: dict[str, Any] = {
    "name": "conversation",
    "final": "Nothing further.",
    "turns": [
        {
            "say": "Checking the error rate.",
            "tool_calls": [
                {"name": "get_error_rate", "args": {"service": "orders", "window_minutes": 5}}
            ],
        },
        {"say": "Opening a ticket.", "tool_calls": [TICKET]},
        {
            "say": "Mailing on-call.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "args": {
                        "to": ["oncall@example.com"],
                        "subject": "TICKET-{{ result.create_ticket.ticket_id }}",
                        "body": "orders error rate above 5%",
                    },
                }
            ],
        },
        {"say": "Task: {{ outcomes }}."},
    ],
    "followups": [
        {
            "turns": [
                {
                    "say": "Copying the lead.",
                    "tool_calls": [
                        {
                            "name": "send_email",
                            "args": {
                                "to": ["lead@example.com"],
                                "subject": "TICKET-{{ result.create_ticket.ticket_id }}",
                                "body": "orders error rate above 5% (copy for the lead)",
                            },
                        }
                    ],
                },
                {"say": "Lead: {{ outcomes }}."},
            ]
        },
        {
            "turns": [
                {"say": "Looking the ticket up.", "tool_calls": [TICKET]},
                {"say": "TICKET-{{ result.create_ticket.ticket_id }}: {{ outcomes }}."},
            ]
        },
    ],
}


@contextmanager
def conversation_agent(sd: StateDir, svc: DemoServices | None) -> Iterator[Agent]:
    """An agent playing ``CONVERSATION`` against the demo services (or nowhere)."""
    model = ScriptedChatModel.from_script(CONVERSATION)
    with open_agent(sd, model=model, endpoints=svc.endpoints if svc else None) as agent:
        yield agent


def approve_all(agent: Agent, result: RunResult) -> RunResult:
    """Approve every review until the thread stops waiting for one."""
    while result.status is RunStatus.WAITING_REVIEW:
        (pending,) = result.interrupts
        n = len(pending.value["action_requests"])
        answer = {"decisions": [{"type": "approve"}] * n, "reviewer": "test"}
        result = agent.resume(result.thread_id, decisions=bound(agent, result.thread_id, answer))
    return result
