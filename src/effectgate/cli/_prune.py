"""``effectgate prune``: retention for a state directory (``effectgate.retention``).

The state is wherever the directory keeps it: its SQLite files, or the
PostgreSQL store its marker records (``--store`` on its first run).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from rich.table import Table

from effectgate.cli._exit import ExitCode
from effectgate.cli._output import Output
from effectgate.errors import ConfigError
from effectgate.retention import PrunePolicy, PruneReport, Vacuum

__all__ = ["parse_duration", "run_prune"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


_LONGEST = timedelta(days=365 * 1000)
"""The longest age a flag takes: ``now - age`` must still be a date."""


def parse_duration(text: str | None, flag: str) -> timedelta | None:
    """Parse ``30d``, ``12h``, ``90m``, ``45s``, ``2w``; ``none``/``off``: ``None``.

    Raises:
        ConfigError: anything else (the message names the flag).
    """
    if text is None or text.strip().lower() in ("none", "off", "never"):
        return None
    found = _DURATION.match(text.lower())
    if found is None:
        raise ConfigError(f"{flag}: {text!r} is not a duration (e.g. 30d, 12h, 90m, 45s, none)")
    try:
        value = timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])
    except OverflowError:
        value = timedelta.max
    if value > _LONGEST:
        raise ConfigError(f"{flag}: {text!r} is longer than {_LONGEST.days // 365} years")
    return value


def run_prune(
    state_dir: Path,
    output: Output,
    *,
    keep_last: int | None,
    finished_older_than: str | None,
    threads: list[str],
    operations_after: str,
    tombstones_after: str,
    vacuum: Vacuum,
    deleted_by: str,
    vacuum_wait: str = "30s",
    reason: str | None,
    dry_run: bool,
) -> int:
    """Prune the state directory; print the report. Returns the exit code.

    0, or 75 (``ExitCode.BUSY``) when the closing VACUUM met a lock held past
    ``vacuum_wait``: the report of what was removed is printed first, then
    one line saying the VACUUM was skipped.
    """
    from effectgate._app import StateDir
    from effectgate.cli._runs import inspection_agent

    wait = parse_duration(vacuum_wait, "--vacuum-wait")
    if wait is None or wait <= timedelta(0):
        raise ConfigError(f"--vacuum-wait: {vacuum_wait!r} must be a positive duration (e.g. 30s)")
    policy = PrunePolicy(
        keep_last=keep_last,
        finished_older_than=parse_duration(finished_older_than, "--finished-older-than"),
        delete_threads=tuple(threads),
        operations_after=parse_duration(operations_after, "--operations-after"),
        tombstones_after=parse_duration(tombstones_after, "--tombstones-after"),
        deleted_by=deleted_by,
        reason=reason,
        vacuum=vacuum,
        vacuum_wait=wait,
    )
    policy.check()
    sd = StateDir.open(state_dir, create=False)
    if sd.store is None:
        sd.refuse_lost(sd.checkpoints, sd.ledger)  # a lost file is not "no threads yet"
    if sd.store is None and (not sd.ledger.is_file() or not sd.checkpoints.is_file()):
        raise ConfigError(f"{sd.root} has no threads yet: nothing to prune")
    with inspection_agent(sd) as agent:
        for thread_id in threads:
            if agent.ledger.get_thread(thread_id) is None:
                raise ConfigError(f"unknown thread {thread_id!r} in {sd.root} (nothing pruned)")
        report = agent.prune(policy, dry_run=dry_run)
    if output.json_mode:
        output.emit_json(report.as_json())
    else:
        output.out.print(_table(report))
    if report.vacuum_skipped is not None:
        output.err.print(report.vacuum_skipped, markup=False, highlight=False, soft_wrap=True)
        return int(ExitCode.BUSY)
    return 0


def _table(report: PruneReport) -> Table:
    verb = "would remove" if report.dry_run else "removed"
    table = Table(title=f"prune ({verb})", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("threads deleted", ", ".join(report.threads_deleted) or "-")
    for thread_id, why in report.threads_kept.items():
        table.add_row(f"kept {thread_id}", why)
    table.add_row("checkpoints", str(report.checkpoints_removed))
    table.add_row("writes", str(report.writes_removed))
    table.add_row("payload bytes", f"{report.payload_bytes:,}")
    table.add_row("operations compacted", str(report.operations_compacted))
    table.add_row("operation tombstones removed", str(report.operation_tombstones_removed))
    for name, sizes in report.files.items():
        table.add_row(f"{name} bytes", f"{sizes['before']:,} -> {sizes['after']:,}")
    table.add_row("seconds", f"{report.seconds:.2f}")
    return table
