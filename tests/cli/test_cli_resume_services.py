"""``resume`` of a demo thread uses the demo services already running for its state directory.

One world, one set of servers: ``effectgate worker`` sends a demo thread's
calls to the servers ``services/endpoints.json`` names (``effectgate
services``), and ``resume`` now does the same when they answer, so a fault or
metric set on them is what its calls meet. Before, ``resume`` started a second
instance on the same data files, and a fault set on the running one never
reached its calls. A file naming servers that do not answer is no error:
``resume`` starts its own, which publish their addresses in its place.
"""

from __future__ import annotations

import json

from effectgate import StateDir
from effectgate.demo.services import DemoServices
from effectgate.ledger import OpState
from tests.cli.conftest import eg


def _ops(state_dir: StateDir, thread: str) -> dict[str, OpState]:
    ledger = state_dir.open_ledger()
    try:
        return {op.tool: op.state for op in ledger.list(thread_id=thread)}
    finally:
        ledger.close()


def test_resume_sends_its_calls_to_the_running_services_and_meets_their_fault(
    services: DemoServices, state_dir: StateDir
) -> None:
    root = str(state_dir.root)
    started = eg("demo", "--state-dir", root, "--thread", "d1", "--json")
    assert started.code == 4, started.stderr[-2000:]
    services.set_fault("tickets", "reject")  # stays until changed
    rejected = eg("resume", "--state-dir", root, "--thread", "d1", "--approve", "all", "--json")
    assert services.tickets() == [], rejected.stdout + rejected.stderr
    assert _ops(state_dir, "d1").get("create_ticket") == OpState.FAILED, rejected.stderr
    assert services.stats("tickets")["create_requests"] == 1


def test_resume_starts_its_own_services_when_the_published_ones_do_not_answer(
    state_dir: StateDir,
) -> None:
    root = str(state_dir.root)
    started = eg("demo", "--state-dir", root, "--thread", "d1", "--json")
    assert started.code == 4, started.stderr[-2000:]
    dead = {
        "ticket_url": "http://127.0.0.1:9",
        "smtp_host": "127.0.0.1",
        "smtp_port": 9,
        "mail_url": "http://127.0.0.1:9",
    }
    (state_dir.services / "endpoints.json").write_text(json.dumps(dead), encoding="utf-8")
    done = eg("resume", "--state-dir", root, "--thread", "d1", "--approve", "all", "--json")
    assert done.code == 0, done.stderr[-2000:]
    assert done.json["status"] == "done"
    with DemoServices(state_dir.services) as svc:
        assert [t["idempotency_key"] for t in svc.tickets()] == ["ticket:orders-error-rate"]
        assert len(svc.mails()) == 1
