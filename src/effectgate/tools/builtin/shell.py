"""run_shell: run a shell command in the workspace. NO sandbox; always reviewed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from effectgate.errors import OutcomeUnknown, Rejected
from effectgate.tools._contract import EffectKind, ToolContext, ToolResult, ToolSpec

__all__ = ["MAX_OUTPUT_BYTES", "RunShellArgs", "shell_tool"]

MAX_OUTPUT_BYTES = 16 * 1024
"""stdout and stderr are each cut to this many bytes, with a note saying how much was dropped."""
_REAP_TIMEOUT_S = 5.0
"""How long to wait for pipes to close after killing a timed-out command (seconds)."""


class RunShellArgs(BaseModel):
    """Arguments of run_shell."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        description="A /bin/sh command line, run in the workspace directory."
    )


def _clip(data: bytes) -> str:
    if len(data) <= MAX_OUTPUT_BYTES:
        return data.decode("utf-8", "replace")
    dropped = len(data) - MAX_OUTPUT_BYTES
    head = data[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")
    return f"{head}\n[effectgate: output truncated; {dropped} more bytes not shown]"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The command runs in its own session, so this also kills its children
    # (subprocess.run would kill only the shell and then wait on their pipes).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=_REAP_TIMEOUT_S)


class _Shell:
    def __init__(self, workspace: Path, timeout_s: float) -> None:
        self.workspace = workspace
        self.timeout_s = timeout_s

    def run(self, args: RunShellArgs, ctx: ToolContext) -> ToolResult:
        try:
            proc = subprocess.Popen(
                args.command,
                shell=True,
                cwd=self.workspace,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise Rejected(f"run_shell: could not start /bin/sh: {exc}") from exc
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            _kill_group(proc)
            raise OutcomeUnknown(
                f"run_shell: still running after {self.timeout_s} s and killed; "
                f"what it changed before that is unknown: {args.command!r}"
            ) from exc
        value = {"exit_code": proc.returncode, "stdout": _clip(stdout), "stderr": _clip(stderr)}
        return ToolResult(value=value)

    def preview(self, args: RunShellArgs) -> str:
        return (
            f"$ {args.command}\n"
            f"(cwd {self.workspace}, timeout {self.timeout_s} s; NO sandbox: runs as this "
            "process's user, with its environment and network access)\n"
        )


def shell_tool(workspace: str | os.PathLike[str], *, timeout_s: float = 30.0) -> ToolSpec:
    """Build run_shell: run a ``/bin/sh`` command line with the workspace as cwd.

    There is NO sandbox. The command runs as the current user, with the
    current environment and network access, and can read or change anything
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
