"""Hostile input through the ``effectgate`` command, in-process (typer's ``CliRunner``).

Decisions files, scripted-model files, state directories, base URLs, thread
ids and model text. Each case asserts the documented exit code, one error line
naming what was wrong (or, for text that is merely printed, that it reaches the
terminal escaped), no traceback, nothing written outside the state directory,
and the planted secret in neither SQLite file.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import StateDir
from tests.hostile.conftest import SECRET, World, assert_clean_error

BAD_INPUT = 2


def _script(world: World, turns: list[dict[str, Any]], final: str = "done") -> str:
    path = world.root / "model.json"
    path.write_text(json.dumps({"name": "hostile", "final": final, "turns": turns}))
    return f"scripted:{path}"


def _write_call(world: World) -> str:
    call = {"name": "write_file", "args": {"path": "a.md", "content": "x"}}
    return _script(world, [{"tool_calls": [call]}])


# --- decisions files -----------------------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _text(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text)


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


DECISIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("deep-array", _text("[" * 200_000 + "]" * 200_000), "deeper"),
    ("deep-object", _text('{"a":' * 100_000 + "1" + "}" * 100_000), "deeper"),
    ("dev-zero", _dev_zero, "not a regular file"),
    ("fifo", _fifo, "not a regular file"),
    ("directory", lambda p: p.mkdir(), "is a directory"),
    ("huge", _bytes(b" " * (5 * 1024 * 1024)), "over"),
    ("not-utf8", _bytes(b'{"decisions": ["\xff\xfe"]}'), "cannot be read"),
    ("empty", _text(""), "invalid JSON"),
    # a lone surrogate escape: before, exit 4 with error_type null (it failed at storage)
    (
        "lone-surrogate",
        _text('{"decisions": [{"type": "reject", "message": "\\ud800"}]}'),
        "not half of a pair",
    ),
    (
        "huge-integer",
        _text('{"decisions": [{"type": "approve"}], "x": 1' + "0" * 5000 + "}"),
        "refused",
    ),
    ("empty-list", _text("[]"), "empty list"),
    ("string", _text('"approve"'), "must be an object"),
    ("decisions-string", _text('{"decisions": "approve"}'), "decisions"),
    ("nul", _bytes(b'{"decisions": []}\x00'), "invalid JSON"),
    ("unknown-key", _text('{"bogus": 1}'), "unknown key"),
    ("nan", _text('{"decisions": NaN}'), "decisions"),
    ("bom", _bytes(b'\xef\xbb\xbf{"decisions": []}'), "JSON"),
    ("escape-in-key", _text('{"\\u001b[2Kdecisions": []}'), "unknown key"),
    # The binding's place, told as the shape to write: before, the refusal said to add
    # "interrupt_id" "to each decision", and doing so met "unknown key(s) ['interrupt_id']".
    (
        "unbound",
        _text('{"decisions": [{"type": "approve"}]}'),
        '{"interrupt_id": "...", "decisions": [...]}',
    ),
    (
        "interrupt-id-inside-a-decision",
        _text('{"decisions": [{"type": "approve", "interrupt_id": "abc"}]}'),
        '"interrupt_id" names the whole review, so it goes beside "decisions"',
    ),
]


@pytest.mark.parametrize(
    ("make", "fragment"), [(m, f) for _, m, f in DECISIONS], ids=[n for n, _, _ in DECISIONS]
)
def test_hostile_decisions_file(world: World, make: Callable[[Path], None], fragment: str) -> None:
    """Refused before anything runs: exit 2, one line, no state written at all."""
    path = world.root / "decisions.json"
    make(path)
    ran = world.run("run", "task", "--model", _write_call(world), "--decisions", str(path))
    assert_clean_error(ran, BAD_INPUT, fragment)
    assert "decisions" in ran.stderr
    assert "\x1b" not in ran.stderr
    assert not world.state.exists()
    world.assert_outside_untouched()


def test_missing_decisions_file(world: World) -> None:
    """A path that does not exist: exit 2 naming it."""
    missing = str(world.root / "nope.json")
    ran = world.run("run", "task", "--model", _write_call(world), "--decisions", missing)
    assert_clean_error(ran, BAD_INPUT, "nope.json")


# --- scripted-model files ---------------------------------------------------------------

_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)
)

SCRIPTS: list[tuple[str, str, Callable[[Path], None], str]] = [
    ("alias-bomb", "m.yaml", _text(_BOMB), "expands"),
    ("deep-list", "m.yaml", _text("[" * 5000 + "]" * 5000), "deeper"),
    ("deep-map", "m.yaml", _text("".join(" " * i + "k:\n" for i in range(1000))), "deeper"),
    ("deep-flow-map", "m.yaml", _text("{a: " * 5000 + "1" + "}" * 5000), "deeper"),
    ("deep-json", "m.json", _text("[" * 200_000 + "]" * 200_000), "deeper"),
    ("huge-integer-json", "m.json", _text('{"name": 1' + "0" * 5000 + "}"), "refused"),
    ("huge-integer-yaml", "m.yaml", _text("name: 1" + "0" * 5000 + "\n"), "refused"),
    ("cycle", "m.yaml", _text("&a [*a]"), "cycle"),
    ("fifo", "m.yaml", _fifo, "not a regular file"),
    ("dev-zero", "m.yaml", _dev_zero, "not a regular file"),
    ("directory", "m.yaml", lambda p: p.mkdir(), "not a regular file"),
    ("huge", "m.yaml", _bytes(b"#" * (5 * 1024 * 1024)), "over"),
    ("not-utf8", "m.yaml", _bytes(b"name: \xff\n"), "cannot be read"),
    ("python-tag", "m.yaml", _text('!!python/object/apply:os.system ["touch pwned"]'), "YAML"),
    ("empty", "m.yaml", _text(""), "script"),
    ("top-level-list", "m.yaml", _text("- 1\n- 2\n"), "script"),
    ("bad-json", "m.json", _text("{"), "invalid JSON"),
    ("wrong-suffix", "m.txt", _text("name: x"), "must end in"),
]


@pytest.mark.parametrize(
    ("name", "make", "fragment"),
    [(n, m, f) for _, n, m, f in SCRIPTS],
    ids=[i for i, _, _, _ in SCRIPTS],
)
def test_hostile_script_file(
    world: World, name: str, make: Callable[[Path], None], fragment: str
) -> None:
    """A bad scripted-model file: exit 2 at once, one line, nothing created or run."""
    path = world.root / name
    make(path)
    ran = world.run("run", "task", "--model", f"scripted:{path}")
    assert_clean_error(ran, BAD_INPUT, fragment)
    assert not world.state.exists()
    assert not (world.root / "pwned").exists()
    world.assert_outside_untouched()


# --- state directories ---------------------------------------------------------------


def _under_file(world: World) -> Path:
    (world.root / "afile").write_text("x")
    return world.root / "afile" / "state"


def _is_file(world: World) -> Path:
    (world.root / "state").write_text("x")
    return world.root / "state"


def _foreign(world: World) -> Path:
    (world.root / "state").mkdir()
    (world.root / "state" / "thesis.tex").write_text("mine")
    return world.root / "state"


def _after_first_run(change: Callable[[Path], None]) -> Callable[[World], Path]:
    def make(world: World) -> Path:
        first = world.run("run", "task", "--model", _write_call(world), "--approve", "all")
        assert first.code == 0, first.stderr
        change(world.state)
        return world.state

    return make


def _replace_with_dir(name: str) -> Callable[[Path], None]:
    def change(state: Path) -> None:
        for leftover in state.glob(name + "*"):
            leftover.unlink()
        (state / name).mkdir()

    return change


def _workspace_file(state: Path) -> None:
    for entry in (state / "workspace").iterdir():
        entry.unlink()
    (state / "workspace").rmdir()
    (state / "workspace").write_text("x")


def _marker(content: bytes) -> Callable[[Path], None]:
    return lambda state: (state / "effectgate.json").write_bytes(content)


def _marker_fifo(state: Path) -> None:
    (state / "effectgate.json").unlink()
    os.mkfifo(state / "effectgate.json")


def _loop(world: World) -> Path:
    (world.root / "s1").symlink_to("s2")
    (world.root / "s2").symlink_to("s1")
    return world.root / "s1"


def _garbage(name: str) -> Callable[[Path], None]:
    def change(state: Path) -> None:
        for leftover in state.glob(name + "*"):
            leftover.unlink()
        (state / name).write_bytes(b"\x00garbage" * 500)

    return change


STATE_DIRS: list[tuple[str, Callable[[World], Path], str]] = [
    ("under-a-file", _under_file, "not a directory"),
    ("is-a-file", _is_file, "is a file"),
    ("foreign-directory", _foreign, "not an effectgate state directory"),
    ("checkpoints-is-a-dir", _after_first_run(_replace_with_dir("checkpoints.sqlite3")), "not a"),
    ("ledger-is-a-dir", _after_first_run(_replace_with_dir("ledger.sqlite3")), "not a"),
    ("workspace-is-a-file", _after_first_run(_workspace_file), "not a directory"),
    ("marker-garbage", _after_first_run(_marker(b"\x00garbage")), "marker"),
    ("marker-wrong-format", _after_first_run(_marker(b'{"format": 99}')), "format"),
    ("marker-fifo", _after_first_run(_marker_fifo), "not an effectgate state directory"),
    ("symlink-loop", _loop, "state directory"),
]

DAMAGED_LEDGER = _after_first_run(_garbage("ledger.sqlite3"))
DAMAGED_CHECKPOINTS = _after_first_run(_garbage("checkpoints.sqlite3"))


@pytest.mark.parametrize(
    ("make", "fragment"), [(m, f) for _, m, f in STATE_DIRS], ids=[n for n, _, _ in STATE_DIRS]
)
def test_hostile_state_directory(
    world: World, make: Callable[[World], Path], fragment: str
) -> None:
    """A damaged or foreign state directory: exit 2 and one line, never a traceback."""
    state = make(world)
    ran = world.run(
        "run",
        "task",
        "--model",
        _write_call(world),
        "--approve",
        "all",
        "--state-dir",
        str(state),
        state=False,
    )
    assert_clean_error(ran, BAD_INPUT, fragment)
    world.assert_outside_untouched()


def test_garbage_checkpoints_are_reported_not_repaired(world: World) -> None:
    """A checkpoint file that is not a database: exit 1 (damaged state), one line, left as is."""
    DAMAGED_CHECKPOINTS(world)
    before = (world.state / "checkpoints.sqlite3").read_bytes()
    ran = world.run("run", "task", "--model", _write_call(world), "--approve", "all")
    assert_clean_error(ran, 1, "a state file is damaged")
    assert (world.state / "checkpoints.sqlite3").read_bytes() == before


def test_garbage_ledger_is_reported_not_repaired(world: World) -> None:
    """A ledger that is not a database: exit 1 (damaged state), one line, left as it is."""
    DAMAGED_LEDGER(world)
    before = (world.state / "ledger.sqlite3").read_bytes()
    ran = world.run("run", "task", "--model", _write_call(world), "--approve", "all")
    assert_clean_error(ran, 1, "not a usable ledger database")
    assert (world.state / "ledger.sqlite3").read_bytes() == before


# --- credentials in --base-url ----------------------------------------------------------

BASE_URLS = [
    (f"http://user:{SECRET}@127.0.0.1:9/v1", "credentials"),
    (f"http://:{SECRET}@127.0.0.1:9/v1", "credentials"),
    (f"http://{SECRET}@127.0.0.1:9/v1", "credentials"),
    (f"https://127.0.0.1:9/v1?api-key={SECRET}", "query"),
    (f"https://127.0.0.1:9/v1?token={SECRET}", "query"),
    (f"https://127.0.0.1:9/v1?x=1&Password={SECRET}", "query"),
    (f"ftp://{SECRET}@127.0.0.1/v1", "http"),
    (f"{SECRET}", "http"),
    ("http://127.0.0.1:99999/v1", "not a URL"),
]


@pytest.mark.parametrize("model", ["scripted:incident", "openai:gpt-test"])
@pytest.mark.parametrize(("url", "fragment"), BASE_URLS)
def test_base_url_with_credentials_is_refused_unprinted(
    world: World, model: str, url: str, fragment: str
) -> None:
    """Refused before anything is stored, and the credential is not echoed."""
    ran = world.run("run", "task", "--model", model, "--base-url", url)
    assert_clean_error(ran, BAD_INPUT, fragment)
    assert SECRET not in ran.stdout + ran.stderr
    assert not world.state.exists()


# --- text that is only printed: escaped, never interpreted ------------------------------

HOSTILE_TEXT = [
    "erase\x1b[2K\x1b[1Aharmless",
    "clipboard\x1b]52;c;cm0gLXJmIH4=\x07",
    "title\x1b]0;owned\x07",
    "csi8\u009b2K",
    "cr\roverwrite",
    "backspace\x08\x08xx",
    "rtl\u202etxt.exe",
    "sep\u2028line",
    "[bold red]markup[/]",
    "prod:fire:db :skull:",
]
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _assert_escaped(text: str) -> None:
    assert not _RAW.search(text), repr(_RAW.search(text))
    assert "\U0001f525" not in text and "\U0001f480" not in text  # no emoji from :fire:


@pytest.mark.parametrize("hostile", HOSTILE_TEXT)
def test_model_text_reaches_the_terminal_escaped(world: World, hostile: str) -> None:
    """Final message, progress lines, file names, thread id and hints: all escaped."""
    call = {"name": "write_file", "args": {"path": f"n{hostile}.md", "content": hostile}}
    model = _script(world, [{"say": hostile, "tool_calls": [call]}], final=hostile)
    ran = world.run("run", "task", "--model", model, "--approve", "all", "--thread", hostile)
    assert ran.code == 0, ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    _assert_escaped(ran.stdout + ran.stderr)
    if "[bold red]" in hostile or ":fire:" in hostile:
        assert hostile in ran.stdout  # shown literally, not as style or emoji
    for command in (["threads"], ["ledger", "list"], ["pending"], ["ledger", "events"]):
        shown = world.run(*command)
        assert shown.code == 0, shown.stderr
        _assert_escaped(shown.stdout + shown.stderr)
    world.assert_outside_untouched()
    world.assert_no_secret_stored()


@pytest.mark.parametrize("hostile", HOSTILE_TEXT[:5])
def test_json_output_carries_no_raw_control(world: World, hostile: str) -> None:
    """``--json``: one valid object, its strings intact, no raw C1 or separator characters."""
    model = _script(world, [], final=hostile)
    ran = world.run("run", "task", "--model", model, "--json")
    assert ran.code == 0, ran.stderr
    assert json.loads(ran.stdout)["final_message"] == hostile
    _assert_escaped(ran.stdout)


# --- hostile tool calls through the whole command ----------------------------------------


def _state(world: World) -> None:
    StateDir.open(world.state)


def _hardlinked(world: World) -> None:
    _state(world)
    os.link(world.outside / "canary.txt", world.workspace / "log.txt")


def _fifo_in_workspace(world: World) -> None:
    _state(world)
    os.mkfifo(world.workspace / "log.txt")


def _shadow_link(world: World) -> None:
    _state(world)
    (world.workspace / "log.txt").symlink_to("/etc/shadow")
    (world.workspace / "huge").symlink_to("/dev/zero")


CALLS: list[tuple[str, Callable[[World], None], dict[str, Any]]] = [
    ("append-hardlink", _hardlinked, {"name": "append_file", "args": {"path": "log.txt"}}),
    ("read-hardlink", _hardlinked, {"name": "read_file", "args": {"path": "log.txt"}}),
    ("write-hardlink", _hardlinked, {"name": "write_file", "args": {"path": "log.txt"}}),
    ("read-fifo", _fifo_in_workspace, {"name": "read_file", "args": {"path": "log.txt"}}),
    ("append-fifo", _fifo_in_workspace, {"name": "append_file", "args": {"path": "log.txt"}}),
    ("write-fifo", _fifo_in_workspace, {"name": "write_file", "args": {"path": "log.txt"}}),
    ("read-shadow", _shadow_link, {"name": "read_file", "args": {"path": "log.txt"}}),
    ("append-shadow", _shadow_link, {"name": "append_file", "args": {"path": "log.txt"}}),
    ("shell-env", lambda w: None, {"name": "run_shell", "args": {"command": "env"}}),
    ("shell-nul", lambda w: None, {"name": "run_shell", "args": {"command": "id\x00"}}),
    ("write-abs", lambda w: None, {"name": "write_file", "args": {"path": "/tmp/x"}}),
]


@pytest.mark.parametrize(
    ("setup", "call"), [(s, c) for _, s, c in CALLS], ids=[n for n, _, _ in CALLS]
)
def test_hostile_call_through_the_cli(
    world: World, setup: Callable[[World], None], call: dict[str, Any]
) -> None:
    """Approved or not, nothing outside changes, nothing hangs, no secret is stored."""
    setup(world)
    if call["name"] in ("write_file", "append_file"):
        call = {"name": call["name"], "args": {**call["args"], "content": "pwned\n"}}
    model = _script(world, [{"tool_calls": [call]}])
    ran = world.run("run", "task", "--model", model, "--approve", "all", "--json")
    assert ran.code == 0, ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    shown = json.dumps(json.loads(ran.stdout)["external"])
    assert "do not touch" not in ran.stdout and "shadow" not in shown
    for path in world.state.glob("*.sqlite3*"):  # nothing outside was read either
        assert b"do not touch" not in path.read_bytes(), path
    world.assert_outside_untouched()
    world.assert_no_secret_stored()


def test_path_deeper_than_path_max_does_not_break_later_runs(world: World) -> None:
    """An approved write 3000 levels deep succeeds; the next runs' summary still works."""
    deep = "/".join(["d" * 200] * 22) + "/f.txt"  # 4400 bytes > PATH_MAX
    call = {"name": "write_file", "args": {"path": deep, "content": "x"}}
    model = _script(world, [{"tool_calls": [call]}])
    first = world.run("run", "task", "--model", model, "--approve", "all")
    assert first.code == 0, first.stderr
    again = world.run("run", "task", "--model", _write_call(world), "--approve", "all")
    assert again.code == 0, again.stderr
    assert "Traceback" not in again.stdout + again.stderr


