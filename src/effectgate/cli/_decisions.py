"""Where review decisions and reconciliation verdicts come from, without a terminal.

A ``DecisionSource`` answers one pending interrupt at a time: ``review`` for a
review request (``{"decisions": [...], "reviewer": ...}``) and ``verdict`` for
a reconciliation request. ``None`` means "no answer": the run stops and the
thread waits, which is always safe (nothing runs unreviewed).

Sources: ``--approve all|none`` (``BlanketDecisions``), ``--decisions FILE``
(``FileDecisions``, validated in full before anything runs), an interactive
terminal (``effectgate.cli._review_ui.TerminalReviewer``), or nobody
(``NoDecisions``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from effectgate._untrusted import parse_json, read_regular_file
from effectgate.answers import (
    OneAnswerEach,
    bind_decisions,
    blanket_answer,
    decision_object,
    edited_args,
    flag_text,
    respond_text,
    verdict_attempt_problem,
)
from effectgate.cli._render import dumps, terminal_safe
from effectgate.errors import DecisionError

__all__ = [
    "BlanketDecisions",
    "DecisionSource",
    "FileDecisions",
    "NoDecisions",
    "load_decisions_file",
]

_ENTRY_KEYS = frozenset({"answers", "decisions", "interrupt_id", "reviewer", "verdicts"})
_BOUND_ENTRY = '{"interrupt_id": "...", "decisions": [...]}'
"""Where a review answer's ``interrupt_id`` goes, as the refusals show it."""
_DECISION_KEYS = frozenset(
    {"type", "edited_action", "message", "tool_call_id", "operation_id", "intent_hash"}
)
_TYPES = ("approve", "edit", "reject", "respond")

Say = Callable[[str], None]
"""Tells the person what a source decided on their behalf (stderr)."""


class DecisionSource(Protocol):
    """Answers pending interrupts; ``None`` leaves the thread waiting."""

    interactive: bool
    """A person answers as the run goes: a refused answer is asked again, not fatal."""
    strict: bool
    """Answering only part of what is pending is bad input (exit 2), not a wait."""

    def review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return the resume value for one review request, or ``None``."""
        ...

    def verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return the verdict for one reconciliation request, or ``None``."""
        ...


class NoDecisions:
    """Answers nothing: the run stops at the first interrupt (no TTY, no flags)."""

    interactive = False
    strict = False

    def review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Leave the review pending."""
        return None

    def verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Leave the reconciliation pending."""
        return None


class BlanketDecisions:
    """``--approve all`` or ``--approve none``: one answer for every call.

    ``all`` approves unsafe calls too, because the person asked for it, but
    says so for each. It never approves a possible duplicate of an operation
    that already succeeded (the same write again, perhaps from another run)
    nor a call whose allowed decisions exclude approval (a conflicting
    operation id): the whole request is left for a person, with a note saying
    why. Reconciliation is never answered: no blanket verdict is safe.

    Args:
        approve: ``True`` for ``all``, ``False`` for ``none``.
        reviewer: recorded on the approvals.
        say: where notes go (a request left for a person, and why).
        warn: where the warning for each UNSAFE call approved goes (default ``say``).
    """

    interactive = False
    strict = False

    def __init__(self, *, approve: bool, reviewer: str, say: Say, warn: Say | None = None) -> None:
        self.approve = approve
        self.reviewer = reviewer
        self.say = say
        self.warn = warn or say
        """Where "approving UNSAFE call" goes (default ``say``): a warning, not a review left."""

    def review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Approve (or reject) every call of the request, or ``None`` if one cannot be.

        The rule is ``answers.blanket_answer``; this says why a review is left.
        """
        wanted = "approve" if self.approve else "reject"
        flag = "--approve " + ("all" if self.approve else "none")
        given = blanket_answer(
            request, approve=self.approve, reviewer=self.reviewer, message=f"rejected by {flag}"
        )
        if self.approve:
            # each call read before the one that stops it was warned about, as it was approved
            for read in request.get("action_requests", []):
                if read is given.left:
                    break
                self._warn(flag, f"{read['name']} ({read['operation_id']})", read)
        action = given.left
        if action is not None:
            label = f"{action['name']} ({action['operation_id']})"
            if given.flags:
                self.say(
                    f"{flag}: {label} is {' and '.join(flag_text(action, f) for f in given.flags)}"
                    " — approve it explicitly with --decisions or interactively; left for review"
                )
                return None
            conflict = action.get("conflict")
            why = ""
            if isinstance(conflict, Mapping) and conflict.get("compacted") is not None:
                why = (
                    f": its operation id is bound to other arguments, compacted by "
                    f"retention (state {conflict.get('stored_state')}; the arguments are no "
                    "longer kept); reject it, or edit it to arguments that map to another id"
                )
            elif isinstance(conflict, Mapping):
                why = (
                    f": its operation id is bound to other arguments (stored "
                    f"{dumps(conflict.get('stored_args'))}, state "
                    f"{conflict.get('stored_state')}); edit the call to them, or reject it"
                )
            self.say(
                f"{flag}: cannot {wanted} {label} (allowed: {', '.join(given.allowed)}){why}; "
                "left for review"
            )
            return None
        return given.answer

    def verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Leave every reconciliation to a human, and say so."""
        self.say(
            f"--approve never settles an unknown outcome: {request.get('tool')} "
            f"({request.get('operation_id')}) needs a verdict (--decisions, a terminal, "
            "or effectgate reconcile); left pending"
        )
        return None

    def _warn(self, flag: str, label: str, action: Mapping[str, Any]) -> None:
        if action.get("effect_kind") == "unsafe":
            self.warn(
                f"{flag}: approving UNSAFE call {label}; if its outcome is lost it "
                "can only end as needs-reconciliation"
            )


