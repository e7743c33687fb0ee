"""Where the CLI writes, and how an error becomes a message and an exit code.

stdout carries results: rich tables for people, or exactly one JSON object
with ``--json``. Everything else (progress, notes, warnings, errors, the
interactive review in ``--json`` mode) goes to stderr, so ``--json`` output
can be piped into ``jq`` as is.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import typer
from rich.console import Console
from rich.markup import escape

from effectgate.cli._exit import ExitCode, code_for_error
from effectgate.cli._render import SafeConsole, dumps
from effectgate.cli._signals import STOPPER, Mode
from effectgate.errors import EffectgateError

__all__ = [
    "DEFAULT_STATE_DIR",
    "Output",
    "command_hint",
    "handled",
    "thread_exists",
    "usage_failed",
    "wants_json",
]

DEFAULT_STATE_DIR = Path(".effectgate")
"""``--state-dir`` when neither the flag nor ``$EFFECTGATE_STATE_DIR`` is given."""


@dataclass(slots=True)
class Output:
    """The consoles of one command, and the notes its ``--json`` object carries.

    Args:
        json_mode: print one JSON object on stdout and nothing else there.
    """

    json_mode: bool = False
    out: Console = field(default_factory=lambda: SafeConsole(highlight=False))
    err: Console = field(default_factory=lambda: SafeConsole(stderr=True, highlight=False))
    notes: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    """Lines (rich markup) kept for the end of the command: ``last``, ``flush_last``."""
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    """Where the ``--json`` object goes: the command's stdout as it was when it began.

    While ``handled`` runs a ``--json`` command, ``sys.stdout`` is stderr, so
    that what your own code prints (an ``--agent`` factory, a tool) cannot
    break the one JSON object on stdout."""

    @property
    def ui(self) -> Console:
        """The console for interactive review: stdout, or stderr in ``--json`` mode."""
        return self.err if self.json_mode else self.out

    def note(self, text: str) -> None:
        """Tell the person something the CLI decided on their behalf (kept for ``--json``)."""
        self.notes.append(text)
        self.err.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True)

    def last(self, markup: str) -> None:
        """Keep a stdout line (rich markup) for the end of the command, in order.

        A run's next steps and its status line go here so that the status
        line is the command's last line, after whatever the command explains
        later (recovered operations, reused receipts). ``handled`` prints them
        when the command ends.
        """
        self.tail.append(markup)

    def flush_last(self) -> None:
        """Print the lines kept by ``last`` on stdout, once."""
        lines, self.tail[:] = list(self.tail), []
        for line in lines:
            self.out.print(line, soft_wrap=True)  # a status line names a thread id: keep it whole

    def progress(self, text: str) -> None:
        """Print one progress line on stderr."""
        self.err.print(f"[dim]{escape(text)}[/]", soft_wrap=True)

    def emit_json(self, value: Any) -> None:
        """Print the command's single JSON object on stdout."""
        self.stdout.write(dumps(value) + "\n")
        self.stdout.flush()


def command_hint(state_dir: Path | None, *args: str) -> str:
    """Spell out an ``effectgate`` command line to copy, with ``--state-dir`` when not the default.

    Args:
        state_dir: the ``--state-dir`` value as given (``None``: leave it out).
        args: the command and its arguments, e.g. ``"resume", "--thread", "t1"``.

    Returns:
        ``effectgate resume --thread t1 --state-dir DIR``, quoted for a POSIX shell.
    """
    words = ["effectgate", *args]
    if state_dir is not None and state_dir != DEFAULT_STATE_DIR:
        words += ["--state-dir", str(state_dir)]
    return shlex.join(words)


def thread_exists(state_dir: Path, thread_id: str) -> bool | None:
    """Whether the ledger in ``state_dir`` records ``thread_id``, read without creating anything.

    Returns:
        ``True`` or ``False``; ``None`` when the ledger cannot be read.
    """
    return _thread_facts(state_dir, thread_id)[0]


def _thread_facts(state_dir: Path, thread_id: str) -> tuple[bool | None, list[str]]:
    """Whether the ledger records ``thread_id``, and its calls left ``IN_FLIGHT``.

    Returns:
        ``(exists, in_flight)``: ``exists`` as ``thread_exists``; ``in_flight``
        names each of the thread's operations whose attempt started and has no
        recorded outcome (``"create_ticket (operation ticket:x, attempt 1)"``),
        empty when there is none or the ledger cannot be read.
    """
    from effectgate._app import StateDir
    from effectgate.ledger import OpState

    if not (state_dir.expanduser() / "effectgate.json").is_file():
        return False, []
    try:
        sd = StateDir.open(state_dir, create=False)
        if not sd.has_ledger():
            return False, []
        ledger = sd.open_ledger()
        try:
            if ledger.get_thread(thread_id) is None:
                return False, []
            ops = ledger.list(thread_id=thread_id, states=[OpState.IN_FLIGHT])
            return True, [
                f"{op.tool} (operation {op.operation_id}, attempt {op.attempt})" for op in ops
            ]
        finally:
            ledger.close()
    except EffectgateError:
        return None, []


