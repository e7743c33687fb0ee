"""One input, one answer per review, call, operation or question.

Two different answers to one thing in one ``Agent.resume`` call are refused
before anything resumes (the last one must not silently win); the same answer
twice is one answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from effectgate.answers import OneAnswerEach, resolve
from effectgate.errors import DecisionError
from effectgate.ledger import SqliteLedger


@dataclass(frozen=True)
class _Pending:
    id: str
    kind: str
    value: Mapping[str, Any] = field(default_factory=dict)


_REVIEW = _Pending(
    "i-review",
    "review",
    {
        "type": "review",
        "action_requests": [
            {
                "name": "send_email",
                "tool_call_id": "call-1",
                "operation_id": "mail:1",
                "intent_hash": "h1",
            }
        ],
        "review_configs": [
            {"action_name": "send_email", "allowed_decisions": ["approve", "reject"]}
        ],
    },
)
_PARKED = _Pending(
    "i-parked", "reconciliation", {"type": "reconciliation", "operation_id": "fax:1", "attempt": 1}
)
REJECT = {"decisions": [{"type": "reject", "message": "no"}]}
APPROVE = {"decisions": [{"type": "approve"}]}


@pytest.fixture()
def ledger(tmp_path: Path) -> Any:
    with SqliteLedger(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def test_answers_and_decisions_naming_one_review_differently_are_refused(ledger: Any) -> None:
    with pytest.raises(DecisionError) as refused:
        resolve(
            [_REVIEW],
            ledger=ledger,
            answers={"i-review": REJECT},
            decisions={**APPROVE, "interrupt_id": "i-review"},
        )
    text = str(refused.value)
    assert "two different answers for review i-review" in text
    assert "reject ('no')" in text and "approve" in text
    # bound by its calls instead of its id: the same refusal
    bound = {"decisions": [{"type": "approve", "operation_id": "mail:1", "intent_hash": "h1"}]}
    with pytest.raises(DecisionError, match="two different answers for review i-review"):
        resolve([_REVIEW], ledger=ledger, answers={"i-review": REJECT}, decisions=bound)


def test_the_same_answer_twice_is_one_answer(ledger: Any) -> None:
    res = resolve(
        [_REVIEW],
        ledger=ledger,
        answers={"i-review": {**REJECT, "reviewer": "ann"}},
        decisions={**REJECT, "interrupt_id": "i-review", "reviewer": "ann"},
    )
    assert list(res.resume) == ["i-review"]
    assert res.resume["i-review"]["decisions"] == REJECT["decisions"]
    assert res.stale == []


def test_two_different_verdicts_for_one_reconciliation_are_refused(ledger: Any) -> None:
    with pytest.raises(DecisionError, match="two different answers for reconciliation i-parked"):
        resolve(
            [_PARKED],
            ledger=ledger,
            answers={"i-parked": {"verdict": "failed"}},
            verdicts={"fax:1": {"verdict": "succeeded", "reference": "FAX-1"}},
        )
    same = resolve(
        [_PARKED],
        ledger=ledger,
        answers={"i-parked": {"verdict": "failed"}},
        verdicts={"fax:1": {"verdict": "failed"}},
    )
    assert same.resume == {"i-parked": {"verdict": "failed", "attempt": 1}}


def test_one_answer_each_names_both_answers_in_one_line() -> None:
    one = OneAnswerEach("decisions file f.json")
    assert one.add("review X", REJECT, "entry 0") is True
    assert one.add("review X", {**REJECT, "reviewer": "bo"}, "entry 2") is False
    with pytest.raises(DecisionError) as refused:
        one.add("review X", APPROVE, "entry 1")
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith("decisions file f.json: two different answers for review X: ")
    assert "entry 0 gives reject ('no'), entry 1 gives approve" in text
