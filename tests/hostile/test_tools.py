"""Hostile tool arguments and workspace contents, at the tool contract.

A model proposes arguments; the workspace holds whatever anyone put there.
Each case is refused either by the argument schema (``ToolCallError``, so the
reviewer sees the refusal before anything runs) or by the tool when it runs
(``Rejected``: known not to have taken effect, never retried). In both cases
the message is one line, nothing outside the workspace changed, and no
connection was opened to a service that was not meant to be reached.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate.errors import Rejected, ToolCallError
from effectgate.tools import ToolContext, ToolSpec
from effectgate.tools._workspace import inventory
from effectgate.tools.builtin.files import file_tools
from effectgate.tools.builtin.mail import mail_tools
from effectgate.tools.builtin.shell import shell_tool
from effectgate.tools.builtin.tickets import ticket_tools
from tests.hostile.conftest import SECRET, Listener, World

CTX = ToolContext(operation_id="op-1", thread_id="t", tool_call_id="c", attempt=1)


def _tools(world: World, listener: Listener) -> dict[str, ToolSpec]:
    ws = world.root / "ws"
    ws.mkdir(exist_ok=True)
    specs = [
        *file_tools(ws),
        shell_tool(ws, timeout_s=5),
        *ticket_tools(listener.url, timeout_s=1, connect_timeout_s=1),
        *mail_tools("127.0.0.1", listener.port, listener.url, timeout_s=1),
    ]
    return {spec.name: spec for spec in specs}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)
    return text


# --- refused by the schema, before review ------------------------------------------

_BAD_PATHS = [
    "/etc/passwd",
    "/",
    "../outside/canary.txt",
    "a/../../outside/canary.txt",
    "a/..",
    "..",
    "ok\x00.txt",
    "dir/",
    ".",
    "./.",
]

SCHEMA_CASES: list[tuple[str, dict[str, Any], str]] = [
    *[("read_file", {"path": p}, "path") for p in _BAD_PATHS],
    *[("write_file", {"path": p, "content": "x"}, "path") for p in _BAD_PATHS],
    *[("append_file", {"path": p, "content": "x"}, "path") for p in _BAD_PATHS],
    ("list_dir", {"path": "/etc"}, "absolute"),
    ("list_dir", {"path": "../outside"}, ".."),
    ("read_file", {"path": "a", "extra": 1}, "extra"),
    ("write_file", {"path": ["a"], "content": "x"}, "path"),
    ("run_shell", {"command": "echo a\x00b"}, "NUL"),
    ("run_shell", {"command": "\x00"}, "NUL"),
    ("run_shell", {"command": "cat /etc/passwd\x00 > x"}, "NUL"),
    ("run_shell", {"command": ""}, "command"),
    ("run_shell", {"command": "   "}, "command"),
    ("run_shell", {"command": 42}, "command"),
    *[
        ("create_ticket", {"title": "t", "body": "b", "alert_id": alert}, "alert_id")
        for alert in [
            "a\r\nX-Injected: 1",
            "a\nb",
            "a\rb",
            "caf\u00e9",
            "\u65e5\u672c",
            "a\x00b",
            "a\x7fb",
            "a\tb",
            "a\u2028b",
            "a\x1b[2Kb",
            "x" * 201,
            "a\u0085b",
        ]
    ],
    ("create_ticket", {"title": "", "body": "b"}, "title"),
    ("create_ticket", {"title": "t\ud800", "body": "b"}, "title"),
    ("create_ticket", {"title": "t", "body": "b", "severity": "apocalyptic"}, "severity"),
    *[
        ("send_email", {"to": "a@example.com", "subject": subject, "body": "b"}, "subject")
        for subject in [
            "a\u2028Bcc: evil@example.com",
            "a\u2029b",
            "a\u0085b",
            "a\x0bb",
            "a\x0cb",
            "a\rb",
            "a\nBcc: evil@example.com",
            "a\x00b",
            "a\x1cb",
            "a\x1db",
            "a\x1eb",
            "a\x1b]0;title\x07",
        ]
    ],
    *[
        ("send_email", {"to": to, "subject": "s", "body": "b"}, "to")
        for to in [
            "a@example.com\r\nRCPT TO:<x@y>",
            "not-an-address",
            "a@ example.com",
            "\u00e9@example.com",
            [],
        ]
    ],
]


@pytest.mark.parametrize(("tool", "args", "fragment"), SCHEMA_CASES)
def test_schema_refuses(
    world: World, listener: Listener, tool: str, args: dict[str, Any], fragment: str
) -> None:
    """The call never reaches review: one-line ToolCallError, nothing written or sent."""
    spec = _tools(world, listener)[tool]
    with pytest.raises(ToolCallError) as caught:
        spec.normalize(args)
    assert fragment.lower() in _one_line(caught.value).lower()
    world.assert_outside_untouched()
    assert listener.accepted == 0
    assert os.listdir(world.root / "ws") == []


# --- refused when the tool runs --------------------------------------------------------


def _hardlink(ws: Path, out: Path) -> str:
    os.link(out / "canary.txt", ws / "log.txt")
    return "log.txt"


def _symlink_out(ws: Path, out: Path) -> str:
    (ws / "link.txt").symlink_to(out / "canary.txt")
    return "link.txt"


def _symlink_abs_dir(ws: Path, out: Path) -> str:
    (ws / "sub").symlink_to(out)
    return "sub/canary.txt"


def _symlink_rel_dir(ws: Path, out: Path) -> str:
    (ws / "up").symlink_to("../outside")
    return "up/canary.txt"


def _shadow(ws: Path, out: Path) -> str:
    (ws / "shadow").symlink_to("/etc/shadow")
    return "shadow"


def _dangling_out(ws: Path, out: Path) -> str:
    (ws / "new.txt").symlink_to(out / "created-by-attacker.txt")
    return "new.txt"


def _fifo(ws: Path, out: Path) -> str:
    os.mkfifo(ws / "pipe")
    return "pipe"


def _dev_zero(ws: Path, out: Path) -> str:
    (ws / "zero").symlink_to("/dev/zero")
    return "zero"


def _directory(ws: Path, out: Path) -> str:
    (ws / "adir").mkdir()
    return "adir"


def _loop(ws: Path, out: Path) -> str:
    (ws / "l1").symlink_to("l2")
    (ws / "l2").symlink_to("l1")
    return "l1"


def _socket(ws: Path, out: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / "sock"))
    sock.close()  # the socket file stays
    return "sock"


def _too_big(ws: Path, out: Path) -> str:
    with (ws / "big.bin").open("wb") as fh:
        fh.truncate(64 * 1024 * 1024)  # sparse: costs no disk
    return "big.bin"


Setup = Callable[[Path, Path], str]
RUN_CASES: list[tuple[str, Setup, str]] = [
    ("read_file", _hardlink, "hard links"),
    ("append_file", _hardlink, "hard links"),
    ("read_file", _symlink_out, "outside the workspace"),
    ("append_file", _symlink_out, "outside the workspace"),
    ("write_file", _symlink_out, "outside the workspace"),
    ("read_file", _symlink_abs_dir, "outside the workspace"),
    ("write_file", _symlink_abs_dir, "outside the workspace"),
    ("append_file", _symlink_rel_dir, "outside the workspace"),
    ("read_file", _shadow, "outside the workspace"),
    ("write_file", _shadow, "outside the workspace"),
    ("write_file", _dangling_out, "outside the workspace"),
    ("append_file", _dangling_out, "outside the workspace"),
    ("read_file", _fifo, "not a regular file"),
    ("append_file", _fifo, "not a regular file"),
    ("write_file", _fifo, "not a regular file"),
    ("write_file", _socket, "not a regular file"),
    ("read_file", _dev_zero, "outside the workspace"),
    ("read_file", _directory, "directory"),
    ("append_file", _directory, "directory"),
    ("read_file", _loop, "symlink"),
    ("append_file", _loop, "symlink"),
    ("read_file", _too_big, "over"),
]


@pytest.mark.parametrize(("tool", "setup", "fragment"), RUN_CASES)
def test_tool_refuses_at_run(
    world: World, listener: Listener, tool: str, setup: Setup, fragment: str
) -> None:
    """Checked again when it runs, whatever the review saw: Rejected, nothing outside changed."""
    tools = _tools(world, listener)
    path = setup(world.root / "ws", world.outside)
    args = {"path": path} if tool == "read_file" else {"path": path, "content": "pwned\n"}
    spec = tools[tool]
    started = time.monotonic()
    with pytest.raises(Rejected) as caught:
        spec.call(spec.normalize(args), CTX)
    assert time.monotonic() - started < 5  # a FIFO or device never blocks
    assert fragment.lower() in _one_line(caught.value).lower()
    world.assert_outside_untouched()
    if setup in (_fifo, _socket):  # still there, not replaced by a regular file
        assert not stat.S_ISREG((world.root / "ws" / path).lstat().st_mode)


@pytest.mark.parametrize("setup", [_fifo, _hardlink, _shadow, _dev_zero, _too_big])
def test_write_preview_never_blocks_or_reads_outside(
    world: World, listener: Listener, setup: Setup
) -> None:
    """The reviewer's diff of a write onto a FIFO, device or foreign file returns at once."""
    tools = _tools(world, listener)
    path = setup(world.root / "ws", world.outside)
    spec = tools["write_file"]
    started = time.monotonic()
    preview = spec.render_preview(spec.normalize({"path": path, "content": "new\n"}))
    assert time.monotonic() - started < 5
    assert "do not touch" not in preview
    world.assert_outside_untouched()