def test_secret_from_run_shell_env_is_stored_nowhere(world: World) -> None:
    """The approved ``env`` ran; its output went to both SQLite files, without the key."""
    call = {"name": "run_shell", "args": {"command": "env; echo marker-$((6*7))"}}
    model = _script(world, [{"tool_calls": [call]}])
    ran = world.run("run", "task", "--model", model, "--approve", "all")
    assert ran.code == 0, ran.stderr
    with sqlite3.connect(world.state / "ledger.sqlite3") as conn:
        dump = "\n".join(conn.iterdump())
    assert "marker-42" in dump  # the output was stored...
    assert SECRET not in dump  # ...without the secret
    world.assert_no_secret_stored()


def test_progress_lines_are_readable(world: World) -> None:
    """A tool result is one short line naming the outcome, not a cut JSON object."""
    call = {"name": "write_file", "args": {"path": "a.md", "content": "line\n" * 5000}}
    ran = world.run(
        "run", "task", "--model", _script(world, [{"tool_calls": [call]}]), "--approve", "all"
    )
    assert ran.code == 0, ran.stderr
    (line,) = [ln for ln in ran.stderr.splitlines() if ln.startswith("write_file:")]
    assert line.startswith("write_file: succeeded, attempt 1")
    assert "bytes=25000" in line and "path=a.md" in line
    assert '{"' not in line and len(line) <= 220


