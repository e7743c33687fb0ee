"""The review screen's edit loop in-process: fallbacks, cancel, and what is kept on a refusal.

A ``TerminalReviewer`` on a ``SafeConsole`` writing to a string, with a scripted
line reader that records every prompt and its prefill; the tool is the real
``write_file`` spec, so refusals come from its own schema.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectgate.cli._render import SafeConsole
from effectgate.cli._review_ui import ReviewContext, TerminalReviewer, stated_reason
from effectgate.tools.builtin.files import file_tools


class Lines:
    """A line reader answering from a list; records ``(prompt, prefill)`` of each read."""

    def __init__(self, answers: list[str]) -> None:
        self.answers: Iterator[str] = iter(answers)
        self.asked: list[tuple[str, str]] = []

    def __call__(self, prompt: str, prefill: str) -> str:
        self.asked.append((prompt, prefill))
        try:
            return next(self.answers)
        except StopIteration:
            raise EOFError from None


Setup = tuple[TerminalReviewer, Lines, io.StringIO, Any]


def _setup(tmp_path: Path, answers: list[str]) -> Setup:
    (spec,) = [t for t in file_tools(tmp_path) if t.name == "write_file"]
    args = spec.normalize({"path": "a.txt", "content": "alpha\n"})
    request = {
        "type": "review",
        "thread_id": "t",
        "action_requests": [
            {
                "name": "write_file",
                "args": spec.args_dict(args),
                "tool_call_id": "c1",
                "operation_id": "t:c1",
                "intent_hash": "0" * 64,
                "effect_kind": "idempotent",
                "preview": spec.render_preview(args),
            }
        ],
        "review_configs": [{"allowed_decisions": ["approve", "edit", "reject"]}],
    }

    def check(tool: str, raw: Any, operation_id: str | None) -> tuple[dict[str, Any], str]:
        parsed = spec.normalize(raw)
        return spec.args_dict(parsed), spec.render_preview(parsed)

    screen = io.StringIO()
    console = SafeConsole(file=screen, width=200, color_system=None)
    lines = Lines(answers)
    reviewer = TerminalReviewer(console, reviewer="me", read=lines)
    context = ReviewContext(reason="Because.", check=check)
    return reviewer, lines, screen, (request, context)


def _review(reviewer: TerminalReviewer, request: Any) -> Any:
    return reviewer.review(*request)


def test_a_schema_refusal_at_the_prompt_offers_the_typed_text_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    refused = '{"path": "../outside.txt", "content": "x"}'
    fixed = '{"path": "b.txt", "content": "x"}'
    reviewer, lines, screen, request = _setup(tmp_path, ["e", refused, ".", fixed, ".", "y"])
    answer = _review(reviewer, request)
    assert answer["decisions"] == [
        {
            "type": "edit",
            "tool_call_id": "c1",
            "edited_action": {"name": "write_file", "args": {"path": "b.txt", "content": "x"}},
        }
    ]
    text = screen.getvalue()
    assert "refused by the tool's schema" in text and "Because." in text
    # the second time, the prompt is prefilled with what was typed, not the original
    prefills = [fill for prompt, fill in lines.asked if prompt == "args> "]
    assert prefills[0] == json.dumps({"path": "a.txt", "content": "alpha\n"})
    assert json.loads(prefills[1]) == json.loads(refused)


def test_cancel_goes_back_to_the_decision_and_respond_needs_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EDITOR", raising=False)
    monkeypatch.delenv("VISUAL", raising=False)
    answers = ["edit", '{"path": "a.txt", "content": "beta"}', ".", "cancel"]
    answers += ["respond", "", "respond", "no need"]
    reviewer, _, screen, request = _setup(tmp_path, answers)
    answer = _review(reviewer, request)
    assert answer["decisions"] == [{"type": "respond", "tool_call_id": "c1", "message": "no need"}]
    text = screen.getvalue()
    assert "edit cancelled; choose again" in text and "no answer given" in text
    assert "[approve/edit/reject/respond/quit]" in text


def test_a_missing_editor_falls_back_to_the_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.setenv("EDITOR", str(tmp_path / "no-such-editor") + " --wait")
    typed = ["e", '{"path": "c.txt", "content": "c"}', ".", "y"]
    reviewer, _, screen, request = _setup(tmp_path, typed)
    answer = _review(reviewer, request)
    assert answer["decisions"][0]["edited_action"]["args"] == {"path": "c.txt", "content": "c"}
    assert "cannot run the editor" in screen.getvalue()


def test_an_editor_that_fails_cancels_the_edit_and_keeps_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDITOR", f"{sys.executable} -c 'raise SystemExit(3)'")
    reviewer, _, screen, request = _setup(tmp_path, ["e", "a"])
    answer = _review(reviewer, request)
    assert answer["decisions"] == [{"type": "approve", "tool_call_id": "c1"}]
    assert "exited with status 3" in screen.getvalue()


def test_stated_reason_is_the_message_that_made_the_calls() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    history = [
        HumanMessage("go"),
        AIMessage("first", tool_calls=[{"name": "x", "args": {}, "id": "a"}]),
        AIMessage("second", tool_calls=[{"name": "x", "args": {}, "id": "b"}]),
        AIMessage("done"),
    ]
    assert stated_reason(history, {"a"}) == "first"
    assert stated_reason(history, {"b", "zz"}) == "second"
    assert stated_reason(history, {"zz"}) is None
