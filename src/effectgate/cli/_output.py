"""Where the CLI writes, and how an error becomes a message and an exit code.

stdout carries results: rich tables for people, or exactly one JSON object
with ``--json``. Everything else (progress, notes, warnings, errors, the
interactive review in ``--json`` mode) goes to stderr, so ``--json`` output
can be piped into ``jq`` as is.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from effectgate.cli._exit import ExitCode, code_for_error
from effectgate.cli._render import dumps
from effectgate.errors import EffectgateError

__all__ = ["Output", "handled"]


@dataclass(slots=True)
class Output:
    """The consoles of one command, and the notes its ``--json`` object carries.

    Args:
        json_mode: print one JSON object on stdout and nothing else there.
    """

    json_mode: bool = False
    out: Console = field(default_factory=lambda: Console(highlight=False))
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    notes: list[str] = field(default_factory=list)

    @property
    def ui(self) -> Console:
        """The console for interactive review: stdout, or stderr in ``--json`` mode."""
        return self.err if self.json_mode else self.out

    def note(self, text: str) -> None:
        """Tell the person something the CLI decided on their behalf (kept for ``--json``)."""
        self.notes.append(text)
        self.err.print(f"[yellow]note:[/] {escape(text)}")

    def progress(self, text: str) -> None:
        """Print one progress line on stderr."""
        self.err.print(f"[dim]{escape(text)}[/]", soft_wrap=True)

    def emit_json(self, value: Any) -> None:
        """Print the command's single JSON object on stdout."""
        sys.stdout.write(dumps(value) + "\n")
        sys.stdout.flush()


@contextlib.contextmanager
def handled(output: Output, *, thread_id: str | None = None) -> Iterator[None]:
    """End the command with the exit code of the error that escapes the block.

    ``EffectgateError`` subclasses map through ``code_for_error``; Ctrl-C
    outside a run ends with INCOMPLETE (the thread is resumable). Any other
    exception propagates with its traceback (exit status 1).

    Args:
        output: where the message (and, with ``--json``, an error object) goes.
        thread_id: named in the error object and the resume hint, if known.

    Raises:
        typer.Exit: always, when an error was handled.
    """
    try:
        yield
    except EffectgateError as exc:
        code = code_for_error(exc)
        _fail(output, code, f"{type(exc).__name__}: {exc}", type(exc).__name__, thread_id)
        raise typer.Exit(int(code)) from None
    except KeyboardInterrupt:
        hint = f"; effectgate resume --thread {thread_id} continues" if thread_id else ""
        _fail(output, ExitCode.INCOMPLETE, "aborted" + hint, "KeyboardInterrupt", thread_id)
        raise typer.Exit(int(ExitCode.INCOMPLETE)) from None


def _fail(output: Output, code: ExitCode, message: str, kind: str, thread_id: str | None) -> None:
    output.err.print(
        f"[bold red]error[/] ({code.name.lower()}, exit {int(code)}): {escape(message)}"
    )
    if output.json_mode:
        output.emit_json(
            {
                "thread_id": thread_id,
                "status": "error",
                "exit_code": int(code),
                "error": message,
                "error_type": kind,
                "notes": output.notes,
            }
        )
