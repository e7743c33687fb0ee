"""Execute every walkthrough notebook top to bottom, then check the state it left behind.

The source of each notebook is ``notebooks/NN_*.py`` (jupytext percent format);
the ``.ipynb`` beside it is the same cells with the outputs of its last run
(``make notebooks``), so a code host shows results. The first tests check
that the two agree and that the committed notebook carries its outputs.

Each notebook runs in a fresh kernel on this interpreter (``sys.executable``,
through a kernelspec written into ``tmp_path``), with its working directory
and its state under ``tmp_path`` (``EFFECTGATE_NOTEBOOK_DIR``). A cell that
raises, or runs longer than ``CELL_TIMEOUT_S``, fails the test. Afterwards the
test reads what the notebook's run left in the external systems' own storage
and in the ledger, so a notebook whose story silently changed fails too.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from effectgate import StateDir
from effectgate.demo.services import read_mails, read_tickets
from effectgate.ledger import OpState, SqliteLedger
from effectgate.testing.oracle import checkpoint_problems, world

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NAMES = [
    "01_quickstart.ipynb",
    "02_approve_edit_reject.ipynb",
    "03_kill_and_resume.ipynb",
    "04_time_travel.ipynb",
    "05_unknown_outcomes.ipynb",
    "06_custom_tools.ipynb",
    "07_bring_your_own_graph.ipynb",
    "08_conversation.ipynb",
    "09_served.ipynb",
]
PICTURES = {"01_quickstart.ipynb": 2, "03_kill_and_resume.ipynb": 1, "05_unknown_outcomes.ipynb": 1}
"""How many PNG outputs each notebook shows (the graph, the state machine, timelines)."""
CELL_TIMEOUT_S = 60
SLOW_CELLS_S = {"09_served.ipynb": 180}
"""Per-cell timeouts above ``CELL_TIMEOUT_S``: 09 starts ``langgraph dev`` (up to 90 s)."""
KERNEL = "effectgate-test-venv"
NOTE = "incidents/orders-error-rate.md"


def kernel_manager(tmp_path: Path) -> KernelManager:
    """A kernel manager whose only kernel runs ``sys.executable -m ipykernel_launcher``."""
    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "effectgate venv", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)


def outputs_text(nb: Any) -> str:
    parts: list[str] = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out:
                parts.append(str(out["data"].get("text/plain", "")))
    return "\n".join(parts)


def the_state(base: Path, name: str) -> StateDir:
    (workdir,) = base.glob(f"{Path(name).stem}-*")
    return StateDir(workdir / "state")


# --- what each notebook must leave behind ---------------------------------------------------


def check_01(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails, list(w.files)) == (1, 1, [NOTE])
    with SqliteLedger(sd.ledger) as ledger:
        ops = ledger.list(thread_id="incident-1")
    assert [op.state for op in ops] == [OpState.SUCCEEDED] * 3
    assert "TICKET-1" in outputs_text(nb)
    assert checkpoint_problems(sd.checkpoints, "incident-1") == []


def check_02(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails) == (1, 1)
    assert w.files == {"notes/expiry.md": b"hi\n"}
    with SqliteLedger(sd.ledger) as ledger:
        states = {op.tool: op.state for op in ledger.list(thread_id="triage-1")}
        (mail,) = ledger.list(thread_id="triage-1", tool="send_email")
        (note,) = ledger.list(thread_id="note-1")
        note_approvals = [a.decision for a in ledger.approvals(note.operation_id)]
    assert states == {
        "create_ticket": OpState.SUCCEEDED,
        "send_email": OpState.SUCCEEDED,
        "write_file": OpState.REJECTED,
    }
    assert mail.args["to"] == ["oncall@example.com"]
    assert (note.state, note.attempt, note_approvals) == (OpState.SUCCEEDED, 1, ["approve"] * 2)
    text = outputs_text(nb)
    assert '+    "oncall@example.com"' in text and "expired" in text
    assert "already decided: ticket:orders-error-rate (approve)" in text
    assert "refused: this review answer names no review" in text


def check_03(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 1, 0, 0)
    with SqliteLedger(sd.ledger) as ledger:
        ops = {op.tool: op for op in ledger.list(thread_id="incident-1")}
        ticket_moves = [
            (e.src, e.dst) for e in ledger.events(operation_id="ticket:orders-error-rate")
        ]
    assert {t: op.state for t, op in ops.items()} == dict.fromkeys(ops, OpState.SUCCEEDED)
    sources = {t: op.receipt.source if op.receipt else None for t, op in ops.items()}
    assert (ops["create_ticket"].attempt, sources["create_ticket"]) == (1, "reconcile")
    assert sources["send_email"] == "reconcile"  # found by Message-ID after the failpoint kill
    assert (OpState.IN_FLIGHT, OpState.UNKNOWN) in ticket_moves
    assert w.files == {NOTE: ops["write_file"].args["content"].encode()}
    assert "exit status -9" in outputs_text(nb)


def check_04(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails, list(w.files)) == (1, 1, [NOTE])
    with SqliteLedger(sd.ledger) as ledger:
        metrics = ledger.metrics()
        rejected = ledger.list(states=[OpState.REJECTED])
    assert metrics.by_state["SUCCEEDED"] == 3 and metrics.results_reused > 10
    # the two re-planned calls with new ids; the conflicting ticket keeps its succeeded row
    assert sorted(op.tool for op in rejected) == ["send_email", "write_file"]
    text = outputs_text(nb)
    assert "stored_intent_hash" in text and "refused:" in text


def check_05(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails, w.duplicate_mails) == (1, 1, 0)
    assert w.files["deploy.log"] == b"orders v2 deployed\n"
    with SqliteLedger(sd.ledger) as ledger:
        sources = {op.tool: op.receipt.source for op in ledger.list() if op.receipt}
        parked = {e.operation_id for e in ledger.events() if e.dst is OpState.NEEDS_RECONCILIATION}
        assert ledger.metrics().open_unknowns == 0
    assert sources == {
        "create_ticket": "reconcile",
        "send_email": "human",
        "write_file": "dispatch",
        "run_shell": "human",
    }
    assert len(parked) == 2
    png = sd.root.parent / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1


def check_06(sd: StateDir, nb: Any) -> None:
    with SqliteLedger(sd.ledger) as ledger:
        states = {op.tool: (op.state, op.attempt) for op in ledger.list(thread_id="custom-1")}
        post = ledger.list(thread_id="custom-1", tool="post_status")[0]
        (second,) = ledger.list(thread_id="pitfall-1", tool="refund")
    assert states == {
        "refund": (OpState.SUCCEEDED, 1),
        "post_status": (OpState.SUCCEEDED, 1),
        "append_note": (OpState.NEEDS_RECONCILIATION, 1),
    }
    assert post.receipt is not None and post.receipt.source == "reconcile"
    # the pitfall: the second refund of B-3 mapped onto the first one's operation
    assert (second.operation_id, second.args["cents"]) == ("refund:B-3", 500)
    with sqlite3.connect(sd.root.parent / "external.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM posts").fetchone() == (1,)
        refunds = db.execute("SELECT order_id, cents FROM refunds ORDER BY order_id").fetchall()
    assert refunds == [("A-17", 1250), ("B-3", 500)]
    assert "already holds:" in outputs_text(nb)


def check_07(sd: StateDir, nb: Any) -> None:
    # three worlds side by side in the notebook's directory, one per middleware
    names = ("hitl", "effectgate-plain", "effectgate-declared")
    worlds = {name: StateDir(sd.root.parent / name) for name in names}
    titles = {name: [t["title"] for t in read_tickets(w.services)] for name, w in worlds.items()}
    assert titles == {
        "hitl": ["orders: error rate above 5%"] * 2,  # the resume re-ran the plain tool
        "effectgate-plain": ["orders: error rate above 5%"],
        "effectgate-declared": ["orders: error rate above 5%"],
    }
    sources = {}
    for name in ("effectgate-plain", "effectgate-declared"):
        with SqliteLedger(worlds[name].ledger) as ledger:
            (op,) = ledger.list()
        assert (op.state, op.attempt) == (OpState.SUCCEEDED, 1)
        sources[name] = op.receipt.source if op.receipt else None
    assert sources == {"effectgate-plain": "human", "effectgate-declared": "reconcile"}
    assert "ticket:orders-error-rate" in outputs_text(nb)


def check_08(sd: StateDir, nb: Any) -> None:
    # three turns on one thread: 1 ticket, 2 mails (on-call, then the edited recipient)
    w = world(sd)
    assert (w.tickets, w.mails, w.duplicate_tickets, w.duplicate_mails) == (1, 2, 0, 0)
    assert [m["rcpt_tos"] for m in read_mails(sd.services)] == [
        ["oncall@example.com"],
        ["dana.lead@example.com"],
    ]
    with SqliteLedger(sd.ledger) as ledger:
        ops = ledger.list(thread_id="incident-1")
        (edited,) = [op for op in ops if op.args.get("to") == ["dana.lead@example.com"]]
        decisions = [a.decision for a in ledger.approvals(edited.operation_id)]
        moves = [e.dst for e in ledger.events(operation_id=edited.operation_id) if e.dst]
    assert [op.state for op in ops] == [OpState.SUCCEEDED] * 3  # ticket, two mails
    assert decisions == ["edit"]
    assert edited.attempt == 1 and edited.receipt is not None
    assert edited.receipt.source == "reconcile"  # found by Message-ID after the kill
    assert moves[-3:] == [OpState.IN_FLIGHT, OpState.UNKNOWN, OpState.SUCCEEDED]
    assert checkpoint_problems(sd.checkpoints, "incident-1") == []
    text = outputs_text(nb)
    assert "exited with status 137" in text and "receipt (TICKET-1) was reused" in text


def check_09(sd: StateDir, nb: Any) -> None:
    w = world(sd)
    assert (w.tickets, w.mails, list(w.files)) == (1, 1, [NOTE])
    with SqliteLedger(sd.ledger) as ledger:
        states = sorted((op.tool, op.state, op.attempt) for op in ledger.list())
    assert states == [
        ("create_ticket", OpState.SUCCEEDED, 1),
        ("send_email", OpState.SUCCEEDED, 1),
        ("write_file", OpState.SUCCEEDED, 1),
    ]
    text = outputs_text(nb)
    assert "tickets: 1" in text and "server stopped: True" in text


CHECKS: dict[str, Callable[[StateDir, Any], None]] = dict(
    zip(
        NAMES,
        [check_01, check_02, check_03, check_04, check_05, check_06, check_07, check_08, check_09],
        strict=True,
    )
)


# --- tests ------------------------------------------------------------------------------------


def test_every_notebook_is_listed() -> None:
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == NAMES
    readme = (NOTEBOOK_DIR / "README.md").read_text()
    assert all(f"({name})" in readme for name in NAMES)


def _cells(nb: Any) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


@pytest.mark.parametrize("name", NAMES)
def test_source_and_notebook_agree(name: str) -> None:
    """The .py source (edited by people) and the .ipynb (shown by code hosts) share their cells."""
    source = jupytext.read(NOTEBOOK_DIR / name.replace(".ipynb", ".py"))
    committed = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    assert _cells(source) == _cells(committed), f"{name} is stale: run `make notebooks`"
    assert committed.metadata["jupytext"]["formats"] == "ipynb,py:percent"


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_carries_its_outputs(name: str) -> None:
    """Every code cell ran, in order, with no error; the pictures are there."""
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), (
        f"{name} was not executed top to bottom: run `make notebooks`"
    )
    outputs = [out for cell in code for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) == PICTURES.get(name, 0)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the notebook in a fresh kernel; every cell must pass; then check the state it left."""
    base = tmp_path / "state" / "notebooks"  # missing: the notebook's helper creates it
    monkeypatch.setenv("EFFECTGATE_NOTEBOOK_DIR", str(base))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    work = tmp_path / "run"
    work.mkdir()
    shutil.copy(NOTEBOOK_DIR / name, work / name)
    for helper in ("_pictures.py", "_stable.py"):  # imported by the notebooks
        shutil.copy(NOTEBOOK_DIR / helper, work / helper)
    nb = nbformat.read(work / name, as_version=4)
    for cell in nb.cells:  # run from scratch: the committed outputs must not leak into the checks
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.insert(0, nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    client = NotebookClient(
        nb,
        km=kernel_manager(tmp_path),
        timeout=SLOW_CELLS_S.get(name, CELL_TIMEOUT_S),
        resources={"metadata": {"path": str(work)}},
    )
    client.execute()
    assert nb.cells[0].outputs[0]["text"].strip() == sys.executable
    CHECKS[name](the_state(base, name), nb)
