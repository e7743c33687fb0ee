"""``effectgate lease break``: give up a thread's lease by hand, with an audit record.

A thread's lease keeps a second runner off it. A runner that died on this
host is taken over at once (its process is proven gone), and any other lease
expires within its time to live. Two cases need a person: a holder on
another host or in another container, which cannot be proven gone, and a
lease whose expiry is absurd (year 9999, a damaged row). ``lease break``
makes the lease expire now and raises its fencing token, so the old holder
can no longer renew it, and records who, when and why in the ledger
(``Ledger.break_lease``, ``Ledger.thread_events``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape

from effectgate._process import owner_is_gone
from effectgate.cli._output import Output
from effectgate.errors import ConfigError, DecisionError
from effectgate.ledger._threads import GIVEN_UP

__all__ = ["lease_break"]


def lease_break(state_dir: Path, output: Output, *, thread_id: str, reason: str, by: str) -> int:
    """Break ``thread_id``'s lease, audited, and say what was broken.

    Args:
        state_dir: the state directory (not created).
        output: where the report goes.
        thread_id: the thread whose lease to break.
        reason: why, kept in the ledger; required.
        by: who breaks it, kept in the ledger.

    Returns:
        Exit code 0.

    Raises:
        ConfigError: the reason is blank, or the state directory is not ours.
        DecisionError: unknown thread, or the thread holds no lease.
        ThreadBusyError: the lease changed hands meanwhile; nothing was broken.
    """
    from effectgate._app import StateDir

    if not reason.strip():
        raise ConfigError("--reason is empty: say why the lease is broken (the ledger keeps it)")
    sd = StateDir.open(state_dir, create=False)
    if not sd.has_ledger():
        raise ConfigError(f"unknown thread {thread_id!r}: {sd.root} holds no ledger")
    with sd.open_ledger() as ledger:
        try:
            broken = ledger.break_lease(thread_id, by=by, reason=reason)
        except KeyError:
            if ledger.get_thread(thread_id) is None:
                raise ConfigError(f"unknown thread {thread_id!r} in {sd.root}") from None
            raise DecisionError(f"thread {thread_id!r} holds no lease: nothing to break") from None
        (event,) = [e for e in ledger.thread_events(thread_id) if e.kind == "lease_broken"][-1:]
    gone = owner_is_gone(broken.owner)
    report: dict[str, Any] = {
        "thread_id": thread_id,
        "broken": {
            "owner": broken.owner,
            "token": broken.token,
            "expires_at": broken.expires_at.isoformat(),
            "was_expired": bool(event.detail.get("was_expired")),
            "owner_gone": gone,
        },
        "by": by,
        "reason": reason,
        "at": event.at.isoformat(),
    }
    if output.json_mode:
        output.emit_json(report)
        return 0
    if broken.expires_at <= GIVEN_UP:
        # Given up (or broken) before: nobody held it; the token still moved on.
        state = f"it was already given up by {escape(broken.owner)} (token {broken.token})"
    else:
        holder = (
            "its process has ended"
            if gone
            else "it may still be running: its next renewal fails and its run stops at a "
            "step boundary"
        )
        state = (
            f"held by {escape(broken.owner)} (token {broken.token}, expiring "
            f"{broken.expires_at.isoformat()}); {holder}"
        )
    output.out.print(f"broke the lease of thread {escape(repr(thread_id))}: {state}.")
    output.out.print(
        f"recorded in the ledger: by {escape(by)} at {event.at.isoformat()}, "
        f"reason: {escape(reason)}"
    )
    output.out.print(
        f"the next 'effectgate resume --thread {escape(thread_id)}' takes the thread and "
        "treats its attempts in flight as unknown (settled by lookup, or parked for a verdict)"
    )
    return 0