def _interrupted(thread_id: str | None, state_dir: Path | None) -> str:
    if STOPPER.aborted_by is not None:
        what = f"aborted by a second {STOPPER.aborted_by}"
    else:
        what = STOPPER.reason if STOPPER.requested else "interrupted"
    if thread_id is None or state_dir is None:
        return what
    resume = command_hint(state_dir, "resume", "--thread", thread_id)
    exists, in_flight = _thread_facts(state_dir, thread_id)
    if exists and in_flight:
        # The abort cut a call off: say so, and that nothing repeats it blindly.
        return (
            f"{what} in the middle of thread {thread_id}'s call {', '.join(in_flight)}: "
            f"its outcome is not recorded; {resume} settles it first (a lookup, or a "
            "reconciliation review when none can tell), then continues"
        )
    if exists:
        return f"{what}; {resume} continues"
    if exists is None:
        return f"{what}; if the thread was started, {resume} continues; else re-run the command"
    # Nothing recorded the thread, so ``resume`` would answer "unknown thread".
    return f"{what} before the thread was started: nothing was started; re-run the same command"


_JSON_STDOUT: list[TextIO] = []
"""The stdout of each ``--json`` command running in ``handled``, innermost last."""


def json_stdout() -> TextIO:
    """The stream a ``--json`` command's own output goes to: its stdout as it began.

    Inside ``handled`` ``sys.stdout`` is stderr (``_json_only``); writers of
    JSON lines (``worker --json``) use this. Outside one, ``sys.stdout``.
    """
    return _JSON_STDOUT[-1] if _JSON_STDOUT else sys.stdout


@contextlib.contextmanager
def _json_only(output: Output) -> Iterator[None]:
    """Send everything but the JSON to stderr for the block; ``json_stdout`` keeps the real one.

    ``sys.stdout`` becomes stderr. When the command's stdout is file
    descriptor 1, that descriptor is pointed at stderr too (``dup2``), so a
    tool writing to fd 1 or a child process it starts (one still running
    after the command, too) cannot reach stdout; the JSON goes to a
    duplicate of the original descriptor. The descriptor is restored when
    the block ends.
    """
    saved = _fd_one(output.stdout)
    stream = output.stdout
    if saved is not None:
        stream = os.fdopen(
            saved,
            "w",
            encoding=output.stdout.encoding,
            errors=output.stdout.errors,
            closefd=True,
        )
        os.dup2(2, 1)
        output.stdout = stream
    _JSON_STDOUT.append(stream)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.pop()
        if saved is not None:
            stream.flush()
            os.dup2(saved, 1)
            stream.close()
            output.stdout = sys.stdout


def _fd_one(stream: TextIO) -> int | None:
    """A duplicate of fd 1 when ``stream`` writes to it (flushed first), else ``None``."""
    try:
        if stream.fileno() != 1:
            return None
        stream.flush()
        return os.dup(1)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


