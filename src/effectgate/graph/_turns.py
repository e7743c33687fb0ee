"""Follow-up turns: how a thread's later human messages are recorded and named.

Follow-up turn ``n`` (2, 3, ...) of thread ``T`` is recorded in the ledger as
the thread record ``T#turn-n`` before it runs, and its message gets a
deterministic id (``turn_message_id``), so a crash between recording and
running it is completed by ``resume`` and the message is added once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from langchain_core.messages import ToolMessage

from effectgate.errors import ConfigError
from effectgate.graph._follow_up import close_open_calls
from effectgate.graph._reading import ThreadReader
from effectgate.graph._results import PendingInterrupt, clip
from effectgate.graph._state import RunStatus
from effectgate.ledger import Ledger, ThreadRecord

__all__ = [
    "TURN",
    "check_at_rest",
    "close_calls",
    "is_turn_record",
    "recorded_turns",
    "record_thread",
    "turn_id",
    "turn_key",
    "turn_message_id",
    "turn_to_run",
    "unapplied_turn",
]

TURN = "#turn-"
"""Follow-up turn ``n`` of thread ``T`` is recorded as the ledger thread ``T#turn-n``."""


def turn_message_id(thread_id: str, turn: int) -> str:
    """Return the message id of follow-up turn ``turn`` (2, 3, ...) of a thread.

    Deterministic, so adding the turn's message again after a crash replaces
    it instead of appending a second copy (LangGraph's ``add_messages``
    reducer replaces a message with the same id).
    """
    return f"turn-{uuid.uuid5(uuid.NAMESPACE_URL, f'effectgate:{thread_id}:{turn}').hex}"


def is_turn_record(thread_id: str) -> bool:
    """Whether a ledger thread record is a follow-up turn (``T#turn-n``), not a thread."""
    head, sep, tail = thread_id.rpartition(TURN)
    return bool(sep and head and tail.isdigit())


def record_thread(thread_id: str) -> str:
    """The thread a ledger thread record belongs to: ``T`` for ``T#turn-n``, else the id itself."""
    return thread_id.rpartition(TURN)[0] if is_turn_record(thread_id) else thread_id


def turn_key(thread_id: str, turn: int) -> str:
    """The ledger thread record of follow-up turn ``turn`` of ``thread_id`` (``T#turn-n``)."""
    return f"{thread_id}{TURN}{turn}"


def turn_id(thread_id: str, record: ThreadRecord) -> str:
    """The message id of the turn ``record`` holds (``turn_message_id``)."""
    return turn_message_id(thread_id, int(record.input.get("turn", 0)))


def recorded_turns(ledger: Ledger, thread_id: str) -> list[ThreadRecord]:
    """The thread's recorded follow-up turns (2, 3, ...), oldest first."""
    out: list[ThreadRecord] = []
    while (found := ledger.get_thread(turn_key(thread_id, len(out) + 2))) is not None:
        out.append(found)
    return out


def check_at_rest(reader: ThreadReader, thread_id: str, snapshot: Any, *, supersede: bool) -> None:
    """Refuse a new turn unless the thread is done, or waits only at supersedable calls.

    Args:
        reader: the agent's thread reader.
        thread_id: the thread.
        snapshot: its state (``graph.get_state``).
        supersede: whether review calls that never started may be superseded.

    Raises:
        ConfigError: the thread is unknown, has not run its first task, has
            unfinished work, or its pending work needs a node the agent lacks.
        FollowUpError: what waits cannot be closed (``close_calls``).
    """
    if snapshot.metadata is None:
        if reader.ledger.get_thread(thread_id) is None:
            raise ConfigError(
                f"unknown thread {thread_id!r}: start it first (Agent.start, or "
                f"effectgate run --thread {thread_id} TASK)"
            )
        raise ConfigError(f"thread {thread_id!r} has not run its first task yet: resume it first")
    reader.check_nodes(thread_id, snapshot)
    pending = reader.interrupts(snapshot)
    if not pending and snapshot.tasks:
        raise ConfigError(
            f"thread {thread_id!r} has unfinished work (a crash, a stop, a model "
            "error): resume it first, then send the message"
        )
    if pending:
        close_calls(reader, thread_id, snapshot, pending, supersede=supersede, now=None)


