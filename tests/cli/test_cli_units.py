"""The CLI's pure parts, in-process: exit-code table, failpoint flag, decision sources."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from effectgate.cli import ExitCode
from effectgate.cli._decisions import BlanketDecisions, FileDecisions, load_decisions_file
from effectgate.cli._exit import code_for_error, code_for_status
from effectgate.cli._session import check_failpoint, drive
from effectgate.cli._signals import Mode, Stopper
from effectgate.errors import (
    ClaimLostError,
    ConfigError,
    DecisionError,
    LedgerBusyError,
    LedgerCorruptError,
    ThreadBusyError,
    ToolCallError,
)
from effectgate.graph import PendingInterrupt, RunResult, RunStatus
from effectgate.testing import Failpoint


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ThreadBusyError(thread_id="t", owner="h:1:x", expires_in_s=3.0), 75),
        (LedgerBusyError("locked"), 75),
        # fenced off mid-call: another worker took the thread over
        (
            ClaimLostError(
                operation_id="o", attempt=1, current_attempt=1, current_state="SUCCEEDED"
            ),
            75,
        ),
        (ConfigError("bad"), 2),
        (DecisionError("bad"), 2),
        (LedgerCorruptError("bad row"), 1),
        (ToolCallError("no such tool", tool="x"), 1),
        (RuntimeError("boom"), 1),
    ],
)
def test_errors_map_to_documented_codes(exc: BaseException, code: int) -> None:
    """Each exception class ends the process with its documented code."""
    assert code_for_error(exc) == code


def test_every_run_status_has_an_exit_code() -> None:
    """No RunStatus falls through to the generic error code."""
    assert {s.value: int(code_for_status(s)) for s in RunStatus} == {
        "done": 0,
        "waiting_review": 4,
        "waiting_reconciliation": 3,
        "incomplete": 5,
        "not_started": 5,
    }
    assert ExitCode.KILLED == 137


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("mid_superstep", "MID_SUPERSTEP"),
        ("AFTER_IN_FLIGHT_COMMIT@create_ticket", "AFTER_IN_FLIGHT_COMMIT@create_ticket"),
        ("after_ledger_result#2", "AFTER_LEDGER_RESULT#2"),
        (None, None),
    ],
)
def test_crash_at_accepts_every_spec_form(spec: str | None, expected: str | None) -> None:
    """NAME, NAME@tool and NAME#n are accepted, the name case-insensitively."""
    assert check_failpoint(spec) == expected


@pytest.mark.parametrize("spec", ["NOPE", "MID_SUPERSTEP#0", "MID_SUPERSTEP#x", ""])
def test_crash_at_refuses_unknown_seams(spec: str) -> None:
    """Anything else is a ConfigError listing the seams."""
    with pytest.raises(ConfigError, match=Failpoint.MID_SUPERSTEP.value):
        check_failpoint(spec)


def _request(*kinds: str, allowed: list[str] | None = None) -> dict[str, Any]:
    actions = [
        {
            "name": f"tool{i}",
            "operation_id": f"op{i}",
            "intent_hash": f"h{i}",
            "tool_call_id": f"c{i}",
            "effect_kind": kind,
            "possible_duplicate_of": None,
            "args": {"n": i},
        }
        for i, kind in enumerate(kinds)
    ]
    configs = [
        {"action_name": a["name"], "allowed_decisions": allowed or ["approve", "edit", "reject"]}
        for a in actions
    ]
    return {"type": "review", "action_requests": actions, "review_configs": configs}


def test_approve_all_approves_unsafe_calls_and_says_so() -> None:
    """``--approve all`` answers every call, naming the unsafe one in a note."""
    notes: list[str] = []
    source = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
    answer = source.review(_request("keyed", "unsafe"))
    assert answer == {
        "reviewer": "r",
        "decisions": [  # each bound to the call, operation and intent it was read for
            {
                "type": "approve",
                "tool_call_id": "c0",
                "operation_id": "op0",
                "intent_hash": "h0",
                "flags_shown": [],
            },
            {
                "type": "approve",
                "tool_call_id": "c1",
                "operation_id": "op1",
                "intent_hash": "h1",
                "flags_shown": [],
            },
        ],
    }
    assert len(notes) == 1 and "UNSAFE" in notes[0] and "op1" in notes[0]
    assert source.verdict({"operation_id": "op1"}) is None


