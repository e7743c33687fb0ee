"""Every answer binds to what was shown: unbound, partial, repeated and contradicting answers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from effectgate import StateDir, open_agent
from effectgate.errors import DecisionError
from effectgate.graph import Agent, Policy, RunStatus
from effectgate.ledger import EventKind, OpState
from effectgate.models import ScriptedChatModel
from effectgate.testing import FakeClock
from tests.cli.conftest import eg, write_script

APPROVE = {"decisions": [{"type": "approve"}], "reviewer": "ann"}
REJECT = {"decisions": [{"type": "reject", "message": "no"}], "reviewer": "bob"}


def _write(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "args": {"path": path, "content": content}}


@contextmanager
def _agent(sd: StateDir, turns: list[list[dict[str, Any]]], **kwargs: Any) -> Iterator[Agent]:
    script = {
        "name": "answers",
        "turns": [{"say": f"step {n}", "tool_calls": calls} for n, calls in enumerate(turns)],
        "final": "Done.",
    }
    kwargs.setdefault("policy", Policy(approval_ttl=None))
    with open_agent(sd, model=ScriptedChatModel.from_script(script), **kwargs) as agent:
        yield agent


def _files(sd: StateDir) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(sd.workspace.iterdir())}


# -- an unbound answer never lands on another review ---------------------------------------


def test_an_answer_naming_no_review_is_refused_and_names_what_waits(state_dir: StateDir) -> None:
    """Review A answered; the same bare answer re-sent while B (an overwrite) waits: refused."""
    turns = [[_write("a.txt", "alpha\n")], [_write("a.txt", "")]]
    with _agent(state_dir, turns) as agent:
        shown = agent.start("write", thread_id="t")
        waiting_b = agent.resume("t", answers={shown.interrupts[0].id: APPROVE})
        (review_b,) = waiting_b.interrupts
        with pytest.raises(DecisionError, match="names no review") as refused:
            agent.resume("t", decisions=APPROVE)
        assert review_b.id in str(refused.value)
        assert agent.status("t").interrupts[0].id == review_b.id
    assert _files(state_dir) == {"a.txt": "alpha\n"}  # B's overwrite never ran


def test_an_answer_bound_by_operation_and_intent_is_applied(state_dir: StateDir) -> None:
    with _agent(state_dir, [[_write("a.txt", "alpha\n")]]) as agent:
        (review,) = agent.start("write", thread_id="t").interrupts
        (action,) = review.value["action_requests"]
        named = {k: action[k] for k in ("operation_id", "intent_hash")}
        done = agent.resume("t", decisions={"decisions": [{"type": "approve", **named}]})
        assert done.status is RunStatus.DONE
        stale = {"decisions": [{"type": "approve", **named, "intent_hash": "0" * 64}]}
        with pytest.raises(DecisionError):
            agent.resume("t", decisions=stale)
    assert _files(state_dir) == {"a.txt": "alpha\n"}


def test_cli_decisions_file_naming_no_review_exits_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = write_script(tmp_path / "s.json", [_write("a.txt", "alpha\n")])
    ran = eg(
        "run",
        "write",
        "--thread",
        "write",
        "--model",
        f"scripted:{script}",
        "--state-dir",
        str(state),
    )
    assert ran.code == 4, ran.stderr
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"decisions": [{"type": "approve"}]}))
    refused = eg("resume", "--state-dir", str(state), "--thread", "write", "--decisions", str(bare))
    thread = json.loads(eg("threads", "--state-dir", str(state), "--json").stdout)
    assert refused.code == 2, refused.stdout + refused.stderr
    assert "names no review" in " ".join(refused.stderr.split())
    assert not (state / "workspace" / "a.txt").exists()
    assert thread


# -- several pending interrupts, each answered on its own -----------------------------------


def _three_expired(agent: Agent, clock: FakeClock) -> list[Any]:
    """Three calls approved, paused after the review, then their approvals expire."""
    turns_first = agent.start("write", thread_id="t")
    (review,) = turns_first.interrupts
    agent.graph.invoke(
        Command(resume={review.id: {"decisions": [{"type": "approve"}] * 3}}),
        {"configurable": {"thread_id": "t"}},
        interrupt_after=["review"],
        durability="sync",
    )
    clock.advance(timedelta(seconds=3))
    return agent.resume("t").interrupts


def test_several_pending_reviews_are_answered_one_by_one(state_dir: StateDir) -> None:
    clock = FakeClock()
    calls = [[_write(f"{n}.txt", f"{n}\n") for n in "abc"]]
    policy = Policy(approval_ttl=timedelta(seconds=2))
    with _agent(state_dir, calls, policy=policy, clock=clock) as agent:
        pending = _three_expired(agent, clock)
        assert len(pending) == 3 and {p.kind for p in pending} == {"review"}
        assert _files(state_dir) == {}
        first = agent.resume("t", answers={pending[0].id: APPROVE})
        # a partial answer leaves the other two pending, with the ids they had
        assert sorted(i.id for i in first.interrupts) == sorted(p.id for p in pending[1:])
        assert len(_files(state_dir)) == 1
        rest = {p.id: (APPROVE if n == 0 else REJECT) for n, p in enumerate(pending[1:])}
        done = agent.resume("t", answers=rest)
        assert done.status is RunStatus.DONE, done
        states = sorted(op.state.value for op in agent.ledger.list(thread_id="t"))
    assert states == ["REJECTED", "SUCCEEDED", "SUCCEEDED"]
    assert len(_files(state_dir)) == 2


def test_cli_approve_all_answers_several_pending_reviews(state_dir: StateDir) -> None:
    calls = [[_write(f"{n}.txt", f"{n}\n") for n in "abc"]]
    script = state_dir.root.parent / "three.json"
    script.write_text(
        json.dumps({"name": "three", "turns": [{"say": "x", "tool_calls": calls[0]}]})
    )
    policy = Policy(approval_ttl=timedelta(seconds=1))
    model = ScriptedChatModel.from_script(json.loads(script.read_text()))
    with open_agent(state_dir, model=model, policy=policy) as agent:
        (review,) = agent.start(
            "write", thread_id="t", metadata={"model": f"scripted:{script}"}
        ).interrupts
        agent.graph.invoke(
            Command(resume={review.id: {"decisions": [{"type": "approve"}] * 3}}),
            {"configurable": {"thread_id": "t"}},
            interrupt_after=["review"],
            durability="sync",
        )
    time.sleep(1.2)
    sd = ["--state-dir", str(state_dir.root)]
    ran = eg("resume", *sd, "--thread", "t", "--approve", "all", "--json")
    assert ran.code == 0, ran.stdout + ran.stderr
    assert sorted(p.name for p in state_dir.workspace.iterdir()) == ["a.txt", "b.txt", "c.txt"]


# -- a repeated answer returns the recorded outcome; a contradicting one is refused ---------


def test_the_same_answer_again_returns_the_recorded_outcome(state_dir: StateDir) -> None:
    with _agent(state_dir, [[_write("a.txt", "alpha\n")]]) as agent:
        (review,) = agent.start("deploy", thread_id="t").interrupts
        assert agent.resume("t", answers={review.id: APPROVE}).status is RunStatus.DONE
        again = agent.resume("t", answers={review.id: APPROVE})
        assert again.status is RunStatus.DONE
        assert again.already_decided and "approve" in again.already_decided[0]
        with pytest.raises(DecisionError, match="already decided: approve by ann"):
            agent.resume("t", answers={review.id: REJECT})
        (op,) = agent.ledger.list(thread_id="t")
        notes = [
            e.detail
            for e in agent.ledger.events(operation_id=op.operation_id)
            if e.kind is EventKind.NOTE
        ]
    assert op.state is OpState.SUCCEEDED
    (refusal,) = [n for n in notes if "refused_answer" in n]
    assert refusal["refused_answer"]["decision"] == "reject"
    assert refusal["refused_answer"]["reviewer"] == "bob"
    assert "already decided" in refusal["reason"]
    assert _files(state_dir) == {"a.txt": "alpha\n"}


def test_cli_same_decisions_file_twice_exits_0_a_contradiction_exits_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sd = ["--state-dir", str(state)]
    script = write_script(tmp_path / "s.json", [_write("a.txt", "alpha\n")])
    assert eg("run", "write", "--model", f"scripted:{script}", *sd, "--thread", "t").code == 4
    (item,) = eg("pending", *sd, "--json").json["threads"][0]["interrupts"]
    approve = tmp_path / "approve.json"
    approve.write_text(json.dumps({**APPROVE, "interrupt_id": item["id"]}))
    first = eg("resume", *sd, "--thread", "t", "--decisions", str(approve))
    assert first.code == 0, first.stderr
    again = eg("resume", *sd, "--thread", "t", "--decisions", str(approve))
    assert again.code == 0, again.stderr
    assert "already decided" in again.stderr
    reject = tmp_path / "reject.json"
    reject.write_text(json.dumps({**REJECT, "interrupt_id": item["id"]}))
    refused = eg("resume", *sd, "--thread", "t", "--decisions", str(reject))
    assert refused.code == 2, refused.stderr
    assert "already decided: approve" in " ".join(refused.stderr.split())
    assert (state / "workspace" / "a.txt").read_text() == "alpha\n"
