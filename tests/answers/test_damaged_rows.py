"""A ledger row that fails validation is reported where it matters and stops nothing else.

The row is damaged behind the ledger's back (its write-once triggers off): a
later call of the same intent cannot be checked against it, so the review
says so and no policy approves it alone; the other threads go on.
"""

from __future__ import annotations

from effectgate import StateDir
from effectgate.answers import REVIEW_FLAGS, flag_text, flags_of
from effectgate.cli._decisions import BlanketDecisions
from effectgate.graph import Policy, RunStatus
from tests._damage import damage_sqlite_arguments
from tests.answers.test_binding import APPROVE, _agent, _files, _write


def test_a_call_of_a_damaged_rows_intent_is_flagged_and_never_approved_by_policy(
    state_dir: StateDir,
) -> None:
    same = _write("a.txt", "alpha\n")
    policy = Policy(approval_ttl=None, auto_approve=frozenset({"write_file"}))
    with _agent(state_dir, [[same]]) as agent:
        (first,) = agent.start("write", thread_id="t").interrupts
        assert agent.resume("t", answers={first.id: APPROVE}).status is RunStatus.DONE
        (done,) = agent.ledger.list(thread_id="t")
    damage_sqlite_arguments(state_dir.ledger, done.operation_id)

    with _agent(state_dir, [[same]], policy=policy) as agent:
        # the policy approves write_file without asking, but not this one
        waiting = agent.start("write", thread_id="u")
        assert waiting.status is RunStatus.WAITING_REVIEW
        (review,) = waiting.interrupts
        (action,) = review.value["action_requests"]
        (row,) = action["unreadable_same_intent"]
        assert (row["operation_id"], row["thread_id"]) == (done.operation_id, "t")
        assert "intent hash" in row["reason"]
        assert flags_of(action) == ["unreadable_same_intent"]
        assert done.operation_id in flag_text(action, "unreadable_same_intent")
        notes: list[str] = []
        blanket = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
        assert blanket.review(review.value) is None
        assert "cannot be read" in notes[0] and "left for review" in notes[0]
        # a person who checked approves it explicitly
        assert agent.resume("u", answers={review.id: APPROVE}).status is RunStatus.DONE
    assert _files(state_dir) == {"a.txt": "alpha\n"}


def test_every_review_flag_has_words() -> None:
    """``flag_text`` speaks of each flag (a new one without words would raise KeyError)."""
    action = {flag: "x" for flag in REVIEW_FLAGS} | {"unreadable_same_intent": []}
    assert all(flag_text(action, flag) for flag in REVIEW_FLAGS)


def test_listing_commands_show_the_rest_and_name_the_damaged_row(state_dir: StateDir) -> None:
    """threads, pending and ledger list: the other threads listed, the damaged one named, exit 1.

    Before, each of them ended with the one LedgerCorruptError line and listed
    nothing: one damaged row hid every thread of the state directory.
    """
    from tests.cli.conftest import eg

    same = _write("a.txt", "alpha\n")
    with _agent(state_dir, [[same]]) as agent:
        (first,) = agent.start("write", thread_id="t").interrupts
        assert agent.resume("t", answers={first.id: APPROVE}).status is RunStatus.DONE
        (done,) = agent.ledger.list(thread_id="t")
        assert agent.start("write", thread_id="u").status is RunStatus.WAITING_REVIEW
    with _agent(state_dir, [[_write("b.txt", "beta\n")]]) as agent:
        (other,) = agent.start("write", thread_id="v").interrupts
        assert agent.resume("v", answers={other.id: APPROVE}).status is RunStatus.DONE
    damage_sqlite_arguments(state_dir.ledger, done.operation_id)
    sd = ["--state-dir", str(state_dir.root)]

    threads = eg("threads", *sd, "--json")
    assert threads.code == 1, threads.stderr
    assert {t["thread_id"]: t["status"] for t in threads.json["threads"]} == {
        "t": "unreadable",
        "u": "waiting_review",
        "v": "done",
    }
    shown = eg("threads", *sd)
    text = " ".join(shown.stdout.split())
    assert shown.code == 1 and f"unreadable thread t: operation '{done.operation_id}'" in text
    assert "Traceback" not in shown.stderr + shown.stdout

    pending = eg("pending", *sd, "--json")
    assert pending.code == 1, pending.stderr
    assert [w["thread_id"] for w in pending.json["threads"]] == ["u"]
    assert list(pending.json["unreadable_threads"]) == ["t"]

    listed = eg("ledger", "list", *sd, "--json")
    assert listed.code == 1, listed.stderr
    assert [op["thread_id"] for op in listed.json["operations"]] == ["v"]
    assert [d["operation_id"] for d in listed.json["damaged"]] == [done.operation_id]
    only_v = eg("ledger", "list", *sd, "--thread", "v", "--json")
    assert only_v.code == 0 and only_v.json["damaged"] == []
