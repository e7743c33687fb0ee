"""The oracle: what the external systems and the checkpoints say, read from their own storage.

Crash tests, the kill campaign and notebooks ask these functions whether
anything happened twice or was lost. They never ask effectgate's ledger about
effects: the ticket service's SQLite file, the mail sink's SQLite file and the
workspace's bytes are the truth.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from effectgate._app import StateDir

__all__ = ["World", "checkpoint_problems", "world"]


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """The external systems' own view of what happened."""

    tickets: int
    mails: int
    files: dict[str, bytes] = field(default_factory=dict)
    """Workspace files by relative POSIX path, with their exact bytes."""
    duplicate_tickets: int = 0
    """Tickets beyond the first per idempotency key or per alert id."""
    duplicate_mails: int = 0
    """Mails beyond the first per Message-ID."""

    def as_dict(self) -> dict[str, Any]:
        """Return counts (file contents as sizes) for JSON reports."""
        return {
            "tickets": self.tickets,
            "mails": self.mails,
            "files": {k: len(v) for k, v in sorted(self.files.items())},
            "duplicate_tickets": self.duplicate_tickets,
            "duplicate_mails": self.duplicate_mails,
        }


def _extra(values: list[Any]) -> int:
    return sum(n - 1 for v, n in Counter(values).items() if v is not None and n > 1)


def world(state_dir: StateDir | str | Path) -> World:
    """Read tickets, mails and workspace files from the systems' own storage.

    Args:
        state_dir: the state directory whose ``services/`` and ``workspace/``
            are read; servers need not be running.

    Returns:
        The counts, duplicates and file bytes.
    """
    from effectgate.demo.services import read_mails, read_tickets

    sd = state_dir if isinstance(state_dir, StateDir) else StateDir(Path(state_dir))
    tickets = read_tickets(sd.services)
    mails = read_mails(sd.services)
    files = {
        p.relative_to(sd.workspace).as_posix(): p.read_bytes()
        for p in sorted(sd.workspace.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }
    dup_t = max(
        _extra([t.get("idempotency_key") for t in tickets]),
        _extra([t.get("alert_id") for t in tickets]),
    )
    return World(
        tickets=len(tickets),
        mails=len(mails),
        files=files,
        duplicate_tickets=dup_t,
        duplicate_mails=_extra([m.get("message_id") for m in mails]),
    )


class _DropUnknownNodeWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Ignoring unknown node name")


def checkpoint_problems(checkpoints: str | Path, thread_id: str) -> list[str]:
    """Check the message history of every checkpoint of a thread (invariant 6).

    Args:
        checkpoints: the ``checkpoints.sqlite3`` file, or a ``postgresql://``
            URL of a PostgreSQL checkpoint store.
        thread_id: the thread.

    Returns:
        ``"<checkpoint_id>: <problem>"`` lines; empty when every checkpoint is valid.
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    if str(checkpoints).startswith(("postgresql://", "postgres://")):
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(str(checkpoints)) as saver:
            return _history_problems(saver, thread_id)
    conn = sqlite3.connect(str(checkpoints), check_same_thread=False)
    try:
        return _history_problems(SqliteSaver(conn), thread_id)
    finally:
        conn.close()


def _history_problems(saver: Any, thread_id: str) -> list[str]:
    """``checkpoint_problems`` on an open saver."""
    from langgraph.graph import START, StateGraph

    from effectgate.graph import AgentState, history_problems

    # The messages channel is a DeltaChannel: a checkpoint's blob holds only
    # a marker, and the history is rebuilt from the writes of its ancestors.
    # A graph over the same state schema does that reading; it never runs.
    reader = (
        StateGraph(AgentState)
        .add_node("noop", lambda state: {})
        .add_edge(START, "noop")
        .compile(checkpointer=saver)
    )
    out: list[str] = []
    # The reader has none of the thread's effect nodes; LangGraph warns
    # about each pending Send to one. Only the messages are read here.
    quiet = _DropUnknownNodeWarnings()
    algo_logger = logging.getLogger("langgraph")
    algo_logger.addFilter(quiet)
    try:
        for snap in reader.get_state_history({"configurable": {"thread_id": thread_id}}):
            messages = snap.values.get("messages", [])
            cid = snap.config["configurable"]["checkpoint_id"]
            out += [f"{cid}: {p}" for p in history_problems(messages)]
    finally:
        algo_logger.removeFilter(quiet)
    return out
