"""``refuse_resume_before_run``'s two served cases, called directly (the server tests drive them).

A thread with tasks next and no interrupt (a run stopped inside its step),
and a thread with no checkpoint on a graph that knows its ledger.
"""

from __future__ import annotations

import pytest

from effectgate.errors import UnknownInterruptError
from effectgate.graph._review_resume import refuse_resume_before_run

OLD = "0123456789abcdef0123456789abcdef"


def _refusal(resume: object, **kwargs: object) -> str:
    with pytest.raises(UnknownInterruptError) as refused:
        refuse_resume_before_run(resume, writes=[], **kwargs)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_tasks_next_and_no_interrupt_refuse_any_resume() -> None:
    keyed = _refusal({OLD: {"decisions": [{"type": "reject"}]}}, next_tasks=("effect.x",))
    assert f"interrupt '{OLD}' is not pending on this thread" in keyed
    assert "effect.x" in keyed and "Run the thread with no input" in keyed
    plain = _refusal({"decisions": [{"type": "reject"}]}, next_tasks=("effect.x",))
    assert "names no interrupt that waits" in plain and "effect.x" in plain


def test_no_checkpoint_with_the_threads_operations_in_the_ledger_is_a_lost_review() -> None:
    answer = {OLD: {"decisions": [{"type": "approve"}]}}
    lost = _refusal(answer, next_tasks=(), lost_operations=["t:call_1"])
    assert "lost with the server's checkpoints" in lost and "t:call_1" in lost
    assert "mistyped" not in lost and OLD in lost
    unknown = _refusal(answer, next_tasks=(), lost_operations=[])
    assert "records no operation of it" in unknown and "mistyped" in unknown
    # Without a ledger (a graph of your own), the words of a thread that waits on nothing.
    plain = _refusal(answer, next_tasks=(), lost_operations=None)
    assert "is not pending on this thread" in plain and "lost" not in plain


def test_a_run_sent_again_from_a_checkpoint_whose_interrupt_was_answered_goes_on() -> None:
    """Time travel or a server's retry: the step's interrupt was recorded and answered there."""
    from langgraph._internal._constants import INTERRUPT, RESUME
    from langgraph.types import Interrupt

    writes = [
        ("task-1", INTERRUPT, [Interrupt(value={"type": "review"}, id=OLD)]),
        ("task-1", RESUME, [{"decisions": [{"type": "approve"}]}]),
    ]
    answer = {OLD: {"decisions": [{"type": "approve"}]}}
    refuse_resume_before_run(answer, next_tasks=("review",), writes=writes)
    other = "f" * 32
    with pytest.raises(UnknownInterruptError, match=f"interrupt '{other}' is not pending"):
        refuse_resume_before_run({other: {}}, next_tasks=("review",), writes=writes)
