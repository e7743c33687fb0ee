"""Every answer rule's refusal is written once, in ``effectgate.answers`` (issue #34).

The review node, the runner, the CLI and the workers call the rule instead of
re-checking it. Before, "N decisions for N calls" was written in ``answers``
and again in ``graph/_review``; "edit needs edited_action" three times
(answers, graph/_review, cli/_decisions); the answer's shape three times. A
copy that drifts says one thing from the CLI and another from the graph.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate import answers

SRC = Path(__file__).resolve().parents[2] / "src" / "effectgate"
HOME = SRC / "answers"
"""The package ``effectgate.answers``: every module of it is the rules' home."""


def _home_text() -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(HOME.rglob("*.py")))


RULES = [
    ("decision(s) for", answers.check_decision_count),
    ("needs edited_action", answers.edited_args),
    ("is not allowed for", answers.check_decision_allowed),
    ("a review answer must look like", answers.review_decisions),
    ("name its calls in another order", answers.check_review_answer),
    ("must be an object, got", answers.decision_object),
    ("needs a message: the answer for the model", answers.respond_text),
    ("was lost with the server's checkpoints", answers.refuse_resume_of_lost_review),
    ("run to its end (its run was stopped", answers.refuse_resume_of_step_left),
]


@pytest.mark.parametrize(("text", "rule"), RULES, ids=[t for t, _ in RULES])
def test_an_answer_rule_is_written_only_in_its_home(text: str, rule: object) -> None:
    """The refusal text appears in the answers package and in no other module of the library."""
    elsewhere = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if HOME not in path.parents and text in path.read_text(encoding="utf-8")
    ]
    assert elsewhere == [], f"{text!r} is also written in {elsewhere}: call {rule}"
    assert text in _home_text()


def test_the_home_is_a_package_of_small_modules() -> None:
    """``effectgate.answers`` is a package (issue #34); no module of it passes 800 lines."""
    assert not (SRC / "answers.py").exists()
    sizes = {
        p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(HOME.glob("*.py"))
    }
    assert len(sizes) > 1 and max(sizes.values()) < 800, sizes


def test_the_rules_refuse_as_documented() -> None:
    """Each rule, called directly, refuses with its text (the callers rely on it)."""
    from effectgate.errors import DecisionError

    with pytest.raises(DecisionError, match=r"2 decision\(s\) for 1 pending call\(s\)"):
        answers.check_decision_count(2, 1)
    answers.check_decision_count(1, 1)
    with pytest.raises(DecisionError, match="edit of c1 needs edited_action"):
        answers.edited_args({"type": "edit", "edited_action": {"name": "x"}}, "edit of c1")
    assert answers.edited_args({"edited_action": {"args": {}}}, "e") == {"args": {}}
    with pytest.raises(DecisionError, match=r"'edit' is not allowed for t \(c1\); allowed: reject"):
        answers.check_decision_allowed("edit", ["reject"], tool="t", call_id="c1")
    answers.check_decision_allowed("respond", ["reject"], tool="t", call_id="c1")
    with pytest.raises(DecisionError, match="must look like"):
        answers.review_decisions({"decision": []})
    assert answers.review_decisions({"decisions": [{"type": "approve"}]}) == [{"type": "approve"}]