def test_hard_link_swapped_in_after_review_is_refused_at_dispatch(world: World) -> None:
    """Reviewed as a plain file; replaced by a hard link to an outside file; resume refuses."""
    StateDir.open(world.state)
    (world.workspace / "log.txt").write_text("inside\n")
    call = {"name": "append_file", "args": {"path": "log.txt", "content": "pwned\n"}}
    model = _script(world, [{"tool_calls": [call]}])
    first = world.run("run", "task", "--model", model, "--thread", "t1")
    assert first.code == 4, first.stderr  # waiting for review: nothing appended yet
    (world.workspace / "log.txt").unlink()
    os.link(world.outside / "canary.txt", world.workspace / "log.txt")
    ran = world.run("resume", "--thread", "t1", "--approve", "all", "--json")
    assert ran.code == 0, ran.stderr
    (op,) = json.loads(ran.stdout)["operations"]
    assert op["state"] == "FAILED" and "hard links" in op["error"]
    world.assert_outside_untouched()


@pytest.mark.parametrize("thread", ["prod:fire:db", "x[bold]y[/]z", "ops:skull:1"])
def test_resume_hint_names_the_real_thread(world: World, thread: str) -> None:
    """The hint printed while waiting for review names the thread as it is, no emoji, no style."""
    ran = world.run("run", "task", "--model", _write_call(world), "--thread", thread)
    assert ran.code == 4, ran.stderr
    out = ran.stdout + ran.stderr
    assert f"--thread {thread}" in out or f"--thread '{thread}'" in out, out[-800:]
    _assert_escaped(out)


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE checkpoints SET checkpoint = randomblob(100)",
        "UPDATE checkpoints SET type = 'json', checkpoint = CAST('{\"x\": 1}' AS BLOB)",
    ],
    ids=["random-bytes", "wrong-json"],
)
def test_damaged_checkpoint_rows_are_one_line_exit_1(world: World, damage: str) -> None:
    """Bytes inside checkpoint rows replaced: resume says so in one line (exit 1);
    threads lists the thread as unreadable, naming the table, and exits 1, no traceback."""
    first = world.run("run", "task", "--model", _write_call(world), "--thread", "t")
    assert first.code == 4, first.stderr
    with sqlite3.connect(world.state / "checkpoints.sqlite3") as conn:
        conn.execute(damage)
    ran = world.run("resume", "--thread", "t", "--approve", "all")
    assert_clean_error(ran, 1, "cannot be read back")
    listed = world.run("threads", "--json")
    assert listed.code == 1 and "Traceback" not in listed.stdout + listed.stderr
    [row] = [t for t in json.loads(listed.stdout)["threads"] if t["thread_id"] == "t"]
    assert row["status"] == "unreadable", row
    world.assert_outside_untouched()


def test_tool_call_arguments_with_a_lone_surrogate_are_a_malformed_call(world: World) -> None:
    """Arguments holding ``"\\ud800"`` are answered to the model as invalid, nothing runs.

    A model's arguments are JSON text (here a scripted model's string-form
    ``args``, as OpenAI sends them). Before, the intent hash failed with
    ``UnicodeEncodeError`` (exit 5), and a resume showed and wrote ``?``.
    """
    args = '{"path": "n.txt", "content": "\\ud800"}'
    model = _script(world, [{"tool_calls": [{"name": "write_file", "args": args}]}])
    ran = world.run("run", "task", "--model", model, "--approve", "all", "--json")
    assert ran.code == 0, ran.stderr[-2000:]
    body = json.loads(ran.stdout)
    assert body["status"] == "done" and body["operations"] == []
    assert not (world.workspace / "n.txt").exists()
    from effectgate import open_agent

    with open_agent(world.state, model=model) as agent:  # the model was told why
        told = [m for m in agent.messages(body["thread_id"]) if getattr(m, "tool_call_id", None)]
    assert len(told) == 1 and "lone UTF-16 surrogate" in str(told[0].content), told