def test_blanket_answer_not_allowed_is_left_for_a_human() -> None:
    """A conflicting call cannot be approved: the whole request stays pending."""
    notes: list[str] = []
    source = BlanketDecisions(approve=True, reviewer="r", say=notes.append)
    conflicting = _request("keyed", allowed=["edit", "reject"])
    conflicting["action_requests"][0]["conflict"] = {
        "operation_id": "op0",
        "stored_args": {"n": 7},
        "stored_state": "SUCCEEDED",
    }
    assert source.review(conflicting) is None
    assert "left for review" in notes[0]
    # the note says why: the id is bound to other arguments, and which
    assert 'bound to other arguments (stored {"n": 7}, state SUCCEEDED)' in notes[0]
    rejecting = BlanketDecisions(approve=False, reviewer="r", say=notes.append)
    answer = rejecting.review(_request("keyed"))
    assert answer is not None and answer["decisions"][0]["type"] == "reject"
    # compacted by retention: no stored arguments to edit to, so none are advised
    conflicting["action_requests"][0]["conflict"] = {
        "operation_id": "op0",
        "stored_args": None,
        "stored_state": "SUCCEEDED",
        "compacted": {"operation_id": "op0"},
    }
    assert source.review(conflicting) is None
    assert "compacted by retention" in notes[-1] and "stored null" not in notes[-1]


def test_decisions_file_answers_the_reviews_it_names_and_verdicts_by_id(tmp_path: Path) -> None:
    """Each answer goes to the review it names; an edit without a name gets the call's name.

    A verdict is handed out once, bound to the attempt it was asked about.
    """
    path = tmp_path / "d.json"
    path.write_text(
        json.dumps(
            [
                {
                    "decisions": [{"type": "edit", "edited_action": {"args": {"n": 9}}}],
                    "interrupt_id": "i1",
                },
                {
                    "decisions": [{"type": "approve", "operation_id": "op0", "intent_hash": "h0"}],
                    "reviewer": "kim",
                },
                {"verdicts": {"op7": {"verdict": "succeeded", "reference": "TICKET-7"}}},
            ]
        )
    )
    source = FileDecisions(load_decisions_file(path), reviewer="cli")
    bound = {"tool_call_id": "c0", "operation_id": "op0", "intent_hash": "h0", "flags_shown": []}
    assert source.review(_request("keyed"), "other") == {
        "reviewer": "kim",
        "decisions": [{**bound, "type": "approve"}],
    }
    first = source.review(_request("keyed"), "i1")
    assert first == {
        "reviewer": "cli",
        "decisions": [
            {**bound, "type": "edit", "edited_action": {"name": "tool0", "args": {"n": 9}}}
        ],
    }
    assert source.review(_request("keyed"), "i1") is None
    assert source.verdict({"operation_id": "op7", "attempt": 1}) == {
        "reviewer": "cli",
        "verdict": "succeeded",
        "reference": "TICKET-7",
        "attempt": 1,
    }
    assert source.verdict({"operation_id": "op7", "attempt": 2}) is None  # used once
    assert source.verdict({"operation_id": "other"}) is None


def test_decisions_file_answer_naming_no_review_is_refused(tmp_path: Path) -> None:
    """``{"decisions": [{"type": "approve"}]}`` names no review: refused before anything runs."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"decisions": [{"type": "approve"}]}))
    with pytest.raises(DecisionError, match="names no review"):
        load_decisions_file(path)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "3",
        '{"decisions": []}',
        '{"decisions": [{"type": "edit"}]}',
        '{"decisions": [{"type": "approve", "extra": 1}]}',
        '{"verdicts": {"op": {"verdict": "retry"}}}',
        '{"decisions": [{"type": "approve"}], "reviewer": 5}',
    ],
)
def test_decisions_file_shapes_are_checked(tmp_path: Path, text: str) -> None:
    """Every malformed shape is a DecisionError naming the file."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DecisionError, match=r"bad\.json"):
        load_decisions_file(path)


