"""A dispatch in a run that holds no thread lease heartbeats its attempt itself.

The served graph (``langgraph dev``) and your own graph invoked directly run
without ``Agent``, so no thread lease is held while a call runs. Before, an
attempt of such a run had no heartbeat at all: a second process (another
server on the same store) found it IN_FLIGHT with no lease, took it for
abandoned and called the service again while the first call was still
under way (break test of issue #32). Now the dispatcher of such a graph
holds the thread's lease around each dispatch and renews it (a
``LeaseKeeper`` the graph builders give it), so the attempt stays live for
as long as its process runs the call.

The first dispatcher runs in a child process against a slowed demo ticket
service; the test process is the second one. The assertions read the ticket
service's own counters and the ledger's rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectgate.demo.services import DemoServices
from effectgate.dispatch import Dispatcher, DispatchStatus
from effectgate.errors import OperationBusyError
from effectgate.graph import new_worker_id
from effectgate.ledger import OpState, SqliteLedger
from effectgate.tools import ticket_tools
from tests.conformance._experiments import REPO, effect_call, py_env

pytestmark = [pytest.mark.crash]

ARGS = {"title": "orders: error rate above 5%", "body": "0.12 over 5 min", "severity": "high"}
SLOW_S = 3.0
"""The ticket service's delay: below the tool's 5 s read timeout, several lease periods long."""
LEASE_TTL_S = 1.0
"""The child dispatcher's lease: the call outlives three of its terms."""

CHILD = """
import json, sys
from effectgate.dispatch import Dispatcher
from effectgate.graph import new_worker_id
from effectgate.ledger import LeaseKeeper, SqliteLedger
from effectgate.tools import ticket_tools
from tests.conformance._experiments import approve, effect_call
ledger_path, url, args, ttl = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
spec = next(s for s in ticket_tools(url) if s.name == "create_ticket")
call = effect_call(spec, args)
with SqliteLedger(ledger_path) as ledger:
    approve(ledger, spec, call)
    leases = LeaseKeeper(ledger, ttl, print, name="child-leases")
    dispatcher = Dispatcher(ledger, {spec.name: spec}, worker=new_worker_id(), leases=leases)
    outcome = dispatcher.dispatch(call)
print(json.dumps({"status": outcome.status.value, "attempt": outcome.operation.attempt}))
"""


def test_a_live_attempt_without_a_run_lease_is_not_taken_over(tmp_path: Path) -> None:
    ledger_path = tmp_path / "ledger.sqlite3"
    with DemoServices(tmp_path / "services") as services:
        url = services.endpoints.ticket_url
        spec = next(s for s in ticket_tools(url) if s.name == "create_ticket")
        call = effect_call(spec, ARGS)
        services.set_fault("tickets", "slow", delay_s=SLOW_S)
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(ledger_path),
                url,
                json.dumps(ARGS),
                str(LEASE_TTL_S),
            ],
            cwd=REPO,
            env=py_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while services.stats("tickets")["create_requests"] == 0:
            assert child.poll() is None, child.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the child's call never reached the service"
            time.sleep(0.05)
        time.sleep(2 * LEASE_TTL_S)  # past the child's first lease term: only renewals hold it
        with SqliteLedger(ledger_path) as ledger:
            second = Dispatcher(ledger, {spec.name: spec}, worker=new_worker_id())
            with pytest.raises(OperationBusyError):
                second.dispatch(call)
            op = ledger.get(call.operation_id)
            assert op is not None and (op.state, op.attempt) == (OpState.IN_FLIGHT, 1)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-2000:]
        assert json.loads(out.splitlines()[-1]) == {"status": "succeeded", "attempt": 1}
        with SqliteLedger(ledger_path) as ledger:
            # the child's lease is released with its dispatch; a later one reuses the receipt
            again = Dispatcher(ledger, {spec.name: spec}, worker=new_worker_id()).dispatch(call)
            assert again.status is DispatchStatus.SUCCEEDED
            with ledger.store.read() as r:
                assert (
                    r.get_lease(call.thread_id) is None
                    or r.get_lease(call.thread_id).expires_at <= ledger.clock.now()
                )
        # the ticket service's own counters: one create request, one ticket
        assert services.stats("tickets") == {"create_requests": 1, "tickets": 1}


def test_the_graph_builders_give_their_dispatcher_a_lease_keeper(tmp_path: Path) -> None:
    """The served graph, your own graph and the middleware: each dispatch heartbeats."""
    from langgraph.graph import MessagesState, StateGraph

    from effectgate.graph import add_effect_nodes
    from effectgate.middleware import EffectGateMiddleware

    with SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        tools = ticket_tools("http://127.0.0.1:9")
        gate = add_effect_nodes(StateGraph(MessagesState), tools, ledger=ledger, after=None)
        assert gate.dispatcher.leases is not None
        middleware = EffectGateMiddleware(tools, ledger=ledger)
        assert middleware.dispatcher.leases is not None
        bare = Dispatcher(ledger, {}, worker=new_worker_id())
        assert bare.leases is None  # a bare dispatcher's caller holds the lease (Agent)
