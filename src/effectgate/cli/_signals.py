"""SIGINT and SIGTERM for the whole life of a command, with one documented outcome.

``main()`` installs the handlers before anything else, so no signal can kill
the process silently (exit 130 / 143 with no output). What a signal does
depends on the stage the command is in (``Mode``):

- ``DEFER`` (parsing the command line, or exiting): remembered; the command
  refuses to start when it begins, and ends with exit 5. A second signal
  here ends the process with exit 5 at once.
- ``IMMEDIATE`` (read-only commands): raise ``KeyboardInterrupt`` at once.
- ``GRACEFUL`` (``demo``, ``run``, ``resume``, ``worker``): the first signal
  asks the running graph to stop at the next superstep boundary
  (``Agent.request_stop``), or, at an interactive prompt, leaves the review
  pending; no new run starts. It says so in one note on stderr (the sign that
  it was seen). A second signal of either kind aborts at once
  (``KeyboardInterrupt``), even inside a tool call.

Either way the command ends with exit 5 (INCOMPLETE); every effect that
started is in the ledger, so aborting is as safe as ``kill -9`` (the dispatch protocol).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

from effectgate.cli._exit import ExitCode

__all__ = ["STOPPER", "Mode", "RunAborted", "Stoppable", "Stopper"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_POLL_S = 0.05
"""How often a stop request is repeated until the run picks it up (seconds)."""
_REDELIVER_S = 0.25
"""How long a prompt interrupt may stay unanswered before it is sent again (seconds)."""


class Mode(enum.StrEnum):
    """What the first signal does in the current stage of a command."""

    DEFER = "defer"
    IMMEDIATE = "immediate"
    GRACEFUL = "graceful"


class RunAborted(KeyboardInterrupt):
    """A second signal aborted the run of one thread (``effectgate worker``).

    A ``KeyboardInterrupt``, so everything that handles an abort handles it;
    it carries what a worker alone knows when it aborts: the thread it was
    running, for the error line, the JSON error object and the resume hint
    (``cli._output.handled``).

    Args:
        thread_id: the thread whose run the signal cut off.
    """

    def __init__(self, thread_id: str) -> None:
        super().__init__(thread_id)
        self.thread_id = thread_id


class Stoppable(Protocol):
    """An agent whose current run can be asked to stop at a step boundary."""

    def request_stop(self, reason: str = ...) -> None:
        """Ask the current run to stop at the next superstep boundary."""


class Stopper:
    """The process's SIGINT / SIGTERM handler and what it has seen so far."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        """The first signal received (``"SIGINT"``...), or ``None``."""
        self.aborted_by: str | None = None
        """The second signal, which aborted the command, or ``None``."""
        self.mode = Mode.DEFER
        self.say: Callable[[str], None] = lambda text: None
        self._stopped = threading.Event()
        self._prompt_depth = 0
        self._prompt_interrupt: int | None = None
        self._redelivering = False
        self._previous: dict[int, Any] | None = None

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self.signal_name is not None

    @property
    def reason(self) -> str:
        """``"stopped by SIGTERM"``, or ``"stopped"`` when no signal came."""
        return f"stopped by {self.signal_name}" if self.signal_name else "stopped"

    def install(self) -> bool:
        """Install the handlers (main thread only); return whether they are in place."""
        if self._previous is not None:
            return True
        try:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS}
        except ValueError:  # not the main thread: signals cannot be caught here
            return False
        return True

    def unblock(self) -> None:
        """Deliver SIGINT and SIGTERM to the handlers again if this thread had them blocked.

        A process started with them blocked (a worker pool's child, see
        ``effectgate.cli._workers``) receives any that came meanwhile now.
        """
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    def uninstall(self) -> None:
        """Put back the handlers found by ``install``."""
        if self._previous is not None:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        self._previous = None

    def reset(self) -> None:
        """Forget every signal seen (tests, several commands in one process)."""
        self.signal_name = self.aborted_by = None
        self._stopped.clear()
        self._prompt_depth = 0
        self._prompt_interrupt = None
        self.mode = Mode.DEFER

    @contextlib.contextmanager
    def command(
        self, mode: Mode, say: Callable[[str], None], *, reads_stop: bool = False
    ) -> Iterator[None]:
        """Run a command body in ``mode``; raise ``KeyboardInterrupt`` if a stop came first.

        Args:
            mode: what the first signal does while the body runs.
            say: where the first signal's note goes (``GRACEFUL``).
            reads_stop: the body reads ``requested`` itself and ends with its
                own summary (``effectgate worker``): a stop that came first
                (while the command line was parsed) does not raise.
        """
        installed_here = self._previous is None and self.install()
        self.mode, self.say = mode, say
        try:
            if self.requested and not reads_stop:
                raise KeyboardInterrupt
            yield
        finally:
            self.mode = Mode.DEFER
            if installed_here:
                self.uninstall()

    @contextlib.contextmanager
    def prompt(self) -> Iterator[None]:
        """Let the first signal interrupt a blocking prompt (``KeyboardInterrupt``).

        Python drops an exception raised by a signal handler while the main
        thread runs a weakref callback or ``__del__`` ("Exception ignored
        in ..."), for example during a lazy import at the prompt; the
        prompt would then wait on as if no signal had come. So until the
        ``KeyboardInterrupt`` has left this block, the signal is sent again
        every ``_REDELIVER_S`` seconds (``_redeliver``).
        """
        self._prompt_depth += 1
        try:
            yield
        finally:
            self._prompt_depth -= 1
            self._prompt_interrupt = None

    @contextlib.contextmanager
    def running(self, agent: Stoppable) -> Iterator[None]:
        """Forward a stop request to ``agent`` for as long as the block runs.

        The request is repeated until the block ends: a signal that lands
        before the run has begun (lease, recovery) is not lost.
        """
        done = threading.Event()

        def forward() -> None:
            while not done.is_set():
                if self._stopped.wait(_POLL_S):
                    agent.request_stop(self.reason)
                    done.wait(_POLL_S)

        watcher = threading.Thread(target=forward, name="effectgate-stop", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _redeliver(self) -> None:
        """Send the prompt's interrupt again until it has unwound the prompt."""
        while True:
            time.sleep(_REDELIVER_S)
            signum = self._prompt_interrupt
            if signum is None or not self._prompt_depth:
                return
            self._redelivering = True
            os.kill(os.getpid(), signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._redelivering:
            self._redelivering = False
            if self._prompt_interrupt is not None and self._prompt_depth:
                raise KeyboardInterrupt
            return
        if self.requested:
            self.aborted_by = name
            if self.mode is Mode.DEFER:
                # No command body is running (parsing, or exiting after the
                # summary): nothing to unwind, and click would turn the
                # exception into "Aborted!" with exit 1.
                os.write(2, f"effectgate: aborted by a second {name}\n".encode())
                os._exit(int(ExitCode.INCOMPLETE))
            raise KeyboardInterrupt
        self.signal_name = name
        self._stopped.set()
        if self._prompt_depth:
            self._prompt_interrupt = signum
            threading.Thread(
                target=self._redeliver, name="effectgate-prompt-signal", daemon=True
            ).start()
            raise KeyboardInterrupt
        if self.mode is Mode.IMMEDIATE:
            raise KeyboardInterrupt
        if self.mode is Mode.GRACEFUL:
            again = "Ctrl-C again" if name == "SIGINT" else "a second SIGTERM or Ctrl-C"
            self.say(f"{name}: stopping at the next step boundary ({again} aborts now)")


STOPPER = Stopper()
"""The one handler of this process (signal handlers are process-wide)."""
