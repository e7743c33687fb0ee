"""The transition table, exhaustively: every allowed and every refused pair."""

from __future__ import annotations

import itertools
import pickle

import pytest

from effectgate.errors import IllegalTransitionError
from effectgate.ledger import TERMINAL, TRANSITIONS, UNFINISHED, OpState, check_transition

S = OpState

# Written out independently of _model.TRANSITIONS (docs/architecture.md,
# "Operation states"; four pairs are explained in the TRANSITIONS docstring),
# so that an edit to the table fails here.
ALLOWED = {
    (S.PROPOSED, S.APPROVED),
    (S.PROPOSED, S.REJECTED),
    (S.APPROVED, S.IN_FLIGHT),
    (S.APPROVED, S.PROPOSED),
    (S.APPROVED, S.REJECTED),
    (S.APPROVED, S.FAILED),
    (S.IN_FLIGHT, S.SUCCEEDED),
    (S.IN_FLIGHT, S.FAILED),
    (S.IN_FLIGHT, S.RETRY_WAIT),
    (S.IN_FLIGHT, S.UNKNOWN),
    (S.RETRY_WAIT, S.IN_FLIGHT),
    (S.RETRY_WAIT, S.FAILED),
    (S.RETRY_WAIT, S.NEEDS_RECONCILIATION),
    (S.UNKNOWN, S.SUCCEEDED),
    (S.UNKNOWN, S.RETRY_WAIT),
    (S.UNKNOWN, S.NEEDS_RECONCILIATION),
    (S.UNKNOWN, S.FAILED),
    (S.NEEDS_RECONCILIATION, S.SUCCEEDED),
    (S.NEEDS_RECONCILIATION, S.FAILED),
    (S.NEEDS_RECONCILIATION, S.RETRY_WAIT),
}
ALL_PAIRS = list(itertools.product(OpState, OpState))
REFUSED = [pair for pair in ALL_PAIRS if pair not in ALLOWED]


def test_the_states_are_exactly_the_nine_of_the_issue() -> None:
    """OpState has the nine operation states, spelled as stored."""
    assert [s.value for s in OpState] == [
        "PROPOSED",
        "APPROVED",
        "REJECTED",
        "IN_FLIGHT",
        "SUCCEEDED",
        "FAILED",
        "RETRY_WAIT",
        "UNKNOWN",
        "NEEDS_RECONCILIATION",
    ]


def test_table_matches_the_written_out_pairs() -> None:
    """TRANSITIONS holds exactly the allowed pairs, with every state as a key."""
    assert set(TRANSITIONS) == set(OpState)
    assert {(src, dst) for src, dsts in TRANSITIONS.items() for dst in dsts} == ALLOWED


@pytest.mark.parametrize(("src", "dst"), sorted(ALLOWED))
def test_allowed_pair_passes(src: OpState, dst: OpState) -> None:
    """An allowed pair raises nothing."""
    check_transition("op-1", src, dst)


@pytest.mark.parametrize(("src", "dst"), REFUSED)
def test_refused_pair_raises_naming_operation_and_states(src: OpState, dst: OpState) -> None:
    """A refused pair raises IllegalTransitionError naming the operation and both states."""
    with pytest.raises(IllegalTransitionError) as info:
        check_transition("op-1", src, dst)
    err = info.value
    assert (err.operation_id, err.src, err.dst) == ("op-1", src.value, dst.value)
    assert "'op-1'" in str(err) and f"{src.value} -> {dst.value}" in str(err)


def test_counts_cover_every_pair() -> None:
    """Allowed plus refused is all 81 pairs; no self-loops are allowed."""
    assert len(ALLOWED) + len(REFUSED) == 81
    assert all(src != dst for src, dst in ALLOWED)


def test_terminal_states_have_no_way_out_and_unfinished_is_the_rest() -> None:
    """SUCCEEDED, FAILED, REJECTED are terminal; every other state has a way out."""
    assert {S.SUCCEEDED, S.FAILED, S.REJECTED} == TERMINAL
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert set(OpState) - TERMINAL == UNFINISHED
    assert all(TRANSITIONS[s] for s in UNFINISHED)


def test_every_state_is_reachable_from_proposed() -> None:
    """Every state can be reached from PROPOSED, so none is dead code."""
    seen, todo = {S.PROPOSED}, [S.PROPOSED]
    while todo:
        for nxt in TRANSITIONS[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    assert seen == set(OpState)


def test_illegal_transition_error_survives_pickling() -> None:
    """The error crosses process boundaries with its fields intact."""
    err = IllegalTransitionError(operation_id="op-1", src="PROPOSED", dst="SUCCEEDED")
    back = pickle.loads(pickle.dumps(err))
    assert (back.operation_id, back.src, back.dst, str(back)) == (
        "op-1",
        "PROPOSED",
        "SUCCEEDED",
        str(err),
    )