# --- requests that could never be sent: "not sent", no connection ---------------------

NOT_SENT: list[tuple[str, dict[str, Any], str]] = [
    ("create_ticket", {"title": "t", "body": "b"}, "op\r\nX-Injected: 1"),
    ("create_ticket", {"title": "t", "body": "b"}, "op-\u00e9"),
    ("send_email", {"to": "a@example.com", "subject": "s", "body": "b\ud800"}, "op-1"),
]


@pytest.mark.parametrize(("tool", "args", "operation_id"), NOT_SENT)
def test_unsendable_request_is_rejected_without_a_connection(
    world: World, listener: Listener, tool: str, args: dict[str, Any], operation_id: str
) -> None:
    """An encoding error before any byte left is proof: Rejected ("not sent"), no retry.

    The arguments go through the schema alone: ``normalize`` refuses a lone
    surrogate before any tool sees it; this is the tool's own defence behind it.
    """
    spec = _tools(world, listener)[tool]
    ctx = ToolContext(operation_id=operation_id, thread_id="t", tool_call_id="c", attempt=1)
    with pytest.raises(Rejected) as caught:
        spec.call(spec.args_schema.model_validate(args), ctx)
    assert "not sent" in _one_line(caught.value)
    assert listener.accepted == 0


# --- secrets and unbounded output of run_shell -----------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "env",
        "printenv OPENAI_API_KEY",
        "echo $MY_SERVICE_TOKEN",
        "echo $EFFECTGATE_STORE",
        "cat /proc/self/environ | tr '\\0' '\\n'",
        "sh -c 'env'",
    ],
)
def test_shell_children_get_no_credentials(
    world: World, listener: Listener, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPENAI_API_KEY, *_TOKEN and URLs with a password are not in the child's environment."""
    # effectgate's own store URL, password included, under a name that is no secret
    monkeypatch.setenv("EFFECTGATE_STORE", f"postgresql://app:{SECRET}@127.0.0.1:1/db")
    spec = _tools(world, listener)["run_shell"]
    result = spec.call(spec.normalize({"command": command}), CTX)
    assert SECRET not in result.value["stdout"] + result.value["stderr"]
    assert "PATH" in spec.call(spec.normalize({"command": "env"}), CTX).value["stdout"]


def test_shell_output_is_capped_while_reading(world: World, listener: Listener) -> None:
    """50 MB on stdout: the result keeps 16 KiB and counts the rest; it does not buffer it."""
    spec = _tools(world, listener)["run_shell"]
    args = spec.normalize({"command": "head -c 50000000 /dev/zero | tr '\\0' y"})
    value = spec.call(args, CTX).value
    assert len(value["stdout"]) < 17 * 1024
    assert "49983616 more bytes not shown" in value["stdout"]


# --- the workspace summary ---------------------------------------------------------------


def test_summary_never_follows_links_and_survives_path_max(world: World) -> None:
    """Links to /etc/shadow or a huge file are not listed; a tree deeper than PATH_MAX is fine."""
    ws = world.root / "ws"
    ws.mkdir()
    (ws / "shadow").symlink_to("/etc/shadow")
    (ws / "big").symlink_to("/dev/zero")
    (ws / "out").symlink_to(world.outside)
    os.mkfifo(ws / "pipe")
    os.link(world.outside / "canary.txt", ws / "hard.txt")
    (ws / "note.md").write_text("hello")
    fd = os.open(ws, os.O_RDONLY)
    try:
        for _ in range(22):  # 22 * 201 bytes > PATH_MAX (4096)
            os.mkdir("d" * 200, dir_fd=fd)
            child = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("deep.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    files = {entry["path"]: entry for entry in inventory(ws)}
    deep = "/".join(["d" * 200] * 22) + "/deep.txt"
    assert set(files) == {"hard.txt", "note.md", deep}
    assert files["hard.txt"]["sha256"] is None  # another file's bytes are not read
    assert files["note.md"]["bytes"] == 5
