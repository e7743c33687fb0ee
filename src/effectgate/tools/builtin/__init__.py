"""The built-in tools: files, shell, tickets (HTTP) and mail (SMTP).

Each factory takes where the tool acts (a workspace, a URL, an SMTP server)
and returns ``ToolSpec`` objects with their side-effect contracts declared.
"""

from __future__ import annotations

from effectgate.tools.builtin.files import file_tools
from effectgate.tools.builtin.mail import mail_tools, message_id_for
from effectgate.tools.builtin.shell import shell_tool
from effectgate.tools.builtin.tickets import ticket_tools

__all__ = ["file_tools", "mail_tools", "message_id_for", "shell_tool", "ticket_tools"]