def test_stopper_first_signal_asks_to_stop_and_the_second_aborts() -> None:
    """GRACEFUL: the first SIGTERM only asks (its note promises what is true); the second raises."""
    notes: list[str] = []
    stopper = Stopper()
    stopper.mode, stopper.say = Mode.GRACEFUL, notes.append
    stopper._handle(signal.SIGTERM, None)
    assert (stopper.requested, stopper.reason) == (True, "stopped by SIGTERM")
    assert notes == [
        "SIGTERM: stopping at the next step boundary (a second SIGTERM or Ctrl-C aborts now)"
    ]
    with pytest.raises(KeyboardInterrupt):
        stopper._handle(signal.SIGTERM, None)
    assert stopper.aborted_by == "SIGTERM"


def test_stopper_breaks_a_prompt_and_forwards_the_stop_to_a_run() -> None:
    """At a prompt the first signal raises; during a run it reaches ``request_stop``."""
    stopper = Stopper()
    stopper.mode = Mode.GRACEFUL
    with stopper.prompt(), pytest.raises(KeyboardInterrupt):
        stopper._handle(signal.SIGINT, None)

    class Run:
        def __init__(self) -> None:
            self.reasons: list[str] = []

        def request_stop(self, reason: str = "stop requested") -> None:
            self.reasons.append(reason)

    run = Run()
    with stopper.running(run):
        time.sleep(0.2)
    assert run.reasons and set(run.reasons) == {"stopped by SIGINT"}


_SWALLOWED = """
import gc, os, signal, sys, threading, time
from effectgate.cli._signals import Mode, Stopper

stopper = Stopper()
stopper.install()
stopper.mode = Mode.GRACEFUL

class Finalized:
    def __del__(self):  # the signal lands here: Python drops what the handler raises
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(0.5)

try:
    with stopper.prompt():
        Finalized()
        gc.collect()
        print("waiting at the prompt", flush=True)
        sys.stdin.readline()
    print("the prompt returned without a signal", flush=True)
except KeyboardInterrupt:
    print("prompt interrupted by", stopper.signal_name, "aborted:", stopper.aborted_by, flush=True)
"""


def test_a_signal_dropped_inside_a_finalizer_still_breaks_the_prompt() -> None:
    """A ``KeyboardInterrupt`` Python swallows ("Exception ignored in ...") is sent again.

    The first Ctrl-C at a review prompt used to be lost when it landed during
    a lazy import or a ``__del__``: the prompt waited on until a second one.
    """
    import subprocess
    import sys

    read_end, write_end = os.pipe()  # a prompt nobody types into: stdin stays open
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SWALLOWED],
            stdin=read_end,
            capture_output=True,
            text=True,
            timeout=20,
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert "Exception ignored" in done.stderr  # the first delivery really was dropped
    assert "prompt interrupted by SIGINT aborted: None" in done.stdout, done.stdout + done.stderr


class _FakeAgent:
    """Answers every resume by asking again with an error, as the review node does."""

    ledger = None

    def __init__(self) -> None:
        self.resumes = 0

    def resume(self, thread_id: str, **answers: Any) -> RunResult:
        self.resumes += 1
        return _waiting(error="edited arguments refused: no")

    def request_stop(self, reason: str = "") -> None:
        """Nothing runs, so nothing stops."""


def _waiting(error: str | None = None) -> RunResult:
    value: dict[str, Any] = dict(_request("keyed"))
    if error:
        value["error"] = error
    interrupt = PendingInterrupt(id=f"i{bool(error)}", value=value)
    return RunResult(thread_id="t", status=RunStatus.WAITING_REVIEW, interrupts=[interrupt])


def test_drive_stops_at_a_refusal_unless_a_person_answers() -> None:
    """A flag's refused answer ends the loop with the error; a terminal is asked again."""
    agent = _FakeAgent()
    blanket = BlanketDecisions(approve=True, reviewer="r", say=lambda text: None)
    driven = drive(agent, _waiting(), blanket, stopper=Stopper(), say=lambda text: None)  # type: ignore[arg-type]
    assert driven.refused == ["review answer refused: edited arguments refused: no"]
    assert agent.resumes == 1

    class Person(BlanketDecisions):
        interactive = True

    person = Person(approve=True, reviewer="r", say=lambda text: None)
    again = _FakeAgent()
    driven = drive(again, _waiting(), person, stopper=Stopper(), say=lambda text: None)  # type: ignore[arg-type]
    assert driven.refused == []
    assert again.resumes == 2  # asked again once; the same refusal twice ends the loop


