"""The options the ``effectgate`` commands share: their typer types, checks and defaults.

``cli/_app.py`` declares the commands; the options two or more of them take
(``--state-dir``, ``--store``, ``--json``, ``--approve``, ``--decisions``,
``--crash-at``, ``--reviewer``, ``--agent``, ``--thread``, ``--base-url``,
``--api-key``) are written once here, with the id check every ``--thread``
runs and the ``RunFlags`` that ``demo``, ``run`` and ``resume`` hand to the
runner.
"""

from __future__ import annotations

import enum
import getpass
import os
from pathlib import Path
from typing import Annotated

import typer

from effectgate import _failpoints
from effectgate._postgres_app import STORE_ENV, give_store
from effectgate.cli._output import DEFAULT_STATE_DIR, command_hint
from effectgate.cli._runner import RunFlags

__all__ = [
    "DEFAULT_STATE",
    "FLAG",
    "AgentOpt",
    "ApiKeyOpt",
    "Approve",
    "ApproveOpt",
    "BaseUrlOpt",
    "CrashOpt",
    "DecisionsOpt",
    "JsonOpt",
    "OnlyThreadOpt",
    "ReviewerOpt",
    "StateDirOpt",
    "StoreOpt",
    "ThreadOpt",
    "failpoint_hint",
    "id_flag",
    "id_flags",
    "reviewer_name",
    "run_flags",
]


class Approve(enum.StrEnum):
    """Values of ``--approve``."""

    ALL = "all"
    NONE = "none"


StateDirOpt = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="EFFECTGATE_STATE_DIR",
        file_okay=False,
        help="State directory (checkpoints.sqlite3, ledger.sqlite3, workspace/, services/).",
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar=STORE_ENV,
        metavar="URL",
        callback=give_store,  # every open in this process connects with it (its password)
        help="postgresql://... : keep the ledger and checkpoints in PostgreSQL (recorded in the "
        "state directory, which keeps it for life; default: its SQLite files).",
    ),
]
FLAG = ""
"""Metavar of a plain on/off flag: typer would print ``<bool>`` as if it took a value."""
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", metavar=FLAG, help="Print one JSON object on stdout and nothing else there."
    ),
]
ApproveOpt = Annotated[
    Approve | None,
    typer.Option(
        "--approve",
        case_sensitive=False,
        help="Answer every review: 'all' approves (unsafe calls too, with a note; never a "
        "possible duplicate or a conflict: those are left for a person), 'none' rejects.",
    ),
]
DecisionsOpt = Annotated[
    Path | None,
    typer.Option(
        "--decisions",
        dir_okay=False,
        help='JSON file: {"decisions": [...]} for the next review, a list of such objects for '
        'successive reviews, and/or {"verdicts": {op_id: verdict}}.',
    ),
]
CrashOpt = Annotated[
    str | None,
    typer.Option(
        "--crash-at",
        metavar="SEAM",
        help="Exit 137 at this failpoint (NAME, NAME@tool, NAME#n); see 'effectgate failpoints'.",
    ),
]


ReviewerOpt = Annotated[
    str | None,
    typer.Option(
        "--reviewer",
        help="Name recorded on approvals and verdicts (default: your user name).",
    ),
]
AgentOpt = Annotated[
    str | None,
    typer.Option(
        "--agent",
        metavar="MODULE:FACTORY",
        help="Build the agent (tools, model, policy) with your factory, e.g. myagent:build; "
        "remembered for the thread in the state directory.",
    ),
]


def id_flag(value: str | None) -> str | None:
    """Refuse an empty or blank-padded id: it would silently name another thread.

    Non-UTF-8 bytes are refused earlier, for every word (``_app._Utf8Group``).

    Returns:
        ``value`` unchanged (``None`` when the option was not given).

    Raises:
        typer.BadParameter: the id is empty, blank, or starts or ends with
            whitespace (exit 2, a usage error).
    """
    if value is not None and (not value.strip() or value != value.strip()):
        raise typer.BadParameter(
            f"{value!r}: a thread id (or operation id) may not be empty, blank, "
            "or start or end with whitespace"
        )
    return value


def id_flags(values: list[str] | None) -> list[str] | None:
    """``id_flag`` for a repeatable ``--thread``."""
    for value in values or []:
        id_flag(value)
    return values


ThreadOpt = Annotated[
    str | None,
    typer.Option("--thread", callback=id_flag, help="Thread id (default: a new random one)."),
]
OnlyThreadOpt = Annotated[
    str | None, typer.Option("--thread", callback=id_flag, help="Only this thread.")
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)."),
]
ApiKeyOpt = Annotated[
    str | None, typer.Option("--api-key", help="API key (default $OPENAI_API_KEY); never stored.")
]

DEFAULT_STATE = DEFAULT_STATE_DIR


def reviewer_name(name: str | None) -> str:
    """The name recorded on approvals and verdicts: ``name``, else the user's, else ``"cli"``.

    Args:
        name: ``--reviewer`` / ``--by`` as given, or ``None``.

    Returns:
        ``name`` if given and not empty; else the login name, or ``"cli"``
        where there is none (a container without a passwd entry).
    """
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return "cli"


def failpoint_hint(state_dir: Path, thread: str) -> None:
    """Have a failpoint exit (``--crash-at``) print the command that continues the thread."""
    os.environ[_failpoints.HINT_VAR] = command_hint(state_dir, "resume", "--thread", thread)


def run_flags(
    state_dir: Path,
    approve: Approve | None,
    decisions: Path | None,
    reviewer: str | None,
    crash_at: str | None,
    *,
    store: str | None = None,
) -> RunFlags:
    """The ``RunFlags`` of ``demo``, ``run`` and ``resume``, from their options as parsed.

    Args:
        state_dir: ``--state-dir``.
        approve: ``--approve``, or ``None``.
        decisions: ``--decisions``, or ``None``.
        reviewer: ``--reviewer``, or ``None`` (``reviewer_name`` picks one).
        crash_at: ``--crash-at`` as given (checked later, before any I/O).
        store: ``--store``, or ``None``.

    Returns:
        The flags the runner (``cli/_runner.py``) reads.
    """
    return RunFlags(
        state_dir=state_dir,
        approve=approve.value if approve else None,
        decisions=decisions,
        reviewer=reviewer_name(reviewer),
        crash_at=crash_at,
        store=store,
    )
