"""run_shell: run a shell command in the workspace. NO sandbox; always reviewed."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from effectgate.errors import OutcomeUnknown, Rejected
from effectgate.tools._contract import EffectKind, ToolContext, ToolResult, ToolSpec

__all__ = ["MAX_OUTPUT_BYTES", "RunShellArgs", "child_environment", "shell_tool"]

MAX_OUTPUT_BYTES = 16 * 1024
"""stdout and stderr are each cut to this many bytes, with a note saying how much was dropped."""
_REAP_TIMEOUT_S = 5.0
"""How long to wait for pipes to close after killing a timed-out command (seconds)."""


_SECRET_NAME = re.compile(
    r"(^|_)(API_?KEY|KEY|KEY_ID|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|AUTH)(_|$)"
    r"|SECRET|PASSWORD|TOKEN|PRIVATE_KEY|API_KEY",
    re.IGNORECASE,
)
"""Environment variable names that look like credentials (``OPENAI_API_KEY``,
``GITHUB_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``, ``DB_PASSWORD``)."""

_SECRET_VALUE = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s@:]*:[^/\s@]+@", re.IGNORECASE)
"""A value that holds a URL with a password in it (``postgresql://u:pw@host/db``,
``EFFECTGATE_STORE``, ``DATABASE_URL``), whatever its variable's name."""


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment a command runs with: this process's, minus credentials.

    The command's output is stored in both SQLite files (the receipt, the
    checkpointed tool message) and sent to the model, so a credential the
    child could print would leak three ways. Variables whose names look like
    credentials (see ``_SECRET_NAME``: ``*_KEY``, ``*_TOKEN``, ``*SECRET*``,
    ``*PASSWORD*``, ``*_CREDENTIALS``, ``*_AUTH``) are left out, and so are
    variables whose value is a URL carrying a password (``_SECRET_VALUE``:
    ``EFFECTGATE_STORE=postgresql://u:pw@host/db``). This is a deny-list: a
    secret under an innocent name and in another form still reaches the command.

    Args:
        environ: the environment to filter; default ``os.environ``.

    Returns:
        A new dict to hand to ``subprocess``.
    """
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in source.items()
        if not _SECRET_NAME.search(name) and not _SECRET_VALUE.search(value)
    }


def _no_nul(value: str) -> str:
    if "\x00" in value:
        # execve() cannot pass a NUL; the error would come only at dispatch.
        raise ValueError("the command contains a NUL byte, which no shell can receive")
    return value


class RunShellArgs(BaseModel):
    """Arguments of run_shell."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1), AfterValidator(_no_nul)
    ] = Field(description="A /bin/sh command line, run in the workspace directory.")


def _clip(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", "replace")
    if not dropped:
        return text
    return f"{text}\n[effectgate: output truncated; {dropped} more bytes not shown]"


class _Capped:
    """Drain a pipe on a thread, keeping the first ``MAX_OUTPUT_BYTES`` and counting the rest."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.kept = bytearray()
        self.dropped = 0
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := self._pipe.read1(65536):  # type: ignore[attr-defined]
                room = MAX_OUTPUT_BYTES - len(self.kept)
                self.kept += chunk[:room]
                self.dropped += max(0, len(chunk) - room)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def running(self) -> bool:
        return self._thread.is_alive()

    def text(self) -> str:
        return _clip(bytes(self.kept), self.dropped)


_WATCHDOG = (
    "read pgid; read done; "
    'case "$pgid" in ""|*[!0-9]*) exit 0;; esac; '
    # dash's kill takes no "--"; "-PGID" after the signal names the group.
    '[ "$done" = d ] || kill -KILL "-$pgid" 2>/dev/null'
)
"""The watchdog's program: kill the command's process group unless told it ended.

Its stdin is a pipe whose only write end this process holds (``os.pipe``
descriptors are not inherited by the command). A worker that ends in any way,
``kill -9`` included, closes that end; the watchdog then reads end-of-file
instead of ``d`` and kills the group, so no command outlives the worker that
dispatched it (one process group: a child that calls ``setsid`` itself leaves
it and is not reached). It is a ``/bin/sh`` of its own session, so a terminal's
Ctrl-C to the worker's group does not end it first."""


_GATE = 'IFS= read -r go; exec </dev/null; [ "$go" = go ] || exit 125; exec /bin/sh -c "$1"'
"""The command's own shell waits at this gate until the watchdog knows its group.

Started as ``/bin/sh -c _GATE run_shell COMMAND`` with the read end of a pipe
as its stdin (the command itself then gets ``/dev/null``). This process writes
``go`` only after :meth:`_Watchdog.guard` has named the command's process
group; a worker killed between the two (after
``Popen`` returned, before ``guard``) closes the write end, the gate reads
end-of-file and exits 125 without running anything. So there is no moment at
which the command runs and nothing would kill it with its worker."""


class _Watchdog:
    """A ``/bin/sh`` that kills a command's process group if this process dies first."""

    def __init__(self) -> None:
        read, self._write = os.pipe()
        try:
            self._proc = subprocess.Popen(
                ["/bin/sh", "-c", _WATCHDOG],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)

    def guard(self, pgid: int) -> None:
        """Name the process group to kill (``pgid``) if this process dies from now on."""
        os.write(self._write, f"{pgid}\n".encode())

    def release(self) -> None:
        """The command ended (or was killed by us): tell the watchdog to exit without a kill."""
        with contextlib.suppress(OSError):
            os.write(self._write, b"d\n")
        with contextlib.suppress(OSError):
            os.close(self._write)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=_REAP_TIMEOUT_S)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The command runs in its own session, so this also kills its children
    # (subprocess.run would kill only the shell and then wait on their pipes).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_REAP_TIMEOUT_S)


