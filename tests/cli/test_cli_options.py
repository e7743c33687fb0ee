"""Every command takes the options docs/cli.md promises, and flags read as flags in --help."""

from __future__ import annotations

import json
from typing import Any

import typer.main
from typer.testing import CliRunner

from effectgate.cli._app import app


def _commands() -> dict[str, Any]:
    """Every leaf command by its full name (``ledger list``); groups have ``.commands``."""
    group: Any = typer.main.get_command(app)
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            for sub, leaf in command.commands.items():
                found[f"{name} {sub}"] = leaf
        else:
            found[name] = command
    return found


def test_every_command_takes_state_dir_and_json() -> None:
    commands = _commands()
    assert "failpoints" in commands and "ledger list" in commands
    for name, command in commands.items():
        opts = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert {"--state-dir", "--json"} <= opts, name


def test_flags_show_no_value_placeholder_in_help() -> None:
    """``--json <bool>`` reads as if it took a value; a flag shows none."""
    runner = CliRunner()
    for name in ("demo", "run", "resume", "reconcile", "ledger list", "failpoints"):
        ran = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"})
        assert ran.exit_code == 0, ran.output
        lines = [line for line in ran.output.splitlines() if "--json" in line]
        assert lines and all("<bool>" not in line for line in lines), (name, lines)


def test_failpoints_json_lists_the_seams() -> None:
    ran = CliRunner().invoke(app, ["failpoints", "--json", "--state-dir", "unused"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.output)["failpoints"][0] == "AFTER_REVIEW_RECORDED"


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    ran = CliRunner().invoke(app, ["--version"])
    assert ran.exit_code == 0, ran.output
    assert ran.output.strip() == f"effectgate {version('effectgate')}"


def test_no_flag_shows_a_type_in_help_not_even_help_itself() -> None:
    """typer prints ``--help <bool>`` unless told otherwise (seen by a new user)."""
    runner = CliRunner()
    for name in ("", "worker", "threads", "ledger list"):
        ran = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"})
        assert ran.exit_code == 0, ran.output
        assert "--help" in ran.output and "<bool>" not in ran.output, (name, ran.output)
