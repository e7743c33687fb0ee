"""The ``effectgate`` command: demo, run, resume, review, inspect the ledger.

The console script ``effectgate`` calls ``main()``; ``python -m effectgate.cli``
does the same. Exit codes are listed in ``effectgate.cli._exit`` (and in
``effectgate --help`` and ``docs/cli.md``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from effectgate.cli._exit import ExitCode
from effectgate.cli._loader import AgentRecipe

__all__ = ["AgentRecipe", "ExitCode", "main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``effectgate`` command line and exit with its status.

    Args:
        argv: arguments without the program name; default ``sys.argv[1:]``.

    Raises:
        SystemExit: always, with the command's exit code.
    """
    from effectgate.cli._signals import STOPPER

    # First thing: from here on no SIGINT / SIGTERM kills the process silently
    # (importing typer, rich and the commands takes a noticeable moment).
    STOPPER.install()
    # A worker pool starts its children with both signals blocked (so that a
    # stop passed on during their start-up is not lost): handled from here.
    STOPPER.unblock()
    _quiet_missing_node_warning()
    import typer

    from effectgate.cli._app import app
    from effectgate.cli._output import CLICK_ERRORS, usage_failed, wants_json

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        # Not standalone: a usage error comes back here, so that --json
        # reports it on stdout like every other error (usage_failed).
        code = app(args=args, prog_name="effectgate", standalone_mode=False)
    except CLICK_ERRORS.ClickException as exc:
        sys.exit(usage_failed(exc, json_mode=wants_json(args)))
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


class _MissingNodeFilter(logging.Filter):
    """Drops LangGraph's "Ignoring unknown node name ..." warning.

    The command checks every pending task's node itself before running and
    refuses with one line naming the missing tool and how to provide it
    (``Agent._missing_nodes``); LangGraph's warning, printed first by
    logging's last-resort handler, only repeated it as noise.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Ignoring unknown node name")


def _quiet_missing_node_warning() -> None:
    logging.getLogger("langgraph.pregel._algo").addFilter(_MissingNodeFilter())
