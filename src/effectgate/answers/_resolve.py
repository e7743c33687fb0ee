"""One answer each, and a client's answers mapped onto what is pending, never guessed."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from effectgate.answers._decisions import _named_ids, _order_problem, check_review_answer
from effectgate.answers._resume import check_resume_ids
from effectgate.answers._shown_flags import bind_shown_flags
from effectgate.answers._texts import (
    AnswerOutcome,
    PendingLike,
    _shown,
    answer_summary,
    describe_pending,
)
from effectgate.answers._verdicts import settle_verdict, validate_verdict
from effectgate.errors import (
    DecisionError,
)
from effectgate.ledger import Ledger, OpState

__all__ = ["OneAnswerEach", "Resolution", "resolve"]


_NOT_PART_OF_THE_ANSWER = frozenset({"reviewer", "interrupt_id"})


_BINDING = ("tool_call_id", "operation_id", "intent_hash")


def _answer_key(value: Any) -> str:
    """Canonical text of an answer for comparison; who gave it and what binds it aside."""
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in _NOT_PART_OF_THE_ANSWER}
        if isinstance(value.get("decisions"), list):
            value["decisions"] = [
                {k: v for k, v in d.items() if k not in _BINDING} if isinstance(d, Mapping) else d
                for d in value["decisions"]
            ]
    return json.dumps(value, sort_keys=True, default=repr)


class OneAnswerEach:
    """One input, one answer per thing: a repeat is one answer, a contradiction is refused.

    A decisions file, or the ``answers``, ``decisions`` and ``verdicts`` given
    to one ``Agent.resume`` call, may name one review, call, operation or
    question more than once. Which of two different answers was meant cannot
    be known, so the whole input is refused; applying the last one (a dict
    update) would run a call a reject in the same input was meant to stop.

    Args:
        where: names the input in refusals (``decisions file F``).
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._seen: dict[str, tuple[str, str, Any]] = {}

    def add(self, thing: str, value: Any, source: str) -> bool:
        """Note that ``source`` answers ``thing`` with ``value``.

        Args:
            thing: what is answered, as named in refusals (``review ID``,
                ``call OP``, ``operation OP``, ``question ID``).
            value: the answer (compared without ``reviewer`` or ``interrupt_id``).
            source: where in the input it was given (``entry 0``, ``answers``).

        Returns:
            ``True`` the first time ``thing`` is answered, ``False`` for the
            same answer again (a repeat, to be used once).

        Raises:
            DecisionError: ``thing`` already has a different answer; the
                message names both, in one line. Nothing ran.
        """
        key = _answer_key(value)
        seen = self._seen.get(thing)
        if seen is None:
            self._seen[thing] = (key, source, value)
            return True
        if seen[0] == key:
            return False
        raise DecisionError(
            f"{self.where}: two different answers for {thing}: {seen[1]} gives "
            f"{answer_summary(seen[2])}, {source} gives {answer_summary(value)}; which one "
            "was meant is unknown, so neither is used"
        )


@dataclass(slots=True)
class Resolution:
    """How a client's answers map onto what is pending."""

    resume: dict[str, Any] = field(default_factory=dict)
    """Interrupt id -> resume value, for the pending interrupts answered."""
    stale: list[tuple[str | None, Mapping[str, Any]]] = field(default_factory=list)
    """Review answers bound to nothing pending: (interrupt id named or ``None``, answer)."""
    settled: list[AnswerOutcome] = field(default_factory=list)
    """Verdicts re-sent for operations already settled the same way (``settle_verdict``)."""


def _review_value(item: PendingLike, answer: Mapping[str, Any]) -> dict[str, Any]:
    check_review_answer(item.value, answer, what=f"review {item.id}")
    shown = _shown(item.value)
    clean = {k: v for k, v in bind_shown_flags(item.value, answer).items() if k != "interrupt_id"}
    return {
        **clean,
        "shown": [h for _, h in shown],
        "shown_operations": [o for o, _ in shown],
    }


def _verdict_value(item: PendingLike, given: Any, ledger: Ledger) -> dict[str, Any]:
    op_id = str(item.value.get("operation_id"))
    op = ledger.get(op_id)
    if op is not None and op.state is not OpState.NEEDS_RECONCILIATION:
        # Settled outside the graph (``effectgate reconcile``): the node re-reads it.
        return {"verdict": "ledger", "attempt": op.attempt}
    if not isinstance(given, Mapping):
        raise DecisionError(f"the verdict for {op_id} must be an object, got {given!r}")
    bound = {"attempt": item.value.get("attempt"), **given}
    return dict(validate_verdict(bound))


