"""Exit codes of the ``effectgate`` command, in one table.

Scripts and CI branch on these numbers, so they never change meaning:

=====  ==========================  ==================================================
code   name                        meaning
=====  ==========================  ==================================================
0      DONE                        the thread finished (or the command succeeded)
1      ERROR                       an unexpected error; the thread stays resumable
2      BAD_INPUT                   usage error, malformed decisions file, an answer
                                   the graph refused, unknown thread or operation,
                                   state directory not ours, bad model spec, a
                                   PostgreSQL login or database the server refused
3      WAITING_RECONCILIATION      an outcome is unknown; a human verdict is needed
                                   (3 is the customary code for NEEDS_RECONCILIATION)
4      WAITING_REVIEW              side effects await approve / edit / reject
5      INCOMPLETE                  stopped early (model error), or SIGINT / SIGTERM
                                   received at any point; ``effectgate resume``
                                   continues (or, if nothing started, a re-run)
75     BUSY                        another live process holds the thread (or took
                                   this one's attempt over), a ledger
                                   lock wait timed out, or the database stayed
                                   unreachable past the retries (EX_TEMPFAIL)
137    KILLED                      the process died at a failpoint (``--crash-at``)
=====  ==========================  ==================================================
"""

from __future__ import annotations

import enum

from effectgate._failpoints import EXIT_CODE as FAILPOINT_EXIT_CODE
from effectgate.errors import (
    ClaimLostError,
    ConfigError,
    DecisionError,
    EffectgateError,
    LedgerBusyError,
    ThreadBusyError,
)

__all__ = ["EXIT_CODE_HELP", "ExitCode", "code_for_error", "code_for_status"]


class ExitCode(enum.IntEnum):
    """The process exit status of every ``effectgate`` command."""

    DONE = 0
    ERROR = 1
    BAD_INPUT = 2
    WAITING_RECONCILIATION = 3
    WAITING_REVIEW = 4
    INCOMPLETE = 5
    BUSY = 75
    KILLED = FAILPOINT_EXIT_CODE


# Most specific class first: the first ``isinstance`` match wins.
_ERRORS: tuple[tuple[type[BaseException], ExitCode], ...] = (
    (ThreadBusyError, ExitCode.BUSY),
    # This process's attempt was fenced off mid-call: another worker took the
    # thread over (its late result is kept as evidence); the thread is theirs.
    (ClaimLostError, ExitCode.BUSY),
    # A lock wait that timed out, or a database that stayed unavailable
    # (DatabaseUnavailableError, a LedgerBusyError), is as retryable as a busy thread.
    (LedgerBusyError, ExitCode.BUSY),
    (ConfigError, ExitCode.BAD_INPUT),
    (DecisionError, ExitCode.BAD_INPUT),
    (EffectgateError, ExitCode.ERROR),
)

_STATUSES: dict[str, ExitCode] = {
    "done": ExitCode.DONE,
    "waiting_review": ExitCode.WAITING_REVIEW,
    "waiting_reconciliation": ExitCode.WAITING_RECONCILIATION,
    "incomplete": ExitCode.INCOMPLETE,
    # Nothing checkpointed yet: like a run stopped early, ``resume`` starts it again.
    "not_started": ExitCode.INCOMPLETE,
}

EXIT_CODE_HELP = (
    "Exit codes: 0 done; 1 error; 2 bad input (usage, decisions file, an answer the graph "
    "refused, unknown thread or operation, state directory not ours, a database login "
    "refused); 3 waiting for reconciliation; 4 waiting for review; 5 incomplete (stopped "
    "early, or SIGINT / SIGTERM received; resumable); 75 thread busy, ledger locked or "
    "database unavailable (try again); 137 killed at a failpoint."
)
"""One paragraph for ``--help`` texts."""


def code_for_error(exc: BaseException) -> ExitCode:
    """Map an exception to the exit code the command ends with.

    Args:
        exc: the exception that ended the command.

    Returns:
        The first matching entry of the table, or ``ExitCode.ERROR``.
    """
    for cls, code in _ERRORS:
        if isinstance(exc, cls):
            return code
    return ExitCode.ERROR


def code_for_status(status: str) -> ExitCode:
    """Map a ``RunStatus`` value (``"done"``, ``"waiting_review"``...) to an exit code.

    Args:
        status: a ``RunStatus`` (a ``StrEnum``) or its string value.

    Returns:
        The exit code; ``ExitCode.ERROR`` for a status this build does not know.
    """
    return _STATUSES.get(str(status), ExitCode.ERROR)
