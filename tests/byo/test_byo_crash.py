"""Bring-your-own agents killed at a seam and resumed in a new process: nothing twice.

Three agents a user could already have, gated by effectgate: a hand-written
``StateGraph`` with its own state and model node (``add_effect_nodes``), the
same graph as a subgraph of a parent, and ``create_agent`` with
``EffectGateMiddleware`` (at every effectgate failpoint; the graphs, which
run ``build_agent``'s own nodes, at four). Each worker is killed, a new process
finishes the thread, and the ticket service's and mail sink's own rows, the
note's bytes, and every checkpoint's history are checked. Side by side, the
plain ``HumanInTheLoopMiddleware`` agent, killed after a write, writes again.
"""

from __future__ import annotations

import pytest

from effectgate import StateDir
from effectgate.cli import ExitCode
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing import Failpoint
from effectgate.testing.campaign import EFFECTGATE_SEAMS
from effectgate.testing.oracle import checkpoint_problems, world
from tests.byo.conftest import all_checkpoint_problems, run_byo

pytestmark = pytest.mark.crash

NOTE = "incidents/orders-error-rate.md"
VARIANTS = ("graph", "subgraph", "middleware")

FAST = f"{Failpoint.AFTER_EXTERNAL_COMMIT}@create_ticket"
"""The seam every variant is killed at in a quick run; the others are ``slow``."""
SEAMS = {
    # the middleware is a dispatch path of its own: every seam
    "middleware": EFFECTGATE_SEAMS,
    # the user graph and the subgraph run build_agent's own nodes (tests/crash walks
    # every seam there); these check the user's state, routing and namespaces
    "graph": (
        f"{Failpoint.AFTER_REVIEW_RECORDED}#2",
        FAST,
        f"{Failpoint.AFTER_LEDGER_RESULT}@send_email",
        f"{Failpoint.MID_SUPERSTEP}",
    ),
    "subgraph": (
        f"{Failpoint.AFTER_REVIEW_RECORDED}#1",
        FAST,
        f"{Failpoint.AFTER_IN_FLIGHT_COMMIT}@write_file",
        f"{Failpoint.MID_SUPERSTEP}",
    ),
}


def assert_done_once(sd: StateDir, thread: str) -> None:
    """One ticket, one mail, the note's approved bytes, all SUCCEEDED, every history valid."""
    w = world(sd)
    assert (w.tickets, w.mails) == (1, 1), w.as_dict()
    assert (w.duplicate_tickets, w.duplicate_mails) == (0, 0), w.as_dict()
    with SqliteLedger(sd.ledger) as ledger:
        ops = ledger.list(thread_id=thread)
        note = next(op for op in ops if op.tool == "write_file")
        assert w.files == {NOTE: note.args["content"].encode()}
        assert {op.tool: op.state for op in ops} == {
            t: OpState.SUCCEEDED for t in ("create_ticket", "send_email", "write_file")
        }
        assert ledger.list(states=[OpState.IN_FLIGHT, OpState.UNKNOWN]) == []
    assert checkpoint_problems(sd.checkpoints, thread) == []
    assert all_checkpoint_problems(sd.checkpoints, thread) == []


def _params() -> list[object]:
    out: list[object] = []
    for variant in VARIANTS:
        for seam in SEAMS[variant]:
            marks = [] if seam == FAST else [pytest.mark.slow]
            out.append(pytest.param(variant, seam, marks=marks, id=f"{variant}-{seam}"))
    return out


@pytest.mark.parametrize(("variant", "seam"), _params())
def test_kill_at_seam_then_resume(
    services: DemoServices, state_dir: StateDir, variant: str, seam: str
) -> None:
    """Killed at a seam, finished by a new process: the external systems saw each write once."""
    first = run_byo(state_dir, variant, "t1", failpoint=seam)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    second = run_byo(state_dir, variant, "t1")
    assert second.returncode == 0, second.stderr[-2000:]
    assert_done_once(state_dir, "t1")
    assert services.stats("tickets")["tickets"] == 1


@pytest.mark.parametrize("tool", ["create_ticket", "send_email"])
def test_plain_hitl_agent_writes_twice_after_a_kill(
    services: DemoServices, state_dir: StateDir, tool: str
) -> None:
    """The same agent with HumanInTheLoopMiddleware: killed after a write, the resume repeats it.

    This is the behaviour ``EffectGateMiddleware`` removes (the test above,
    variant ``middleware``); it shows the comparison is not vacuous.
    """
    first = run_byo(state_dir, "hitl", "t1", kill_after=tool)
    assert first.returncode == ExitCode.KILLED, first.stderr[-2000:]
    second = run_byo(state_dir, "hitl", "t1")
    assert second.returncode == 0, second.stderr[-2000:]
    w = world(state_dir)
    if tool == "create_ticket":
        assert (w.tickets, w.duplicate_tickets) == (2, 1), w.as_dict()
    else:
        assert (w.mails, w.duplicate_mails) == (2, 0), w.as_dict()  # two Message-IDs
