"""Shared checks of the hostile-input corpus.

Every case asserts the same four things: the exit code (or the error type at
the library level), one clear error line and no traceback, nothing written
outside the workspace, and no secret in either SQLite file. Most cases run
in-process (typer's ``CliRunner`` or the tools themselves) to keep the corpus
fast; ``test_processes.py`` runs the few that need a real process.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from effectgate.cli._app import app

SECRET = "sk-hostile-corpus-4f1d9a"
"""Planted in the environment of every case; must never reach a state file."""


@dataclass(frozen=True)
class Ran:
    """One in-process ``effectgate`` command."""

    code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    def error_lines(self) -> list[str]:
        """The lines of stderr that report an error."""
        return [line for line in self.stderr.splitlines() if line.startswith("error (")]


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``root`` (not following links): mode and, for files, bytes."""
    found: dict[str, tuple[int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            st = path.lstat()
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            found[str(path.relative_to(root))] = (st.st_mode, data)
    return found


@dataclass
class World:
    """A sandbox: ``outside`` holds a canary that no case may touch; ``state`` is ours."""

    root: Path
    outside: Path
    state: Path
    before: dict[str, tuple[int, bytes | None]]

    @property
    def workspace(self) -> Path:
        """The state directory's workspace (created by the first command)."""
        return self.state / "workspace"

    def run(self, *args: str, state: bool = True) -> Ran:
        """Run ``effectgate ARGS [--state-dir STATE]`` in this process."""
        argv = [*args, "--state-dir", str(self.state)] if state else list(args)
        env = {"OPENAI_API_KEY": SECRET, "MY_SERVICE_TOKEN": SECRET, "COLUMNS": "100"}
        res = CliRunner().invoke(app, argv, env=env)
        return Ran(res.exit_code, res.stdout, res.stderr, res.exception)

    def assert_outside_untouched(self) -> None:
        """Nothing outside the state directory changed."""
        assert snapshot(self.outside) == self.before

    def assert_no_secret_stored(self) -> None:
        """The planted secret is in neither SQLite file (nor their WAL files)."""
        for path in self.state.glob("*.sqlite3*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    """A fresh sandbox with the secret planted in this process's environment."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("do not touch\n")
    return World(tmp_path, outside, tmp_path / "state", snapshot(outside))


def assert_clean_error(ran: Ran, code: int, fragment: str) -> None:
    """Exit ``code``, exactly one error line naming ``fragment``, no traceback."""
    assert ran.exception is None or isinstance(ran.exception, SystemExit), repr(ran.exception)
    assert "Traceback" not in ran.stdout + ran.stderr
    assert ran.code == code, (ran.code, ran.stderr[-2000:])
    lines = ran.error_lines()
    if not lines and ran.stderr.startswith("Usage:"):
        # typer's own usage error (exit 2): one boxed message; unwrap the box.
        inner = [ln.strip("│╭╮╰╯─ ") for ln in ran.stderr.splitlines()[2:]]
        lines = [" ".join(part for part in inner if part)]
    assert len(lines) == 1, ran.stderr[-2000:]
    assert fragment.lower() in lines[0].lower(), lines[0]


class Listener:
    """A loopback TCP port that counts connections (and answers nothing)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop listening."""
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A counting listener: a case that must send nothing asserts ``accepted == 0``."""
    lst = Listener()
    yield lst
    lst.close()
