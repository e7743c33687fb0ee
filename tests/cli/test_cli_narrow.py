"""Listings on an 80-column terminal and through a pipe keep every id on one line (issue #36)."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

from rich.console import Console

from effectgate.ledger import SqliteLedger
from tests.cli.conftest import CLI, Ran, cli_env


def _piped(*args: str) -> str:
    env = {**cli_env(), "COLUMNS": "80"}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _ids(state: Path) -> tuple[list[str], list[str]]:
    with SqliteLedger(state / "ledger.sqlite3") as ledger:
        ops = [op.operation_id for op in ledger.list()]
        threads = [t.thread_id for t in ledger.list_threads()]
    return ops, threads


def test_piped_listings_are_one_tab_separated_line_per_row(
    finished_demo: tuple[Path, Ran],
) -> None:
    """COLUMNS=80 and a pipe: each row is one line, its id the first field, whole."""
    state, _ = finished_demo
    ops, threads = _ids(state)
    assert max(map(len, ops)) > 30  # long enough to have wrapped in an 80-column table
    listed = _piped("ledger", "list", "--state-dir", str(state)).splitlines()
    assert [line.split("\t")[0] for line in listed] == ops
    assert all(line.split("\t")[2] == "SUCCEEDED" for line in listed)
    events = _piped("ledger", "events", "--state-dir", str(state)).splitlines()
    assert {line.split("\t")[2] for line in events} == set(ops)
    rows = _piped("threads", "--state-dir", str(state)).splitlines()
    assert [line.split("\t")[0] for line in rows] == threads == ["demo-1"]
    assert rows[0].split("\t")[1] == "done"


def test_an_80_column_terminal_never_breaks_an_id(finished_demo: tuple[Path, Ran]) -> None:
    """On a terminal too narrow for the table each row becomes a block; ids stay whole."""
    state, _ = finished_demo
    ops, _ = _ids(state)
    script = (
        "import sys; from effectgate.cli import main; "
        f"main(['ledger', 'list', '--state-dir', {str(state)!r}])"
    )
    # A real terminal for stdout: rich decides from isatty, as for a person.
    out = _in_a_terminal(script)
    for op in ops:
        assert any(op in line for line in out.splitlines()), (op, out)


def _in_a_terminal(script: str) -> str:
    """Run ``python -c script`` with stdout on a pseudo-terminal 80 columns wide; its output."""
    import pty
    import sys

    leader, follower = pty.openpty()
    env = {**cli_env(), "COLUMNS": "80"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=follower, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env)  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_a_wide_terminal_keeps_the_table_with_ids_on_one_line() -> None:
    """Wide enough: the rich table, and a long id is not folded even when the task is."""
    from datetime import UTC, datetime

    from effectgate.cli._render import print_listing, threads_table
    from effectgate.ledger import ThreadRecord

    record = ThreadRecord(
        thread_id="incident-2026-12-04-orders-error-rate-abcdef",
        input={"task": "a long task " * 20},
        metadata={"kind": "run", "model": "scripted:incident"},
        created_at=datetime(2026, 12, 4, tzinfo=UTC),
    )
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=True, no_color=True)
    print_listing(console, threads_table([(record, "done")]))
    text = buffer.getvalue()
    assert "┏" in text and "-[ 1 ]-" not in text  # a table, not blocks
    assert any(record.thread_id in line for line in text.splitlines())


def test_report_tables_keep_every_column_on_80_columns(finished_demo: tuple[Path, Ran]) -> None:
    """``resume``'s ledger table, piped at 80 columns: each column's value is shown, not squeezed.

    Before, the 64-character operation id took the whole width and rich shrank
    the tool, state and attempt columns to nothing: the report listed ids
    with no state beside them.
    """
    state, _ = finished_demo
    ops, threads = _ids(state)
    out = _piped("resume", "--thread", threads[0], "--state-dir", str(state))
    lines = out.splitlines()
    for op in ops:
        assert any(op in line for line in lines), (op, out)
    assert out.count("SUCCEEDED") >= len(ops), out
    assert "send_email" in out and "create_ticket" in out, out


LONG_THREAD = "incident-2026-12-05-" + "orders-error-rate-" * 4 + "x" * 10
"""A thread id longer than an 80-column line (102 characters; its operation ids are longer)."""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(), "COLUMNS": "80"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)  # fmt: skip


def _whole(ids: list[str], out: str) -> None:
    lines = out.splitlines()
    for one in ids:
        assert any(one in line for line in lines), (one, out)


def test_ids_longer_than_the_line_are_never_broken(tmp_path: Path) -> None:
    """A 102-character thread id on 80 columns, piped and on a terminal: every id on one line.

    Before, the block views of ``run``/``resume``, the lines of ``pending``,
    the status line and ``ledger show`` broke such ids over two lines (and
    ``ledger show`` piped squeezed its events table to empty columns), so they
    could be neither copied nor ``grep``-ed.
    """
    import json

    model = tmp_path / "model.json"
    call = {"name": "write_file", "args": {"path": "a.txt", "content": "x"}}
    model.write_text(json.dumps({"name": "p", "final": "done", "turns": [{"tool_calls": [call]}]}))
    state = str(tmp_path / "state")
    sd = ("--state-dir", state)
    ran = _run("run", "write it", "--thread", LONG_THREAD, "--model", f"scripted:{model}", *sd)
    assert ran.returncode == 4, ran.stderr
    assert f"thread {LONG_THREAD}: waiting for review (exit code 4)" in ran.stdout.splitlines()
    waiting = _run("pending", *sd)
    assert waiting.returncode == 0, waiting.stderr
    op_id = f"{LONG_THREAD}:"
    (line,) = [ln for ln in waiting.stdout.splitlines() if ln.startswith("review thread")]
    assert line.startswith(f"review thread {LONG_THREAD}: write_file ({LONG_THREAD}:call_"), line
    resumed = _run("resume", "--thread", LONG_THREAD, "--approve", "all", *sd)
    assert resumed.returncode == 0, resumed.stderr
    with SqliteLedger(Path(state) / "ledger.sqlite3") as ledger:
        (op,) = ledger.list()
    assert op.operation_id.startswith(op_id) and len(op.operation_id) > 120
    _whole([op.operation_id, f"thread {LONG_THREAD}: done (exit code 0)"], resumed.stdout)
    assert (tmp_path / "state" / "workspace" / "a.txt").read_text() == "x"
    shown = _run("ledger", "show", op.operation_id, *sd)
    assert shown.returncode == 0, shown.stderr
    ids = [op.operation_id, op.thread_id, op.intent_hash]
    _whole(ids, shown.stdout)
    assert "SUCCEEDED" in shown.stdout and "PROPOSED -> APPROVED" in shown.stdout, shown.stdout
    script = (
        "import sys; from effectgate.cli import main; "
        f"main(['ledger', 'show', {op.operation_id!r}, '--state-dir', {state!r}])"
    )
    _whole(ids, _in_a_terminal(script))