def resolve(
    pending: Sequence[PendingLike],
    *,
    ledger: Ledger,
    decisions: Mapping[str, Any] | None = None,
    verdicts: Mapping[str, Any] | None = None,
    answers: Mapping[str, Any] | None = None,
) -> Resolution:
    """Map a client's answers onto the pending interrupts, never guessing.

    Args:
        pending: the thread's open interrupts.
        ledger: read for operations settled outside the graph.
        decisions: one review answer, bound by ``"interrupt_id"`` or by each
            decision's ``operation_id`` and ``intent_hash``.
        verdicts: reconciliation verdicts by operation id.
        answers: interrupt id -> answer (a review answer or a verdict).

    Returns:
        The resume map for the interrupts answered (others stay pending), and
        the review answers that match nothing pending (for ``settle_stale``).

    Raises:
        DecisionError: an unbound review answer (the message lists what is
            pending), a verdict for an operation nothing asks about, or an
            answer of the wrong shape. Nothing is resumed.
        UnknownInterruptError: ``answers`` is an empty map (it names no interrupt).
    """
    by_id = {item.id: item for item in pending}
    if answers is not None and not answers:  # an empty map answers nothing
        check_resume_ids([], known=by_id, pending={i.id: i.value for i in pending})
    res = Resolution()
    # ``answers``, ``decisions`` and ``verdicts`` may name one interrupt twice:
    # the same answer is one answer, two different ones refuse the call.
    one = OneAnswerEach("Agent.resume")
    if decisions is not None and isinstance(decisions.get("interrupt_id"), str):
        one.add(f"review {decisions['interrupt_id']}", decisions, "decisions")
    for interrupt_id, answer in (answers or {}).items():
        item = by_id.get(interrupt_id)
        if item is None:
            if isinstance(answer, Mapping) and "decisions" in answer:
                if one.add(f"review {interrupt_id}", answer, f"answers[{interrupt_id}]"):
                    res.stale.append((interrupt_id, answer))
                continue
            raise DecisionError(
                f"interrupt {interrupt_id} is not pending; {describe_pending(pending)}"
            )
        if item.kind == "review":
            if not isinstance(answer, Mapping):
                raise DecisionError('a review answer must look like {"decisions": [...]}')
            one.add(f"review {item.id}", answer, f"answers[{interrupt_id}]")
            res.resume[item.id] = _review_value(item, answer)
        elif item.kind == "question":
            res.resume[item.id] = answer  # a tool's own question: its answer, unchanged
        else:
            value = _verdict_value(item, answer, ledger)
            one.add(f"reconciliation {item.id}", value, f"answers[{interrupt_id}]")
            res.resume[item.id] = value
    if decisions is not None:
        meant = decisions.get("interrupt_id")
        if not (meant in res.resume or any(i == meant for i, _ in res.stale)):
            _resolve_decisions(pending, decisions, res, one)
    _resolve_verdicts(pending, verdicts or {}, ledger, res, one)
    return res


def _resolve_verdicts(
    pending: Sequence[PendingLike],
    verdicts: Mapping[str, Any],
    ledger: Ledger,
    res: Resolution,
    one: OneAnswerEach,
) -> None:
    asked = {str(i.value.get("operation_id")): i for i in pending if i.kind == "reconciliation"}
    for op_id in sorted(set(verdicts) - set(asked)):
        # Not asked now: the same verdict again returns the recorded outcome.
        given = verdicts[op_id]
        outcome = None
        if ledger.get(op_id) is not None and isinstance(given, Mapping):
            outcome = settle_verdict(ledger, op_id, validate_verdict(given), pending=pending)
        if outcome is None:
            raise DecisionError(
                f"no pending reconciliation for operation {op_id} in this thread; "
                f"{describe_pending(pending)}"
            )
        res.settled.append(outcome)
    for op_id, given in verdicts.items():
        if op_id not in asked:
            continue
        item = asked[op_id]
        value = _verdict_value(item, given, ledger)
        one.add(f"reconciliation {item.id}", value, f"verdicts[{op_id}]")
        res.resume[item.id] = value
    # A reconciliation settled outside the graph (``effectgate reconcile``)
    # needs no answer: its node re-reads the ledger.
    for item in asked.values():
        if item.id not in res.resume:
            op = ledger.get(str(item.value.get("operation_id")))
            if op is not None and op.state is not OpState.NEEDS_RECONCILIATION:
                res.resume[item.id] = {"verdict": "ledger", "attempt": op.attempt}


def _resolve_decisions(
    pending: Sequence[PendingLike],
    decisions: Mapping[str, Any],
    res: Resolution,
    one: OneAnswerEach,
) -> None:
    reviews = [i for i in pending if i.kind == "review"]
    meant = decisions.get("interrupt_id")
    if meant is not None:
        for item in reviews:
            if item.id == meant:
                res.resume[item.id] = _review_value(item, decisions)
                return
        res.stale.append((str(meant), decisions))
        return
    named = _named_ids(decisions)
    if named is None:
        raise DecisionError(
            "this review answer names no review: give the interrupt id it answers "
            '("interrupt_id") or, in each decision, the "operation_id" and "intent_hash" '
            f"shown; this answer ran nothing. {describe_pending(pending)}"
        )
    for item in reviews:
        if _shown(item.value) == named:
            if one.add(f"review {item.id}", decisions, "decisions"):
                res.resume[item.id] = _review_value(item, decisions)
            return
    for item in reviews:
        problem = _order_problem(item.value, named, f"review {item.id}")
        if problem is not None:
            raise DecisionError(f"{problem}. {describe_pending(pending)}")
    res.stale.append((None, decisions))
