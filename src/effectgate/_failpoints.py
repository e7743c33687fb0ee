"""Named seams where tests and people kill the process on purpose (docs/architecture.md).

Setting ``EFFECTGATE_FAILPOINT=<NAME>`` makes the process ``os._exit(137)``
when it reaches that seam; ``<NAME>@<tool>`` limits it to one tool's effect
node, and ``<NAME>#<n>`` to the n-th time the seam is reached in this process
(1-based). Each member is called in exactly one place (DBOS
``_debug_trigger``); a meta-test checks that every member has a crash test.

With ``EFFECTGATE_FAILPOINT_ACTION=stop`` the process stops itself there
instead (``SIGSTOP``) and goes on past the seam once something sends it
``SIGCONT``: a fault campaign breaks the database or the network, or waits
past the process's lease, while the process is frozen at the seam.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
import threading
from collections.abc import Iterable

from effectgate.errors import ConfigError

__all__ = ["ACTION_VAR", "ENV_VAR", "EXIT_CODE", "Failpoint", "check", "hit", "per_tool"]

ENV_VAR = "EFFECTGATE_FAILPOINT"
EXIT_CODE = 137
"""Exit status of a process killed at a failpoint (as SIGKILL's 128 + 9)."""
HINT_VAR = "EFFECTGATE_FAILPOINT_HINT"
"""Set by the CLI to the command that continues the thread; printed on a failpoint exit."""
ACTION_VAR = "EFFECTGATE_FAILPOINT_ACTION"
"""``exit`` (default: ``os._exit(137)``) or ``stop`` (``SIGSTOP`` itself; on at ``SIGCONT``)."""
_ACTIONS = ("exit", "stop")


class Failpoint(enum.StrEnum):
    """The seams, in the order a side effect passes them.

    Public as ``effectgate.testing.Failpoint``. A member's value is the
    ``EFFECTGATE_FAILPOINT`` setting: ``f"{Failpoint.AFTER_EXTERNAL_COMMIT}"``,
    ``f"{...}@<tool>"`` for one tool's effect (the seams where ``per_tool`` is
    true), ``f"{...}#<n>"`` for the n-th time. The process killed there exits
    with ``EXIT_CODE`` (``effectgate.cli.ExitCode.KILLED``, 137); an unknown
    name or tool is refused with ``ConfigError`` before any I/O (``check``).
    """

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
    MID_MIGRATION = "MID_MIGRATION"
    """A PostgreSQL ledger migration ran one version's statements; its transaction is open.

    Passed once per version migrated (``#n``: after the n-th), at start-up,
    before any effect: a kill here must leave the schema at its old version.
    """


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


_PER_TOOL = frozenset(
    {
        Failpoint.AFTER_IN_FLIGHT_COMMIT,
        Failpoint.AFTER_EXTERNAL_COMMIT,
        Failpoint.AFTER_LEDGER_RESULT,
        Failpoint.MID_SUPERSTEP,
    }
)
"""Seams reached inside one tool's effect node, where ``@tool`` can select."""


def per_tool(point: Failpoint) -> bool:
    """Whether ``point`` is passed once per tool call, so ``NAME@tool`` can select it."""
    return point in _PER_TOOL


def check(effect_tools: Iterable[str], spec: str | None = None) -> None:
    """Refuse a failpoint setting that could never fire, before any I/O.

    A typo in ``EFFECTGATE_FAILPOINT`` would otherwise make a crash test that
    never crashes.

    Args:
        effect_tools: names of the side-effecting tools the agent has.
        spec: the setting; default: the environment variable (unset: no check).

    Raises:
        ConfigError: unknown seam name, ``@tool`` naming no effect tool or given
            for a seam that is not per tool, or ``#n`` not a positive integer.
    """
    spec = os.environ.get(ENV_VAR) if spec is None else spec
    if not spec:
        return
    try:
        name, tool, nth = _parse(spec)
    except ValueError as exc:
        raise ConfigError(f"{ENV_VAR}={spec!r}: '#n' must be an integer") from exc
    names = [fp.value for fp in Failpoint]
    if name not in names:
        raise ConfigError(f"{ENV_VAR}={spec!r}: unknown seam {name!r}; one of {', '.join(names)}")
    tools = sorted(effect_tools)
    if tool is not None and not per_tool(Failpoint(name)):
        raise ConfigError(f"{ENV_VAR}={spec!r}: {name} is not reached per tool; drop '@{tool}'")
    if tool is not None and tool not in tools:
        raise ConfigError(
            f"{ENV_VAR}={spec!r}: no side-effecting tool named {tool!r}; "
            f"one of {', '.join(tools) or '(none)'}"
        )
    if nth is not None and nth < 1:
        raise ConfigError(f"{ENV_VAR}={spec!r}: '#n' counts from 1")
    action = os.environ.get(ACTION_VAR) or "exit"
    if action not in _ACTIONS:
        raise ConfigError(f"{ACTION_VAR}={action!r}: one of {', '.join(_ACTIONS)}")


def hit(point: Failpoint, *, tool: str | None = None) -> None:
    """Exit the process at once if ``EFFECTGATE_FAILPOINT`` names this seam (or stop it).

    Args:
        point: the seam being passed.
        tool: the tool whose effect is at the seam, matched against ``@tool``.

    With ``EFFECTGATE_FAILPOINT_ACTION=stop`` the process sends itself
    ``SIGSTOP`` instead and returns once it is continued (``SIGCONT``).

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
    if os.environ.get(ACTION_VAR) == "stop":
        sys.stderr.write(f"effectgate: failpoint {point.value} reached; stopping (SIGSTOP)\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    sys.stderr.write(f"effectgate: failpoint {point.value} reached; exiting {EXIT_CODE}\n")
    if os.environ.get(HINT_VAR):
        sys.stderr.write(f"effectgate: continue with: {os.environ[HINT_VAR]}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
