"""The plumbing behind ``demo``, ``run`` and ``resume``: drive a thread to a stop.

``drive`` answers pending interrupts from a ``DecisionSource`` and resumes
until the thread is done, waits with nothing left to answer, or the graph
refuses an answer (the re-asked interrupt carries an ``"error"``). SIGINT and
SIGTERM (``effectgate.cli._signals``) ask the agent to stop at the next
superstep boundary and start no new round; the thread stays resumable either
way, because every effect already went through the ledger.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._failpoints import ENV_VAR, Failpoint, per_tool
from effectgate.answers import bind_decisions, settle_verdict, validate_verdict
from effectgate.cli._decisions import DecisionSource, FileDecisions
from effectgate.cli._render import tool_line
from effectgate.cli._review_ui import TerminalReviewer, review_context
from effectgate.cli._signals import Stopper
from effectgate.errors import ConfigError, DecisionError

if TYPE_CHECKING:
    from effectgate.graph import Agent, PendingInterrupt, RunResult
    from effectgate.ledger import Operation

__all__ = [
    "Driven",
    "Progress",
    "arm_failpoint",
    "check_failpoint",
    "drive",
    "external_counts",
    "refusals",
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
    if at and not per_tool(Failpoint(name)):
        raise ConfigError(f"failpoint {spec!r}: {name} is not reached per tool; drop '@{tool}'")
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
    from effectgate.tools._workspace import inventory

    tickets = read_tickets(services_dir) if services_dir.is_dir() else []
    mails = read_mails(services_dir) if services_dir.is_dir() else []
    files = inventory(workspace)  # bounded; never follows a workspace symlink
    return {
        "tickets": len(tickets),
        "mails_delivered": len(mails),
        "workspace_files": len(files),
        "ticket_list": [f"TICKET-{t.get('ticket_id')}: {t.get('title')}" for t in tickets],
        "mail_subjects": [str(m.get("subject")) for m in mails],
        "files": files,
    }


@dataclass(slots=True)
class _Answers:
    answers: dict[str, Any] = field(default_factory=dict)
    """Interrupt id -> answer, each bound to what was read for that interrupt."""
    decisions: dict[str, Any] | None = None
    """A decisions-file answer bound by operation ids that matches nothing pending."""


@dataclass(frozen=True, slots=True)
class Driven:
    """Where ``drive`` left the thread, and why the graph refused the last answer."""

    result: RunResult
    refused: list[str] = field(default_factory=list)
    """One line per re-asked interrupt whose payload carries an ``"error"``."""


def refusals(result: RunResult) -> list[str]:
    """Return why the graph refused the answers it was just given (empty: none refused).

    The review and effect nodes refuse a bad answer by asking again with an
    ``"error"`` key in the interrupt payload; nothing was dispatched for it.
    """
    out = []
    for item in result.interrupts:
        error = item.value.get("error")
        if error:
            what = (
                "review answer"
                if item.kind == "review"
                else f"verdict for {item.value.get('operation_id')}"
            )
            out.append(f"{what} refused: {error}")
    return out


def _ask(
    source: DecisionSource, stopper: Stopper, ask: Callable[[], dict[str, Any] | None]
) -> dict[str, Any] | None:
    if not source.interactive:
        return ask()
    try:
        with stopper.prompt():  # a signal must break out of a blocking prompt
            return ask()
    except KeyboardInterrupt:
        return None


def _answer(
    pending: list[PendingInterrupt], source: DecisionSource, agent: Agent, stopper: Stopper
) -> _Answers | None:
    """Ask ``source`` about each pending interrupt; bind each answer to the one it was read for.

    Interrupts left unanswered stay pending (each interrupt is answered on its
    own). A decisions file's answers pinned to reviews that are not pending
    go along too: the agent returns the recorded outcome or refuses them.
    """
    answers = _Answers()
    for item in pending:
        value = item.value
        if item.kind == "review":
            given = _review(item, source, agent, stopper)
            if given is not None:
                answers.answers[item.id] = bind_decisions(value, given)
            continue
        if item.kind == "question":
            # A tool's own question: only a decisions file naming its id answers it.
            if isinstance(source, FileDecisions):
                found, reply = source.question(item.id)
                if found:
                    answers.answers[item.id] = reply
            continue
        op_id = str(value.get("operation_id"))
        op = agent.ledger.get(op_id)
        if op is not None and op.state.value != "NEEDS_RECONCILIATION":
            continue  # settled by ``effectgate reconcile``; the agent re-reads the ledger
        verdict = _ask(source, stopper, partial(source.verdict, value))
        if verdict is not None:
            answers.answers[item.id] = verdict
    if isinstance(source, FileDecisions):
        # answers to calls neither shown now nor recorded wait for their own, later review
        shown = {
            str(action.get("operation_id"))
            for item in pending
            if item.kind == "review"
            for action in item.value.get("action_requests", [])
        }
        _leftover(
            source,
            answers,
            ahead=lambda op_id: op_id not in shown and agent.ledger.get(op_id) is None,
        )
    if not answers.answers and answers.decisions is None:
        return None
    return answers


def _review(item: PendingInterrupt, source: DecisionSource, agent: Agent, stopper: Stopper) -> Any:
    """The answer ``source`` gives to the review ``item`` (``None``: left unanswered)."""
    value = item.value
    if isinstance(source, FileDecisions):
        return source.review(value, item.id)
    if isinstance(source, TerminalReviewer):
        # a person sees the model's stated reason; edits are checked by the tool's schema
        context = review_context(agent, value)
        return _ask(source, stopper, partial(source.review, value, context))
    return _ask(source, stopper, partial(source.review, value))


def _leftover(
    source: FileDecisions, answers: _Answers, ahead: Callable[[str], bool] | None = None
) -> None:
    """The file's answers to interrupts not pending go to the agent, which judges them.

    ``ahead`` (``FileDecisions.leftover``) keeps the answers to calls not proposed yet.
    """
    for interrupt_id, given in source.take_unused_answers().items():
        answers.answers.setdefault(interrupt_id, given)
    for entry in source.leftover(ahead):
        pinned = entry.pop("interrupt_id", None)
        if pinned is not None:
            answers.answers[pinned] = entry
        elif answers.decisions is None:
            answers.decisions = entry
        else:
            raise DecisionError(
                "decisions file: more than one answer matches no pending review; "
                "pin them with interrupt_id; nothing ran"
            )


def judge_unused_verdicts(
    agent: Agent,
    source: DecisionSource,
    say: Say,
    pending: Sequence[PendingInterrupt] = (),
) -> None:
    """Judge a decisions file's verdicts that nothing asked for (``answers.settle_verdict``).

    The same verdict as the one recorded for the operation is reported
    ("already decided"); a different one raises, and the refusal is in the
    ledger. A verdict for an operation still parked elsewhere is left (noted).

    Args:
        agent: the agent whose ledger holds the operations.
        source: the run's decision source (only a ``FileDecisions`` has verdicts).
        say: tells the person what became of each verdict.
        pending: what the thread waits on now, named in a refusal.

    Raises:
        DecisionError: a verdict contradicts the recorded one (exit 2).
    """
    if not isinstance(source, FileDecisions):
        return
    for op_id, given in source.take_unused_verdicts().items():
        outcome = settle_verdict(agent.ledger, op_id, validate_verdict(given), pending=pending)
        if outcome is None:
            say(f"decisions file: verdict for {op_id} not used (nothing here asked for it)")
        else:
            say(outcome.describe())


def judge_leftover(
    agent: Agent, thread_id: str, source: DecisionSource, say: Say
) -> RunResult | None:
    """Hand a decisions file's answers to reviews no longer pending to the agent.

    The same answer as the recorded one is reported ("already decided") and
    the thread goes on; a contradicting one raises.

    Returns:
        The thread after the answers were judged, or ``None`` if there were none.

    Raises:
        DecisionError: an answer contradicts the recorded decision, or names
            a review this thread never showed.
    """
    if not isinstance(source, FileDecisions):
        return None
    stale = _Answers()
    _leftover(source, stale)
    if not stale.answers and stale.decisions is None:
        return None
    result = agent.resume(thread_id, answers=stale.answers or None, decisions=stale.decisions)
    for line in result.already_decided:
        say(line)
    return result


def _fingerprint(pending: list[PendingInterrupt]) -> str:
    return json.dumps([[item.id, item.value] for item in pending], sort_keys=True, default=str)


def drive(
    agent: Agent,
    result: RunResult,
    source: DecisionSource,
    *,
    stopper: Stopper,
    say: Say,
) -> Driven:
    """Answer interrupts and resume until the thread is done or nobody can answer.

    A non-interactive source whose answer the graph refuses ends the loop
    with the refusal (the caller exits 2); a person at a terminal is shown
    the refusal and asked again.

    Args:
        agent: the agent the thread runs on.
        result: where the first ``start`` / ``resume`` left the thread.
        source: where answers come from.
        stopper: the signal handler; no new round starts once it saw a signal.
        say: where notes go.

    Returns:
        The thread's state when the loop stopped, and any refusal.

    Raises:
        DecisionError: an answer did not fit the request, or a strict source
            answered only part of it; nothing ran for that round.
        ThreadBusyError: another runner took the thread meanwhile.
    """
    answered: set[str] = set()
    for _ in range(_MAX_ROUNDS):
        if stopper.requested:
            return Driven(result)
        if not result.interrupts:
            with stopper.running(agent):
                judged = judge_leftover(agent, result.thread_id, source, say)
            if judged is None:
                return Driven(result)
            result = judged
            continue
        key = _fingerprint(result.interrupts)
        if key in answered:
            say("the same request came back after it was answered; leaving it pending")
            return Driven(result)
        answers = _answer(result.interrupts, source, agent, stopper)
        if answers is None:
            return Driven(result)
        answered.add(key)
        with stopper.running(agent):
            result = agent.resume(
                result.thread_id, answers=answers.answers or None, decisions=answers.decisions
            )
        for line in result.already_decided:
            say(line)
        refused = refusals(result)
        if refused and not source.interactive:
            return Driven(result, refused)
    say(f"stopped after {_MAX_ROUNDS} review rounds; resume to continue")
    return Driven(result)


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
        return f"{getattr(message, 'name', None) or node}: {tool_line(str(message.content))}"
    return f"model: {content}"
