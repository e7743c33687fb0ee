"""Hostile input on ``effectgate worker`` and its neighbours, in-process (``CliRunner``).

Each case asserts the documented exit code, one error line naming what was
wrong, no traceback, nothing written outside the state directory, and the
planted secret in neither SQLite file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from effectgate import StateDir
from effectgate.cli._app import app
from tests.hostile.conftest import Ran, World, assert_clean_error

BAD_INPUT = 2

ENDPOINTS: list[tuple[str, Callable[[Path], None]]] = [
    ("not-json", lambda p: p.write_text("{not json")),
    ("not-utf8", lambda p: p.write_bytes(b"\xff\xfe{}")),
    ("a-list", lambda p: p.write_text("[1, 2]")),
    ("missing-field", lambda p: p.write_text('{"ticket_url": "http://127.0.0.1:1"}')),
    (
        "wrong-type",
        lambda p: p.write_text(
            '{"ticket_url": 1, "smtp_host": "h", "smtp_port": "25", "mail_url": "u"}'
        ),
    ),
    *(
        (
            f"smtp-port-{port}",
            lambda p, port=port: p.write_text(
                '{"ticket_url": "http://127.0.0.1:1", "smtp_host": "127.0.0.1", '
                f'"smtp_port": {port}, "mail_url": "http://127.0.0.1:2"}}'
            ),
        )
        for port in (99999, -1, 0)
    ),
    ("a-directory", lambda p: p.mkdir()),
    ("a-fifo", lambda p: __import__("os").mkfifo(p)),
]


@pytest.mark.parametrize(("name", "damage"), ENDPOINTS, ids=[n for n, _ in ENDPOINTS])
def test_damaged_service_endpoints_stop_the_worker_in_one_line(
    world: World, name: str, damage: Callable[[Path], None]
) -> None:
    """A damaged ``services/endpoints.json``: one line naming it, exit 2, nothing run."""
    sd = StateDir.open(world.state)
    sd.services.mkdir(parents=True, exist_ok=True)
    damage(sd.services / "endpoints.json")
    ran = world.run("worker", "--until-idle")
    assert_clean_error(ran, BAD_INPUT, "endpoints.json")
    world.assert_outside_untouched()
    world.assert_no_secret_stored()


FACTORIES: list[tuple[str, str, str]] = [
    ("tools-of-strings", "return {'tools': ['read_file']}", "tools[0]"),
    ("tools-of-none", "return {'tools': [None]}", "tools[0]"),
    ("model-int", "return {'tools': [], 'model': 42}", "model must be"),
    ("policy-dict", "return {'tools': [], 'policy': {'x': 1}}", "policy must be"),
    ("prompt-list", "return {'tools': [], 'system_prompt': ['a']}", "system_prompt"),
    ("duplicate-names", "return {'tools': [*file_tools('.'), *file_tools('.')]}", "two tools"),
    ("exit-3", "sys.exit(3)", "sys.exit(3)"),
    ("exit-4", "sys.exit(4)", "sys.exit(4)"),
    ("exit-message", "sys.exit('bye')", "sys.exit"),
    # a BaseException subclass that is neither SystemExit nor KeyboardInterrupt: was a traceback
    ("base-exception", "raise type('Boom', (BaseException,), {})('boom')", "Boom: boom"),
    ("generator-exit", "raise GeneratorExit", "GeneratorExit"),
]


@pytest.mark.parametrize(("name", "body", "fragment"), FACTORIES, ids=[f[0] for f in FACTORIES])
def test_hostile_agent_factory_is_one_line_exit_2(
    world: World, monkeypatch: pytest.MonkeyPatch, name: str, body: str, fragment: str
) -> None:
    """A factory of the wrong shape, or one that exits: one line, exit 2 (never 3 or 4)."""
    module = f"hostile_factory_{name.replace('-', '_')}"
    code = "import sys\nfrom effectgate.tools.builtin import file_tools\n\n"
    code += f"def build():\n    {body}\n"
    (world.root / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(world.root))
    ran = world.run("worker", "--until-idle", "--agent", f"{module}:build")
    assert_clean_error(ran, BAD_INPUT, fragment)
    world.assert_outside_untouched()
    world.assert_no_secret_stored()


def test_agent_module_that_exits_on_import_is_one_line_exit_2(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.exit(3)`` at import time: one line, exit 2."""
    (world.root / "hostile_exit_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(world.root))
    ran = world.run("worker", "--until-idle", "--agent", "hostile_exit_on_import:build")
    assert_clean_error(ran, BAD_INPUT, "sys.exit(3)")


@pytest.mark.parametrize("processes", ["65", "100000", "0", "-1"])
def test_processes_out_of_bounds_is_one_line_exit_2(world: World, processes: str) -> None:
    """``--processes`` past ``MAX_PROCESSES`` (or below 1): refused before any process starts."""
    ran = world.run("worker", "--until-idle", "--processes", processes)
    assert_clean_error(ran, BAD_INPUT, "--processes")
    assert not world.state.exists()  # refused before the state directory is opened


NOT_UTF8 = b"fix \xff\xfe it".decode("utf-8", "surrogateescape")
"""What Python makes of argv bytes that are not UTF-8 (lone surrogates)."""


@pytest.mark.parametrize(
    "args",
    [
        ["run", NOT_UTF8, "--model", "scripted:incident"],
        ["run", "a task", "--model", "scripted:incident", "--thread", NOT_UTF8],
        ["run", "a task", "--model", "scripted:incident", "--reviewer", NOT_UTF8],
        ["resume", "--thread", NOT_UTF8],
        # before, each of these ended in a UnicodeEncodeError traceback
        ["ledger", "show", NOT_UTF8],
        ["ledger", "list", "--tool", NOT_UTF8],
        ["reconcile", NOT_UTF8, "--failed"],
        ["reconcile", "op-1", "--succeeded", NOT_UTF8],
        ["reconcile", "op-1", "--failed", "--evidence", NOT_UTF8],
        ["lease", "break", "--thread", "t", "--reason", NOT_UTF8],
        ["lease", "break", "--thread", "t", "--reason", "r", "--by", NOT_UTF8],
        ["run", "a task", "--model", "scripted:incident", "--request-id", NOT_UTF8],
        ["run", "a task", "--model", "openai:m", "--base-url", NOT_UTF8],
    ],
    ids=[
        "message",
        "thread",
        "reviewer",
        "resume-thread",
        "ledger-show",
        "ledger-list-tool",
        "reconcile-operation",
        "reconcile-succeeded",
        "reconcile-evidence",
        "lease-break-reason",
        "lease-break-by",
        "run-request-id",
        "run-base-url",
    ],
)
def test_non_utf8_argument_is_one_line_exit_2(world: World, args: list[str]) -> None:
    """Non-UTF-8 bytes in any word of the command line: refused, nothing run or written."""
    ran = world.run(*args)
    assert_clean_error(ran, BAD_INPUT, "not valid UTF-8")
    world.assert_outside_untouched()
    world.assert_no_secret_stored()


@pytest.mark.parametrize("name", ["EFFECTGATE_STATE_DIR", "OPENAI_BASE_URL", "OPENAI_API_KEY"])
def test_non_utf8_environment_variable_is_one_line_exit_2(
    world: World, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A variable effectgate reads, not UTF-8: refused by name, its value never shown.

    Before, ``EFFECTGATE_STATE_DIR`` wrote raw bytes into ``--json`` output and
    ``OPENAI_BASE_URL`` ended in a traceback.
    """
    monkeypatch.setenv(name, NOT_UTF8)
    argv = ["run", "a task", "--model", "openai:m", "--state-dir", str(world.state)]
    res = CliRunner().invoke(app, argv)
    ran = Ran(res.exit_code, res.stdout, res.stderr, res.exception)
    assert_clean_error(ran, BAD_INPUT, name)
    assert "fix" not in ran.stderr  # the value (b"fix \xff\xfe it") is not echoed
    assert not world.state.exists()


def test_store_schema_missing_from_search_path_is_one_line_exit_2(
    world: World, postgres_url: str
) -> None:
    """A ``search_path`` naming no existing schema: one line naming it, exit 2, no password."""
    missing = postgres_url.split("search_path%3D", 1)[0] + "search_path%3Dno_such_schema_h1b"
    url = missing.replace("://postgres@", "://postgres:pw-hostile-91ab@", 1)
    ran = world.run("worker", "--until-idle", "--store", url)
    assert_clean_error(ran, BAD_INPUT, "search_path")
    assert "pw-hostile-91ab" not in ran.stdout + ran.stderr


def test_a_follow_up_turn_is_not_listed_by_the_worker_as_a_thread(world: World) -> None:
    """A follow-up's ledger record ``T#turn-2`` belongs to ``T``: the worker never takes it.

    Before, it was listed as a thread of its own and skipped with "the task is empty".
    """
    call = {"name": "write_file", "args": {"path": "a.md", "content": "x"}}
    script = world.root / "model.json"
    script.write_text(json.dumps({"name": "t", "final": "done", "turns": [{"tool_calls": [call]}]}))
    model = f"scripted:{script}"
    first = world.run("run", "task", "--model", model, "--thread", "w1", "--approve", "all")
    assert first.code == 0, first.stderr
    again = world.run("run", "again", "--model", model, "--thread", "w1")
    assert again.code == 4, again.stderr  # the follow-up's call waits for review
    ran = world.run("worker", "--until-idle", "--json", "--model", model, "--approve", "all")
    assert ran.code == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    assert all("#turn-" not in str(line.get("thread_id")) for line in lines), lines
    assert "worker" in lines[-1]  # the summary line: the scan ran to its end


def test_an_unsafe_call_the_worker_approves_is_a_warning_not_left_for_review(
    world: World,
) -> None:
    """``worker --approve all --json`` says it approved an UNSAFE call as ``warning``.

    Before, the line was labelled ``left_for_review`` although the call ran.
    """
    call = {"name": "run_shell", "args": {"command": "echo ran >> ran.txt"}}
    script = world.root / "shell.json"
    script.write_text(json.dumps({"name": "s", "final": "done", "turns": [{"tool_calls": [call]}]}))
    model = f"scripted:{script}"
    started = world.run("run", "task", "--model", model, "--thread", "u1")
    assert started.code == 4, started.stderr  # waits for review
    ran = world.run("worker", "--until-idle", "--json", "--model", model, "--approve", "all")
    assert ran.code == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 1 and "approving UNSAFE call" in warnings[0]["warning"], lines
    assert not [line for line in lines if "left_for_review" in line], lines
    assert (world.workspace / "ran.txt").read_text() == "ran\n"  # it ran, once