def close_calls(
    reader: ThreadReader,
    thread_id: str,
    snapshot: Any,
    pending: Sequence[PendingInterrupt],
    *,
    supersede: bool,
    now: datetime | None,
) -> list[ToolMessage]:
    """The one follow-up rule (``answers.follow_up_plan``) on the pending calls.

    Args:
        reader: the agent's thread reader (its ledger and tools).
        thread_id: the thread.
        snapshot: its state (``graph.get_state``).
        pending: the interrupts it waits at.
        supersede: whether review calls that never started may be superseded.
        now: when the answers are given (``None``: only check).

    Returns:
        One ToolMessage answering each call that waits.

    Raises:
        FollowUpError: a reconciliation or question waits, ``supersede``
            is off, or a call's operation may have started (named).
    """
    return close_open_calls(
        snapshot.values.get("messages", []),
        specs=reader.specs,
        ledger=reader.ledger,
        thread_id=thread_id,
        now=now,
        waiting=pending,
        supersede=supersede,
    )


def turn_to_run(
    reader: ThreadReader, thread_id: str, message: str, *, supersede: bool, request_id: str | None
) -> ThreadRecord | None:
    """The recorded turn ``Agent.send`` runs for ``message``, recording it if it is new.

    Args:
        reader: the agent's thread reader.
        thread_id: the thread.
        message: the follow-up message.
        supersede: whether review calls that never started may be superseded.
        request_id: the caller's id for the message, if any.

    Returns:
        The turn's record: the last one if it holds this message and has not
        run yet, else a new one. ``None`` when ``request_id`` names a turn
        already recorded with this message (a retry: continue the thread).

    Raises:
        ConfigError: ``request_id`` was used for another message, another
            recorded turn has not run yet, or the thread is not at rest
            (``check_at_rest``).
        FollowUpError: what waits cannot be closed (``close_calls``).
    """
    turns = recorded_turns(reader.ledger, thread_id)
    snapshot = reader.snapshot(thread_id)
    seen = {m.id for m in snapshot.values.get("messages", [])}
    for turn in turns:
        if request_id is not None and turn.input.get("request_id") == request_id:
            if turn.input.get("message") != message:
                # A request id names one message: another text under it is
                # a client bug, and dropping either message would lose it.
                raise ConfigError(
                    f"thread {thread_id!r}: request id {request_id!r} was already used "
                    f"for turn {turn.input.get('turn')} with message "
                    f"{clip(turn.input.get('message'))}, not {clip(message)}: "
                    "use a new request id for a new message"
                )
            return None
    last = turns[-1] if turns else None
    if last is not None and turn_id(thread_id, last) not in seen:
        if last.input.get("message") != message:
            raise ConfigError(
                f"thread {thread_id!r}: turn {last.input.get('turn')} "
                f"({clip(last.input.get('message'))}) is recorded but has not run "
                "yet: resume the thread first"
            )
        return last  # the same message sent again: run the recorded turn
    check_at_rest(reader, thread_id, snapshot, supersede=supersede)
    return reader.ledger.record_thread(
        turn_key(thread_id, len(turns) + 2),
        {
            "thread_id": thread_id,
            "turn": len(turns) + 2,
            "message": message,
            "supersede": supersede,
            "request_id": request_id,
        },
        {"kind": "turn", "thread": thread_id},
    )


def unapplied_turn(reader: ThreadReader, thread_id: str, status: RunStatus) -> ThreadRecord | None:
    """The last recorded turn if a crash left it unapplied and a resume at ``status`` runs it.

    A thread done, or waiting at a review while the turn asked to supersede
    it, runs the turn; any other status leaves it for later.
    """
    if status not in (RunStatus.DONE, RunStatus.WAITING_REVIEW):
        return None
    turns = recorded_turns(reader.ledger, thread_id)
    if not turns:
        return None
    last = turns[-1]
    if status is RunStatus.WAITING_REVIEW and not last.input.get("supersede"):
        return None
    seen = {m.id for m in reader.messages(thread_id)}
    if turn_id(thread_id, last) in seen:
        return None
    return last
