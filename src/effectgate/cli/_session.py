"""The plumbing behind ``demo``, ``run`` and ``resume``: drive a thread to a stop.

``drive`` answers pending interrupts from a ``DecisionSource`` and resumes
until the thread is done or waits with nothing left to answer. SIGINT and
SIGTERM ask the agent to stop at the next superstep boundary (a second
SIGINT aborts at once); the thread stays resumable either way, because every
effect already went through the ledger (DESIGN §6).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from effectgate._failpoints import ENV_VAR, Failpoint
from effectgate.cli._decisions import DecisionSource
from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from effectgate.graph import Agent, PendingInterrupt, RunResult
    from effectgate.ledger import Ledger, Operation

__all__ = [
    "Progress",
    "StopFlag",
    "arm_failpoint",
    "check_failpoint",
    "drive",
    "external_counts",
    "stop_on_signals",
]

_MAX_ROUNDS = 50
"""Review rounds one command answers before it stops (a runaway model guard)."""

Say = Callable[[str], None]


def check_failpoint(spec: str | None) -> str | None:
    """Validate a ``--crash-at`` value (``NAME``, ``NAME@tool``, ``NAME#n``) before any I/O.

    Args:
        spec: the flag's value, or ``None``.

    Returns:
        The spec with the seam name upper-cased, or ``None``.

    Raises:
        ConfigError: the seam is not a ``Failpoint`` member or ``#n`` is not a
            positive integer.
    """
    if spec is None:
        return None
    name, _, nth = spec.partition("#")
    name, at, tool = name.partition("@")
    name = name.strip().upper()
    if name not in Failpoint.__members__:
        seams = ", ".join(Failpoint.__members__)
        raise ConfigError(f"unknown failpoint {spec!r}; seams: {seams} (see effectgate failpoints)")
    if nth and (not nth.isdigit() or int(nth) < 1):
        raise ConfigError(f"failpoint {spec!r}: '#n' must be a positive integer")
    return name + (at + tool if at else "") + ("#" + nth if nth else "")


def arm_failpoint(spec: str | None) -> None:
    """Set ``EFFECTGATE_FAILPOINT`` in this process, so it exits 137 at that seam."""
    if spec is not None:
        os.environ[ENV_VAR] = spec


def external_counts(services_dir: Path, workspace: Path) -> dict[str, Any]:
    """Count what the external systems hold, read from their own storage.

    Args:
        services_dir: the demo services' data directory (may not exist yet).
        workspace: the file tools' root.

    Returns:
        ``tickets``, ``mails_delivered``, ``workspace_files``, and the details
        behind them: ``ticket_list``, ``mail_subjects``, ``files`` (path,
        bytes, sha256).
    """
    from effectgate.demo import read_mails, read_tickets

    tickets = read_tickets(services_dir) if services_dir.is_dir() else []
    mails = read_mails(services_dir) if services_dir.is_dir() else []
    files = []
    for path in sorted(p for p in workspace.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files.append(
            {
                "path": path.relative_to(workspace).as_posix(),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    return {
        "tickets": len(tickets),
        "mails_delivered": len(mails),
        "workspace_files": len(files),
        "ticket_list": [f"TICKET-{t.get('ticket_id')}: {t.get('title')}" for t in tickets],
        "mail_subjects": [str(m.get("subject")) for m in mails],
        "files": files,
    }


@dataclass(slots=True)
class StopFlag:
    """Set when the person asked the run to stop (SIGINT / SIGTERM)."""

    reason: str | None = None


@contextlib.contextmanager
def stop_on_signals(agent: Agent, flag: StopFlag, say: Say) -> Iterator[None]:
    """Turn SIGINT / SIGTERM into ``agent.request_stop`` while the block runs.

    The run then ends at the next superstep boundary with every finished
    effect recorded; a second SIGINT raises ``KeyboardInterrupt`` at once.
    Outside the main thread this does nothing (signals cannot be caught there).
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if flag.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.reason = f"stopped by {name}"
        say(f"{name}: stopping at the next step boundary (Ctrl-C again to abort now)")
        agent.request_stop(flag.reason)

    try:
        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@dataclass(slots=True)
class _Answers:
    decisions: dict[str, Any] | None = None
    verdicts: dict[str, Any] = field(default_factory=dict)


def _answer(
    pending: list[PendingInterrupt], source: DecisionSource, ledger: Ledger
) -> _Answers | None:
    answers = _Answers()
    for item in pending:
        if item.kind == "review":
            given = source.review(item.value)
            if given is None:
                return None
            answers.decisions = given
            continue
        op_id = str(item.value.get("operation_id"))
        op = ledger.get(op_id)
        if op is not None and op.state.value != "NEEDS_RECONCILIATION":
            continue  # settled by ``effectgate reconcile``; the agent re-reads the ledger
        verdict = source.verdict(item.value)
        if verdict is None:
            return None
        answers.verdicts[op_id] = verdict
    return answers


def _fingerprint(pending: list[PendingInterrupt]) -> str:
    return json.dumps([[item.id, item.value] for item in pending], sort_keys=True, default=str)


def drive(
    agent: Agent,
    result: RunResult,
    source: DecisionSource,
    *,
    flag: StopFlag,
    say: Say,
) -> RunResult:
    """Answer interrupts and resume until the thread is done or nobody can answer.

    Args:
        agent: the agent the thread runs on.
        result: where the first ``start`` / ``resume`` left the thread.
        source: where answers come from.
        flag: set by ``stop_on_signals``; no new round starts once set.
        say: where notes go.

    Returns:
        The thread's state when the loop stopped.

    Raises:
        DecisionError: an answer did not fit the request; nothing ran.
        ThreadBusyError: another runner took the thread meanwhile.
    """
    answered: set[str] = set()
    for _ in range(_MAX_ROUNDS):
        if not result.interrupts or flag.reason is not None:
            return result
        key = _fingerprint(result.interrupts)
        if key in answered:
            say("the same request came back after it was answered; leaving it pending")
            return result
        answers = _answer(result.interrupts, source, agent.ledger)
        if answers is None:
            return result
        answered.add(key)
        with stop_on_signals(agent, flag, say):
            result = agent.resume(
                result.thread_id, decisions=answers.decisions, verdicts=answers.verdicts or None
            )
    say(f"stopped after {_MAX_ROUNDS} review rounds; resume to continue")
    return result


class Progress:
    """Progress lines for streamed graph updates and backoff waits (to stderr).

    Args:
        say: where lines go.
    """

    def __init__(self, say: Say) -> None:
        self.say = say

    def on_event(self, chunk: Mapping[str, Any]) -> None:
        """Describe one ``stream_mode="updates"`` chunk in a line or two."""
        for node, update in chunk.items():
            if node == "__interrupt__" or not isinstance(update, Mapping):
                continue
            for message in update.get("messages", []) or []:
                self.say(_describe(node, message))

    def on_wait(self, op: Operation, seconds: float) -> None:
        """Announce a backoff wait before it starts."""
        self.say(
            f"{op.tool} ({op.operation_id}): attempt {op.attempt} not accepted; "
            f"waiting {seconds:.1f} s before the next attempt"
        )


def _describe(node: str, message: Any) -> str:
    calls = getattr(message, "tool_calls", None)
    if calls:
        return "model proposes " + ", ".join(str(call.get("name")) for call in calls)
    text = getattr(message, "text", None)
    content = text if isinstance(text, str) else str(getattr(message, "content", message))
    content = " ".join(content.split())
    if len(content) > 160:
        content = content[:157] + "..."
    if getattr(message, "type", None) == "tool":
        return f"{getattr(message, 'name', None) or node}: {content}"
    return f"model: {content}"