def test_approve_all_never_approves_a_possible_duplicate() -> None:
    """A possible duplicate leaves the whole request for a person, with the reason."""
    notes: list[str] = []
    request = _request("keyed", "idempotent")
    request["action_requests"][1]["possible_duplicate_of"] = "op-earlier"
    assert BlanketDecisions(approve=True, reviewer="r", say=notes.append).review(request) is None
    assert notes == [
        "--approve all: tool1 (op1) is a possible duplicate of op-earlier — approve it "
        "explicitly with --decisions or interactively; left for review"
    ]


@pytest.mark.parametrize(
    ("flag", "value", "said", "on_screen"),
    [
        (
            "repeat_of_rejected",
            {"operation_id": "op-rejected", "reason": "wrong customer"},
            "a repeat of op-rejected, which a reviewer rejected (wrong customer)",
            None,
        ),
        (
            "replaced_by_edit",
            "op-edited",
            "a call a reviewer's edit replaced (operation op-edited)",
            None,
        ),
        (
            "compacted_operation",
            {"operation_id": "op1", "message": "operation op1 was compacted on 2026-01-01"},
            "an operation compacted by retention: operation op1 was compacted on 2026-01-01",
            "COMPACTED: operation op1 was compacted on 2026-01-01; the ledger no longer holds",
        ),
    ],
)
def test_every_review_flag_reads_the_same_on_the_screen_and_in_approve_alls_note(
    flag: str, value: Any, said: str, on_screen: str | None
) -> None:
    """One wording per flag (``answers.flag_text``): the blanket note and the review panel agree.

    The screen words three flags at length (``_review_ui._SPELLED_OUT``).

    The review screen used to show no warning at all for a repeat of a
    rejected call or a call an edit replaced.
    """
    import io

    from effectgate.cli._render import SafeConsole
    from effectgate.cli._review_ui import action_panel

    notes: list[str] = []
    request = _request("keyed", "idempotent")
    request["action_requests"][1][flag] = value
    assert BlanketDecisions(approve=True, reviewer="r", say=notes.append).review(request) is None
    assert notes == [
        f"--approve all: tool1 (op1) is {said} — approve it explicitly with --decisions or "
        "interactively; left for review"
    ]
    screen = io.StringIO()
    panel = action_panel(request["action_requests"][1], 2, 2)
    SafeConsole(file=screen, width=400, color_system=None).print(panel)
    shown = " ".join(screen.getvalue().replace("│", " ").split())
    assert (on_screen or said) in shown, shown


def test_the_cli_drops_langgraphs_missing_node_warning_only() -> None:
    """The command names a missing tool itself (exit 2); LangGraph's warning was noise before it."""
    import logging

    from effectgate.cli import _quiet_missing_node_warning

    logger = logging.getLogger("langgraph.pregel._algo")
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = _Keep()
    logger.addHandler(handler)
    before = list(logger.filters)
    try:
        _quiet_missing_node_warning()
        logger.warning("Ignoring unknown node name effect.send_email in pending sends")
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = before
    assert seen == ["something else"]


def test_a_run_stopped_by_a_busy_store_ends_as_busy_try_again(tmp_path: Path) -> None:
    """A node that met a lock or a database past its retries: exit 75, not 5 (incomplete).

    ``RunResult.cause`` carries the node's exception (the recovery test
    ``test_own_attempt`` shows a real held lock producing it); ``report``
    re-raises a ``LedgerBusyError`` so that the command ends with its one
    "busy, try again" line, as when the store is unreachable after the run
    too. Before, a database back before the command ended gave exit 5 with
    the error only as a note on stdout (found by a break test).
    """
    from effectgate import StateDir
    from effectgate.cli._output import Output
    from effectgate.cli._runner import report

    sd = StateDir.open(tmp_path / "state")
    cause = LedgerBusyError("ledger x: stayed unavailable for 1 s")
    result = RunResult(
        thread_id="t",
        status=RunStatus.INCOMPLETE,
        error=f"LedgerBusyError: {cause}",
        cause=cause,
    )
    with pytest.raises(LedgerBusyError) as raised:
        report(result, sd, Output(json_mode=False))
    assert raised.value is cause and code_for_error(raised.value) == ExitCode.BUSY
    other = RunResult(
        thread_id="t", status=RunStatus.INCOMPLETE, error="boom", cause=RuntimeError("boom")
    )
    assert report(other, sd, Output(json_mode=False)) == ExitCode.INCOMPLETE