@contextlib.contextmanager
def handled(
    output: Output,
    *,
    thread_id: str | None = None,
    state_dir: Path | None = None,
    mode: Mode = Mode.IMMEDIATE,
    reads_stop: bool = False,
) -> Iterator[None]:
    """End the command with the exit code of the error that escapes the block.

    ``EffectgateError`` subclasses map through ``code_for_error``. SIGINT and
    SIGTERM are handled as ``mode`` says (``effectgate.cli._signals``); one
    that ends the block ends the command with INCOMPLETE and a message saying
    whether ``resume`` continues the thread or nothing was started. Any other
    exception propagates with its traceback (exit status 1). The lines kept
    by ``Output.last`` (a run's status line) are printed when the block ends,
    so they are the command's last lines. With ``--json``, ``sys.stdout`` is
    stderr inside the block: only ``Output.emit_json`` writes to stdout.

    Args:
        output: where the message (and, with ``--json``, an error object) goes.
        thread_id: named in the error object and the resume hint, if known.
        state_dir: where the thread lives (``--state-dir`` as given), for the
            resume hint; ``None`` for commands that run no thread.
        mode: what the first signal does while the block runs.
        reads_stop: the block reads ``STOPPER.requested`` itself and ends with
            its own summary (``worker``): a signal that came while the command
            line was parsed does not end it before it starts.

    Raises:
        typer.Exit: always, when an error was handled.
    """
    # --json: stdout carries the one object; anything else printed goes to stderr
    quiet = _json_only(output) if output.json_mode else contextlib.nullcontext()
    try:
        with quiet, STOPPER.command(mode, output.note, reads_stop=reads_stop):
            yield
    except EffectgateError as exc:
        output.flush_last()
        code = code_for_error(exc)
        _fail(output, code, f"{type(exc).__name__}: {exc}", type(exc).__name__, thread_id)
        raise typer.Exit(int(code)) from None
    except sqlite3.DatabaseError as exc:
        # The ledger translates its own SQLite errors (LedgerCorruptError);
        # one that arrives raw comes from the checkpoints or a demo service.
        sqlite_code = getattr(exc, "sqlite_errorcode", None)
        name = getattr(exc, "sqlite_errorname", "?")
        output.flush_last()
        if not isinstance(sqlite_code, int) or sqlite_code & 0xFF not in _DAMAGED:
            raise
        message = (
            f"a state file is damaged ({name}: {exc}): the checkpoints "
            f"(checkpoints.sqlite3) or a demo service's database. The ledger is a "
            f"separate file: `effectgate ledger list` still shows every operation and "
            f"its outcome. `sqlite3 FILE 'PRAGMA integrity_check'` finds the file"
        )
        _fail(output, ExitCode.ERROR, message, "DatabaseError", thread_id)
        raise typer.Exit(int(ExitCode.ERROR)) from None
    except KeyboardInterrupt as exc:
        output.flush_last()
        # A worker knows the thread only once it runs one (``RunAborted``).
        thread_id = getattr(exc, "thread_id", None) or thread_id
        message = _interrupted(thread_id, state_dir)
        _fail(output, ExitCode.INCOMPLETE, message, "KeyboardInterrupt", thread_id)
        raise typer.Exit(int(ExitCode.INCOMPLETE)) from None
    finally:
        output.flush_last()  # the status line, after everything the command explained


_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
"""SQLite primary result codes that mean a damaged file, not a passing condition."""


def _fail(output: Output, code: ExitCode, message: str, kind: str, thread_id: str | None) -> None:
    output.err.print(
        f"[bold red]error[/] ({code.name.lower()}, exit {int(code)}): {escape(message)}",
        soft_wrap=True,  # one line, whatever the terminal's width: greppable
    )
    if output.json_mode:
        output.emit_json(_error_object(output, code, message, kind, thread_id))


def _error_object(
    output: Output, code: ExitCode | int, message: str, kind: str, thread_id: str | None
) -> dict[str, Any]:
    """The one JSON object of a command that ended in an error."""
    return {
        "thread_id": thread_id,
        "status": "error",
        "exit_code": int(code),
        "error": message,
        "error_type": kind,
        "notes": output.notes,
    }


CLICK_ERRORS = sys.modules[typer.BadParameter.__module__]
"""The click exceptions typer raises: its own copy (``typer._click``) since 0.2x, click's before."""


def wants_json(args: list[str]) -> bool:
    """Whether a command line asks for ``--json`` (before any ``--``), parsed or not."""
    words = args[: args.index("--")] if "--" in args else args
    return "--json" in words


def usage_failed(exc: Exception, *, json_mode: bool) -> int:
    """Report a usage error (unknown option, missing value) as typer would, and return its code.

    The usage and the message go to stderr in typer's own format; with
    ``--json`` on the command line stdout also gets the error object every
    other error prints (``error_type`` ``UsageError``, ``exit_code`` 2), so a
    script reading stdout is never left with nothing.

    Args:
        exc: the ``ClickException`` (of ``CLICK_ERRORS``) raised while parsing
            (``standalone_mode=False``).
        json_mode: whether the command line had ``--json``.

    Returns:
        The exit code: the error's own (2 for a usage error).
    """
    try:
        from typer import rich_utils

        rich_utils.rich_format_error(exc)  # type: ignore[arg-type]
    except ImportError:  # pragma: no cover - typer depends on rich
        exc.show()  # type: ignore[attr-defined]
    code = int(getattr(exc, "exit_code", ExitCode.BAD_INPUT))
    if exc.__class__.__name__ == "NoArgsIsHelpError":
        return code  # the help was printed; nothing was asked of --json
    if json_mode:
        usage = isinstance(exc, CLICK_ERRORS.UsageError)
        kind = "UsageError" if usage else type(exc).__name__
        message = exc.format_message()  # type: ignore[attr-defined]
        Output(json_mode=True).emit_json(_error_object(Output(), code, message, kind, None))
    return code
