"""The tools a user writes without effectgate: plain LangChain ``@tool``s on the demo services.

The baseline and the effect-ledger system both use these; only the
Idempotency-Key differs. A naive tool mints a fresh key (and a fresh
``Message-ID``) on every call, as code that never expected to be re-run does;
under effect-ledger the key is the operation's stored ``provider_key``, which
its README asks handlers to use "before execution when the provider
supports it". SMTP has no such key, so ``send_email`` is naive in both.

Kill seams (``CAMPAIGN_KILL=<seam>@<tool>``, ``os._exit(137)`` as a
failpoint would) mirror effectgate's failpoints at the same moments:
``before_effect`` (approved, nothing sent), ``after_effect`` (the external
system committed and answered, the tool has not returned) and
``after_result`` (the tool returned and every middleware recorded its result;
the checkpoint has not).
"""

from __future__ import annotations

import json
import os
import smtplib
import sys
import uuid
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import httpx
from langchain.agents.middleware import AgentMiddleware
from langchain_core.tools import BaseTool, tool

from effectgate.demo.services import ServiceEndpoints

__all__ = ["KILL_ENV", "KillAfterResult", "hit_seam", "plain_tools"]

KILL_ENV = "CAMPAIGN_KILL"
"""Environment variable naming one seam, ``<seam>@<tool>``, to exit 137 at."""
_EXIT_CODE = 137
_TIMEOUT_S = 10.0
_SENDER = "agent@localhost"


def hit_seam(seam: str, tool_name: str) -> None:
    """Exit the process at once if ``CAMPAIGN_KILL`` names this seam of this tool."""
    if os.environ.get(KILL_ENV) == f"{seam}@{tool_name}":
        sys.stderr.write(f"campaign: seam {seam}@{tool_name} reached; exiting {_EXIT_CODE}\n")
        sys.stderr.flush()
        os._exit(_EXIT_CODE)


class KillAfterResult(AgentMiddleware):  # type: ignore[type-arg]
    """Outermost tool middleware: exit after the tool and inner middleware returned.

    Installed only when ``CAMPAIGN_KILL`` names an ``after_result`` seam, so
    the wiring under test is otherwise exactly the user's.
    """

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the call, then exit if this tool's ``after_result`` seam is armed."""
        result = handler(request)
        hit_seam("after_result", str(request.tool_call["name"]))
        return result


def plain_tools(
    endpoints: ServiceEndpoints,
    workspace: Path,
    *,
    ticket_key: Callable[[], str] | None = None,
) -> list[BaseTool]:
    """Build get_error_rate, create_ticket, send_email and write_file as plain tools.

    Args:
        endpoints: the demo services.
        workspace: the directory ``write_file`` writes under.
        ticket_key: returns the ``Idempotency-Key`` of a create; default a
            fresh uuid per call (what a naive tool does).

    Returns:
        Four LangChain tools whose results are JSON text, the shapes the
        scripted model's templates read (``ticket_id`` and so on).
    """
    key_of = ticket_key or (lambda: uuid.uuid4().hex)
    base = endpoints.ticket_url.rstrip("/")

    @tool
    def get_error_rate(service: str, window_minutes: int = 5) -> str:
        """Read a service's error rate (fraction 0..1) over the last N minutes."""
        params: dict[str, str | int] = {"service": service, "window_minutes": window_minutes}
        response = httpx.get(f"{base}/metrics/error_rate", params=params, timeout=_TIMEOUT_S)
        response.raise_for_status()
        return response.text

    @tool
    def create_ticket(
        title: str, body: str, severity: str = "high", alert_id: str | None = None
    ) -> str:
        """Open an incident ticket."""
        hit_seam("before_effect", "create_ticket")
        fields = {"title": title, "body": body, "severity": severity, "alert_id": alert_id}
        response = httpx.post(
            f"{base}/tickets",
            json=fields,
            headers={"Idempotency-Key": key_of()},
            timeout=_TIMEOUT_S,
        )
        response.raise_for_status()
        hit_seam("after_effect", "create_ticket")
        return response.text

    @tool
    def send_email(to: list[str], subject: str, body: str) -> str:
        """Send a plain-text e-mail."""
        hit_seam("before_effect", "send_email")
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = _SENDER, ", ".join(to), subject
        message["Message-ID"] = make_msgid(domain="agent.local")
        message.set_content(body)
        with smtplib.SMTP(
            endpoints.smtp_host, endpoints.smtp_port, "agent.local", timeout=_TIMEOUT_S
        ) as smtp:
            smtp.send_message(message)
        hit_seam("after_effect", "send_email")
        return json.dumps({"message_id": message["Message-ID"], "to": to, "subject": subject})

    @tool
    def write_file(path: str, content: str) -> str:
        """Replace the whole content of a file in the workspace (creates it)."""
        hit_seam("before_effect", "write_file")
        target = workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        hit_seam("after_effect", "write_file")
        return json.dumps({"path": path, "bytes": len(content.encode("utf-8"))})

    return [get_error_rate, create_ticket, send_email, write_file]
