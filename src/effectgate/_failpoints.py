"""Named seams where tests and people kill the process on purpose (DESIGN §7).

Setting ``EFFECTGATE_FAILPOINT=<NAME>`` makes the process ``os._exit(137)``
when it reaches that seam; ``<NAME>@<tool>`` limits it to one tool's effect
node, and ``<NAME>#<n>`` to the n-th time the seam is reached in this process
(1-based). Each member is called in exactly one place (DBOS
``_debug_trigger``); a meta-test checks that every member has a crash test.
"""

from __future__ import annotations

import enum
import os
import sys
import threading

__all__ = ["ENV_VAR", "EXIT_CODE", "Failpoint", "hit"]

ENV_VAR = "EFFECTGATE_FAILPOINT"
EXIT_CODE = 137
"""Exit status of a process killed at a failpoint (as SIGKILL's 128 + 9)."""


class Failpoint(enum.StrEnum):
    """The seams of DESIGN §7."""

    AFTER_REVIEW_RECORDED = "AFTER_REVIEW_RECORDED"
    """Review decisions and approvals are in the ledger; the checkpoint is not."""
    AFTER_IN_FLIGHT_COMMIT = "AFTER_IN_FLIGHT_COMMIT"
    """The attempt is durably IN_FLIGHT; the tool has not been called."""
    AFTER_EXTERNAL_COMMIT = "AFTER_EXTERNAL_COMMIT"
    """The external system committed and answered; the ledger result is not written."""
    AFTER_LEDGER_RESULT = "AFTER_LEDGER_RESULT"
    """The ledger holds the result; the checkpoint with the ToolMessage does not."""
    MID_SUPERSTEP = "MID_SUPERSTEP"
    """One of several parallel effect nodes finished; its siblings may not have."""


_counts: dict[str, int] = {}
_lock = threading.Lock()


def _parse(spec: str) -> tuple[str, str | None, int | None]:
    name, nth = spec, None
    if "#" in name:
        name, _, n = name.partition("#")
        nth = int(n)
    tool = None
    if "@" in name:
        name, _, tool = name.partition("@")
    return name.strip().upper(), tool, nth


def hit(point: Failpoint, *, tool: str | None = None) -> None:
    """Exit the process at once if ``EFFECTGATE_FAILPOINT`` names this seam.

    Args:
        point: the seam being passed.
        tool: the tool whose effect is at the seam, matched against ``@tool``.

    Note:
        ``os._exit`` skips ``finally`` blocks, atexit hooks and buffered
        writes, as a power cut or ``kill -9`` would.
    """
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    name, want_tool, nth = _parse(spec)
    if name != point.value or (want_tool is not None and want_tool != tool):
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        count = _counts[name]
    if nth is not None and count != nth:
        return
    sys.stderr.write(f"effectgate: failpoint {point.value} reached; exiting {EXIT_CODE}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