class FileDecisions:
    """``--decisions FILE``: review answers bound to their reviews, verdicts by operation id.

    Every review answer names the review it answers (``interrupt_id``, or
    each decision's ``operation_id`` and ``intent_hash``); it is handed out
    only for that review. Each verdict is used once, for the attempt it was
    asked about: one ``retry`` authorises one attempt.

    Args:
        entries: the validated entries of ``load_decisions_file``.
        reviewer: recorded when an entry names no reviewer.
        say: where notes go (a pending reconciliation the file does not answer).
    """

    interactive = False
    strict = True

    def __init__(
        self, entries: list[dict[str, Any]], *, reviewer: str, say: Say = lambda text: None
    ) -> None:
        self._reviews = [entry for entry in entries if "decisions" in entry]
        self._index: dict[int, int | str] = {id(e): n for n, e in enumerate(entries)}
        self.reviews_given = len(self._reviews)
        """How many review answers the file holds."""
        self._verdicts: dict[str, dict[str, Any]] = {}
        for entry in entries:
            self._verdicts.update(entry.get("verdicts", {}))
        self._given_verdicts = sorted(self._verdicts)
        self._questions: dict[str, Any] = {}
        for entry in entries:
            self._questions.update(entry.get("answers", {}))
        self._used: set[str] = set()
        self.reviewer = reviewer
        self.say = say

    @property
    def reviews_used(self) -> int:
        """How many of the file's review answers were handed out so far."""
        return self.reviews_given - len(self._reviews)

    @property
    def verdict_operations(self) -> list[str]:
        """The operation ids the file holds verdicts for, sorted."""
        return list(self._given_verdicts)

    @property
    def unused_verdicts(self) -> list[str]:
        """Operation ids whose verdict no pending reconciliation asked for, sorted."""
        return sorted(set(self._given_verdicts) - self._used)

    def review(
        self, request: Mapping[str, Any], interrupt_id: str | None = None
    ) -> dict[str, Any] | None:
        """Return the file's answer bound to this review, or ``None`` if it has none."""
        shown = [(a.get("operation_id"), a.get("intent_hash")) for a in request["action_requests"]]
        matching = []
        for index, entry in enumerate(self._reviews):
            pinned = entry.get("interrupt_id")
            named = [(d.get("operation_id"), d.get("intent_hash")) for d in entry["decisions"]]
            if (pinned is not None and pinned == interrupt_id) or (
                pinned is None and named == shown
            ):
                matching.append((index, entry))
        if interrupt_id is not None and interrupt_id in self._questions:
            # ``{"answers": {review_id: {"decisions": [...]}}}``: the shape
            # ``Agent.resume(answers=...)`` takes, checked as an entry is.
            given = self._questions.pop(interrupt_id)
            where = f'decisions file: "answers" for review {interrupt_id}'
            if not isinstance(given, Mapping) or "decisions" not in given:
                raise DecisionError(
                    f'{where}: a review answer is {{"decisions": [...]}}; nothing ran'
                )
            inner = given.get("interrupt_id", interrupt_id)
            if inner != interrupt_id:
                raise DecisionError(
                    f"{where}: it names another review ({terminal_safe(str(inner))}); nothing ran"
                )
            entry = {**given, "interrupt_id": interrupt_id}
            _check_entry(entry, where)
            self._index[id(entry)] = f'"answers" {interrupt_id}'
            self._reviews.append(entry)
            matching.append((len(self._reviews) - 1, entry))
        if not matching:
            return None
        # One entry may name the review by its id, another by its calls: two
        # different answers to it refuse the file (raised before it is resumed).
        one = OneAnswerEach("decisions file")
        for _, entry in matching:
            one.add(f"review {interrupt_id}", entry, f"entry {self._index[id(entry)]}")
        for _, entry in matching:
            self._reviews.remove(entry)
        return self._answer(matching[0][1], request)

    def leftover(self, ahead: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        """The review answers no pending review took, each as given (with its binding).

        Args:
            ahead: tells an operation id no review has shown yet (the ledger
                holds no such operation). An answer bound by its calls'
                operation ids, all of them ahead, answers a later review of
                the same run (a file answering successive reviews): it stays
                for that review instead of being judged now. ``None``: every
                answer is returned (the run is over).

        Returns:
            The answers taken out of the file; answers kept for later reviews stay.
        """
        out = []
        kept = []
        one = OneAnswerEach("decisions file")
        for entry in self._reviews:
            thing = f"review {entry.get('interrupt_id')}" if "interrupt_id" in entry else None
            if thing is None:
                ops = [str(d.get("operation_id")) for d in entry["decisions"]]
                if ahead is not None and all(ahead(op_id) for op_id in ops):
                    kept.append(entry)
                    continue
                thing = f"the review of {', '.join(ops)}"
            if one.add(thing, entry, f"entry {self._index[id(entry)]}"):
                decisions = list(entry["decisions"])
                out.append({"reviewer": self.reviewer, **entry, "decisions": decisions})
        self._reviews = kept
        return out

    def _answer(self, entry: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
        actions = request.get("action_requests", [])
        decisions = [dict(d) for d in entry["decisions"]]
        for decision, action in zip(decisions, actions, strict=False):
            edited = decision.get("edited_action")
            if isinstance(edited, dict) and "name" not in edited:
                decision["edited_action"] = {"name": action["name"], **edited}
        answer = {"decisions": decisions, "reviewer": entry.get("reviewer", self.reviewer)}
        return bind_decisions(request, answer)

    def take_unused_answers(self) -> dict[str, Any]:
        """The ``answers`` no pending interrupt took, by id, once: the agent judges them."""
        out, self._questions = self._questions, {}
        return out

    def take_unused_verdicts(self) -> dict[str, dict[str, Any]]:
        """The verdicts no pending reconciliation asked for, each with the file's reviewer, once."""
        out = {
            op_id: {"reviewer": self.reviewer, **self._verdicts.pop(op_id)}
            for op_id in sorted(set(self._verdicts) - self._used)
        }
        self._used.update(out)
        return out

    def question(self, interrupt_id: str) -> tuple[bool, Any]:
        """The file's answer to a tool's question, by interrupt id, once.

        Returns:
            ``(True, answer)`` if the file answers it (the answer may be any
            JSON value, ``null`` included), else ``(False, None)``.
        """
        if interrupt_id not in self._questions:
            return False, None
        return True, self._questions.pop(interrupt_id)

    def verdict(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """Return the file's verdict for the request's operation once, bound to its attempt."""
        op_id = str(request.get("operation_id"))
        given = self._verdicts.pop(op_id, None)
        if given is None:
            self.say(
                f"decisions file: no verdict for {op_id}"
                + (" (its verdict was used for an earlier attempt)" if op_id in self._used else "")
            )
            return None
        self._used.add(op_id)
        problem = verdict_attempt_problem(op_id, given.get("attempt"), request.get("attempt"))
        if problem is not None:
            self.say(f"decisions file: {problem}")
            return None
        return {"reviewer": self.reviewer, "attempt": request.get("attempt"), **given}


def load_decisions_file(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a decisions file before anything runs.

    Accepted shapes: ``{"decisions": [...], "reviewer": "...",
    "interrupt_id": "..."}`` (the review with that id, from ``effectgate
    pending --json``; or, instead of ``interrupt_id``, each decision names
    the ``operation_id`` and ``intent_hash`` shown), a list of such objects
    (several reviews), or
    ``{"verdicts": {operation_id: verdict}}``, or ``{"answers":
    {interrupt_id: value}}`` (the answer to a tool's own question, delivered
    to the tool as given); an object may hold several.

    Args:
        path: the JSON file.

    Returns:
        The entries, in order.

    Raises:
        DecisionError: unreadable file, invalid JSON, a wrong shape, or a
            review answer that names no review; the message names the place.
    """
    try:
        data = parse_json(read_regular_file(path), unique_keys=True)  # bounded; no repeated key
    except (OSError, UnicodeDecodeError) as exc:
        raise DecisionError(f"decisions file {path}: cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise DecisionError(f"decisions file {path}: invalid JSON: {exc}") from exc
    entries = data if isinstance(data, list) else [data]
    if not entries:
        raise DecisionError(f"decisions file {path}: empty list")
    for index, entry in enumerate(entries):
        _check_entry(entry, f"decisions file {path}, entry {index}")
    try:
        _check_one_answer_each(entries, f"decisions file {path}")
    except DecisionError as exc:
        raise DecisionError(f"{exc}; the file is refused as a whole, nothing ran") from None
    return [dict(entry) for entry in entries]


def _check_one_answer_each(entries: list[dict[str, Any]], where: str) -> None:
    """Refuse a file that answers one review, call, operation or question two ways.

    The same answer twice is allowed (it is used once). Which of two
    different answers was meant cannot be known: the file is refused whole,
    before anything runs (``effectgate.answers.OneAnswerEach``).
    """
    one = OneAnswerEach(where)
    for index, entry in enumerate(entries):
        source = f"entry {index}"
        if "decisions" in entry:
            if "interrupt_id" in entry:
                one.add(f"review {entry['interrupt_id']}", entry, source)
            for decision in entry["decisions"]:
                if decision.get("operation_id"):
                    one.add(f"call {decision['operation_id']}", {"decisions": [decision]}, source)
        for op_id, verdict in entry.get("verdicts", {}).items():
            one.add(f"operation {op_id}", verdict, source)
        for interrupt_id, answer in entry.get("answers", {}).items():
            one.add(f"question {interrupt_id}", answer, source)


def _check_entry(entry: Any, where: str) -> None:
    decision_object(entry, where)  # the one shape rule: an entry is an object too
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise DecisionError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_ENTRY_KEYS)}")
    if "decisions" not in entry and "verdicts" not in entry and "answers" not in entry:
        raise DecisionError(f'{where}: needs "decisions", "verdicts" or "answers"')
    if "answers" in entry and (
        not isinstance(entry["answers"], dict)
        or not entry["answers"]
        or not all(isinstance(k, str) for k in entry["answers"])
    ):
        raise DecisionError(
            f'{where}: "answers" must map question interrupt ids (from "effectgate pending '
            '--json") to answers'
        )
    if "reviewer" in entry and not isinstance(entry["reviewer"], str):
        raise DecisionError(f"{where}: reviewer must be a string")
    if "interrupt_id" in entry and (
        not isinstance(entry["interrupt_id"], str) or "decisions" not in entry
    ):
        raise DecisionError(
            f'{where}: interrupt_id must be a string (from "effectgate pending --json") '
            'and comes with "decisions"'
        )
    if "decisions" in entry:
        decisions = entry["decisions"]
        if not isinstance(decisions, list) or not decisions:
            raise DecisionError(f'{where}: "decisions" must be a non-empty list')
        for number, decision in enumerate(decisions):
            _check_decision(decision, f"{where}, decision {number}")
        bound = all(d.get("operation_id") and d.get("intent_hash") for d in decisions)
        if "interrupt_id" not in entry and not bound:
            raise DecisionError(
                f'{where}: names no review: give the review\'s "interrupt_id" (from '
                f'"effectgate pending --json") beside "decisions", as {_BOUND_ENTRY}, or '
                '"operation_id" and "intent_hash" in each decision; '
                "an answer is never applied to a review it does not name"
            )
    if "verdicts" in entry:
        _check_verdicts(entry["verdicts"], where)


def _check_decision(given: Any, where: str) -> None:
    decision = decision_object(given, where)
    unknown = sorted(set(decision) - _DECISION_KEYS)
    if "interrupt_id" in unknown:
        raise DecisionError(
            f'{where}: "interrupt_id" names the whole review, so it goes beside "decisions", '
            f"not inside a decision: {_BOUND_ENTRY}"
        )
    if unknown:
        raise DecisionError(f"{where}: unknown key(s) {unknown}")
    kind = decision.get("type")
    if kind not in _TYPES:
        raise DecisionError(f"{where}: type must be one of {', '.join(_TYPES)}; got {kind!r}")
    if kind == "edit":
        edited_args(decision, f"{where}: edit")
    if "message" in decision and not isinstance(decision["message"], str):
        raise DecisionError(f"{where}: message must be a string")
    if kind == "respond":
        respond_text(decision, f"{where}: respond")


def _check_verdicts(verdicts: Any, where: str) -> None:
    from effectgate.dispatch import validate_verdict

    if not isinstance(verdicts, dict) or not verdicts:
        raise DecisionError(f'{where}: "verdicts" must map operation ids to verdicts')
    for op_id, verdict in verdicts.items():
        try:
            validate_verdict(verdict)
        except DecisionError as exc:
            raise DecisionError(f"{where}, verdict for {op_id!r}: {exc}") from exc