class _Shell:
    def __init__(self, workspace: Path, timeout_s: float) -> None:
        self.workspace = workspace
        self.timeout_s = timeout_s

    def run(self, args: RunShellArgs, ctx: ToolContext) -> ToolResult:
        # Started before the command, so that a worker killed at any moment
        # after the command exists takes it along (the command waits for it: _GATE).
        try:
            watchdog = _Watchdog()
        except OSError as exc:
            raise Rejected(f"run_shell: could not start its watchdog /bin/sh: {exc}") from exc
        try:
            return self._run(args, watchdog)
        finally:
            watchdog.release()

    def _run(self, args: RunShellArgs, watchdog: _Watchdog) -> ToolResult:
        gate, go = os.pipe()
        try:
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _GATE, "run_shell", args.command],
                    cwd=self.workspace,
                    env=child_environment(),
                    stdin=gate,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except (OSError, ValueError) as exc:
                # Raised before the shell existed: nothing ran.
                raise Rejected(f"run_shell: could not start /bin/sh: {exc}") from exc
            finally:
                os.close(gate)
            try:
                watchdog.guard(proc.pid)  # its own session: the group id is its pid
                os.write(go, b"go\n")  # only now may the command start
            except BaseException:
                _kill_group(proc)
                raise
        finally:
            os.close(go)
        assert proc.stdout is not None and proc.stderr is not None
        # Output past the cap is read and thrown away as it comes, so `yes`
        # costs a CPU for its timeout, never memory.
        out, err = _Capped(proc.stdout), _Capped(proc.stderr)
        deadline = time.monotonic() + self.timeout_s
        try:
            proc.wait(timeout=self.timeout_s)
            # As communicate() does: done when the pipes close too (children included).
            for capped in (out, err):
                capped.join(max(0.0, deadline - time.monotonic()))
            if out.running() or err.running():
                raise subprocess.TimeoutExpired(args.command, self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            raise OutcomeUnknown(
                f"run_shell: still running after {self.timeout_s} s and killed; "
                f"what it changed before that is unknown: {args.command!r}"
            ) from exc
        except BaseException:
            # Interrupted here (KeyboardInterrupt, a stop): the command must not
            # outlive the call that started it, as it does not outlive the process.
            _kill_group(proc)
            raise
        value = {"exit_code": proc.returncode, "stdout": out.text(), "stderr": err.text()}
        return ToolResult(value=value)

    def preview(self, args: RunShellArgs) -> str:
        return (
            f"$ {args.command}\n"
            f"(cwd {self.workspace}, timeout {self.timeout_s} s; NO sandbox: runs as this "
            "process's user, with its environment minus credential variables, and network "
            "access)\n"
        )


def shell_tool(workspace: str | os.PathLike[str], *, timeout_s: float = 30.0) -> ToolSpec:
    """Build run_shell: run a ``/bin/sh`` command line with the workspace as cwd.

    There is NO sandbox. The command runs as the current user, with the
    current environment minus variables named like credentials (see
    ``child_environment``) and network access, and can read or change anything
    that user can, inside the workspace or not: the working directory is a
    convenience, not a boundary. That is why the tool is UNSAFE (a repeat may
    repeat its effects; nothing can be asked afterwards) and
    ``requires_approval=True``: every call is reviewed, whatever an
    auto-approve policy says about other tools.

    The result is ``{"exit_code", "stdout", "stderr"}``; a non-zero exit code is
    a result, not an error (the command ran). stdout and stderr are decoded as
    UTF-8 (undecodable bytes replaced) and each cut to ``MAX_OUTPUT_BYTES``
    (16 KiB) with a note saying how many bytes were dropped. stdin is empty.

    Args:
        workspace: the working directory of the command.
        timeout_s: how long the command may run, in seconds. On timeout its
            whole process group is killed and ``OutcomeUnknown`` is raised.

    Returns:
        The ``run_shell`` ToolSpec.

    Raises:
        ValueError: ``timeout_s`` is not positive.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    shell = _Shell(Path(workspace), float(timeout_s))
    return ToolSpec(
        name="run_shell",
        description=(
            "Run a shell command in the workspace directory and return its exit code and "
            "output. Every call is reviewed by a human."
        ),
        args_schema=RunShellArgs,
        func=shell.run,
        kind=EffectKind.UNSAFE,
        requires_approval=True,
        preview=shell.preview,
    )
