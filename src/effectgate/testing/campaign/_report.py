"""Sum trials per system (and per scenario) and render the Markdown tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from effectgate.testing.campaign._harness import (
    FAULT_KINDS,
    PG_FAULTS_SCENARIOS,
    SCENARIOS,
    TrialResult,
)

__all__ = ["render_markdown", "summarize"]

_COLUMNS = (
    ("trials", "trials"),
    ("faults", "faults"),
    ("kills", "kills"),
    ("duplicate_tickets", "duplicate tickets"),
    ("duplicate_mails", "duplicate mails"),
    ("lost_actions", "lost actions"),
    ("left_unknown", "left unknown"),
    ("invalid_histories", "invalid histories"),
    ("mean_resumes", "mean resumes"),
    ("unfinished", "unfinished"),
)


def _sum(trials: Sequence[TrialResult]) -> dict[str, Any]:
    unknown = [t.left_unknown for t in trials if t.left_unknown is not None]
    n = len(trials)
    return {
        "trials": n,
        # None: a system that injects nothing but SIGKILLs (see "kills").
        "faults": sum(sum(t.faults.values()) for t in trials)
        if any(t.faults for t in trials)
        else None,
        "kills": sum(t.kills for t in trials),
        "duplicate_tickets": sum(t.duplicate_tickets for t in trials),
        "duplicate_mails": sum(t.duplicate_mails for t in trials),
        "trials_with_duplicates": sum(
            1 for t in trials if t.duplicate_tickets or t.duplicate_mails
        ),
        "lost_actions": sum(t.lost_actions for t in trials),
        "trials_with_lost_actions": sum(1 for t in trials if t.lost_actions),
        # None: the system keeps no record of attempts (the baseline).
        "left_unknown": sum(unknown) if unknown or not trials else None,
        "invalid_histories": sum(1 for t in trials if t.history_problems),
        "mean_resumes": round(sum(t.resumes for t in trials) / n, 2) if n else 0.0,
        "unfinished": sum(1 for t in trials if not t.finished),
        "held_for_human": sum(1 for t in trials if t.held),
        "verdicts": sum(t.verdicts for t in trials),
        "stalled": sum(1 for t in trials if t.stalled),
        "runner_refused_fork": sum(1 for t in trials if t.runner_refused_fork),
        "mean_trial_s": round(sum(t.duration_s for t in trials) / n, 2) if n else 0.0,
    }


def summarize(results: Iterable[TrialResult]) -> dict[str, Any]:
    """Sum trial results per system, and per system and scenario.

    Args:
        results: finished trials, any order.

    Returns:
        ``{"systems": {system: totals}, "scenarios": {system: {scenario: totals}},
        "fault_kinds": {system: {kind: totals}}}``; totals hold the table's
        columns plus ``trials_with_duplicates``, ``trials_with_lost_actions``,
        ``held_for_human``, ``verdicts``, ``stalled``, ``runner_refused_fork`` and
        ``mean_trial_s`` (seconds). ``fault_kinds`` (systems that inject
        faults only) sums, per kind, the trials in which that kind was delivered.
    """
    by_system: dict[str, list[TrialResult]] = {}
    for trial in results:
        by_system.setdefault(trial.system, []).append(trial)
    systems = {name: _sum(trials) for name, trials in by_system.items()}
    scenarios = {
        name: {
            scenario: _sum([t for t in trials if t.scenario == scenario])
            for scenario in (*SCENARIOS, *PG_FAULTS_SCENARIOS)
            if any(t.scenario == scenario for t in trials)
        }
        for name, trials in by_system.items()
    }
    kinds = {
        name: {
            kind: _sum([t for t in trials if t.faults.get(kind)])
            for kind in FAULT_KINDS
            if any(t.faults.get(kind) for t in trials)
        }
        for name, trials in by_system.items()
        if any(t.faults for t in trials)
    }
    return {"systems": systems, "scenarios": scenarios, "fault_kinds": kinds}


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value)


def _table(rows: Mapping[str, Mapping[str, Any]], first: str) -> list[str]:
    # The faults column only where some row injected faults (older reports keep their shape).
    columns = [
        (key, title)
        for key, title in _COLUMNS
        if key != "faults" or any(row.get("faults") is not None for row in rows.values())
    ]
    head = f"| {first} | " + " | ".join(title for _, title in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    body = [
        f"| {name} | " + " | ".join(_cell(row.get(key)) for key, _ in columns) + " |"
        for name, row in rows.items()
    ]
    return [head, rule, *body]


def render_markdown(summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """Render the per-system table, then one per-scenario table per system.

    Args:
        summary: ``summarize``'s result.
        meta: ``command``, ``trials_per_system``, ``elapsed_s`` and versions;
            ``complete`` False with ``trials_completed`` for an interrupted run.

    Returns:
        Markdown text ending with a newline.
    """
    lines = [
        "# Kill campaign results",
        "",
        f"Command: `{meta.get('command', '?')}`  ",
        f"Trials per system: {meta.get('trials_per_system', '?')}"
        + (
            f" planned, {meta['trials_completed']} completed (stopped early)"
            if meta.get("complete") is False
            else ""
        )
        + f"; wall time {meta.get('elapsed_s', '?')} s; "
        f"versions: {meta.get('versions', {})}",
        "",
        *_table(summary["systems"], "system"),
        "",
        "Duplicates and lost actions are counted in the ticket service's and the mail "
        "sink's own SQLite files and the workspace bytes; *left unknown* is what the "
        "system itself still holds as unresolved (n/a: it keeps no record).",
        "",
    ]
    for system, scenarios in summary["scenarios"].items():
        lines += [f"## {system} by scenario", "", *_table(scenarios, "scenario"), ""]
    for system, kinds in summary.get("fault_kinds", {}).items():
        lines += [
            f"## {system} by fault kind",
            "",
            "Each row: the trials in which at least one fault of that kind was delivered "
            "(a trial with several kinds is in several rows).",
            "",
            *_table(kinds, "fault"),
            "",
        ]
    return "\n".join(lines)
