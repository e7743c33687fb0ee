"""The incident model's final message says what actually ran, not what was proposed."""

from __future__ import annotations

from effectgate import StateDir, open_agent
from effectgate.demo.services import DemoServices
from effectgate.graph import RunStatus
from tests.answers._bind import bound


def test_the_summary_names_a_rejected_mail(services: DemoServices, state_dir: StateDir) -> None:
    with open_agent(state_dir, model="scripted:incident", endpoints=services.endpoints) as agent:
        result = agent.start("Handle the incident.", thread_id="s")
        answers = iter(
            [
                [{"type": "approve"}],  # the ticket
                [{"type": "reject", "message": "Not now"}, {"type": "approve"}],  # mail, note
            ]
        )
        while result.status is RunStatus.WAITING_REVIEW:
            decisions = {"decisions": next(answers), "reviewer": "test"}
            result = agent.resume("s", decisions=bound(agent, "s", decisions))
    assert result.status is RunStatus.DONE, result.error
    final = result.final_message or ""
    assert "create_ticket ran (TICKET-1)" in final
    assert "send_email was rejected" in final and "Not now" in final
    assert "write_file ran" in final
    assert "submitted" not in final
