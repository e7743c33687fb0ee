# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Kill a worker mid-dispatch, resume, and count
#
# A worker process runs the incident thread. We **SIGKILL** it while its ticket request
# is inside the ticket service, after the service committed the ticket but before the
# worker heard back. The ledger still says `IN_FLIGHT`; the ticket exists. Then we
# resume the thread from this notebook and count what the external systems hold.
#
# The kills happen in **subprocesses**, never in this kernel.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("03_kill_and_resume-")  # the directory is created if missing

_stable.mask_ports()  # the services' ports differ per run: print 127.0.0.1:<port>


# %%
def table(rows, headers):
    """Print rows as a plain fixed-width table."""
    rows = [[str(x) for x in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    for row in [list(headers), *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


def show_operations(ops):
    """One line per ledger operation: tool, state, attempt, receipt reference."""
    table(
        [
            (
                op.tool,
                op.state.value,
                op.attempt,
                op.receipt.source if op.receipt else "-",
                op.receipt.reference if op.receipt else "-",
                op.operation_id,
            )
            for op in ops
        ],
        ["tool", "state", "attempt", "receipt", "reference", "operation_id"],
    )


# %%
from effectgate import OpState, RunStatus, SqliteLedger, StateDir, open_agent
from effectgate.demo import DemoServices

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)
ledger = SqliteLedger(state.ledger)
THREAD = "incident-1"

# %% [markdown]
# ## The worker
#
# `python -m effectgate.testing.worker` opens the agent on the state directory (it reads
# the services' addresses from `services/endpoints.json`), starts or resumes one thread,
# and approves every review. We make the ticket service commit each new ticket and then
# hold the connection for five seconds without answering (`timeout-after-commit`), so
# there is a moment when the ticket exists and the worker does not know it yet.

# %%
import signal
import subprocess
import sys
import time

services.set_fault("tickets", "timeout-after-commit", delay_s=5)
WORKER = [
    sys.executable, "-m", "effectgate.testing.worker",
    "--state-dir", str(state.root), "--thread", THREAD,
]
worker = subprocess.Popen(
    WORKER,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
)

started = time.monotonic()
while time.monotonic() - started < 60:
    in_flight = ledger.list(thread_id=THREAD, states=[OpState.IN_FLIGHT])
    if in_flight and services.tickets():
        break
    assert worker.poll() is None, worker.communicate()
    time.sleep(0.05)
else:
    raise TimeoutError("the worker never reached the ticket call")

worker.send_signal(signal.SIGKILL)
worker.wait()
print(f"killed while the ticket call was in flight; exit status {worker.returncode}")
assert worker.returncode == -signal.SIGKILL
kills = {"SIGKILL": len([e for e in ledger.events() if e.dst is not None])}

# %% [markdown]
# ## What the kill left behind
#
# The ledger row is `IN_FLIGHT`, attempt 1, with no receipt: the attempt was durably
# claimed before the request left, and the result never came back. The ticket service,
# asked directly, holds the ticket, filed under the operation id as its
# `Idempotency-Key`.

# %%
show_operations(ledger.list(thread_id=THREAD))
(op,) = ledger.list(thread_id=THREAD)
assert (op.tool, op.state, op.attempt) == ("create_ticket", OpState.IN_FLIGHT, 1)
assert op.receipt is None
table(
    [(t["ticket_id"], t["title"], t["idempotency_key"]) for t in services.tickets()],
    ["ticket_id", "title", "idempotency_key"],
)

# %% [markdown]
# ## Resume from the notebook
#
# `agent.resume` takes the thread's lease (its holder is dead, so it takes it over at
# once), turns the `IN_FLIGHT` row into `UNKNOWN` (never "not done"), and asks the ticket
# service by key whether the ticket exists. It does: the operation becomes `SUCCEEDED`
# with a receipt whose source is `reconcile`, still attempt 1. Nothing was sent again.
# The run then stops at the review of the mail and the note.

# %%
from contextlib import ExitStack

services.set_fault("tickets", "normal")
stack = ExitStack()
agent = stack.enter_context(open_agent(state, endpoints=services.endpoints))
result = agent.resume(THREAD)
assert result.status is RunStatus.WAITING_REVIEW
show_operations(result.operations)
(ticket_op,) = agent.ledger.list(thread_id=THREAD, tool="create_ticket")
assert (ticket_op.state, ticket_op.attempt) == (OpState.SUCCEEDED, 1)
assert ticket_op.receipt.source == "reconcile"

# %%
import json

table(
    [
        (
            e.src.value if e.src else "",
            e.dst.value if e.dst else "",
            e.attempt,
            # the worker id (host:pid:nonce:boot-id/pid-namespace) differs on every run
            json.dumps({k: "<worker id>" if k == "worker" else v for k, v in e.detail.items()})[:90],
        )
        for e in agent.ledger.events(operation_id=ticket_op.operation_id)
    ],
    ["from", "to", "attempt", "detail"],
)

# %% [markdown]
# ## A second kill, at a named seam
#
# Failpoints are named places where a process exits at once (`os._exit(137)`, like
# `kill -9`). `EFFECTGATE_FAILPOINT=AFTER_EXTERNAL_COMMIT@send_email` kills the worker
# right after the mail sink accepted the mail and before the ledger records it. The
# worker approves the pending mail and note, sends the mail, and dies.

# %%
env = {**os.environ, "EFFECTGATE_FAILPOINT": "AFTER_EXTERNAL_COMMIT@send_email"}
killed = subprocess.run(
    WORKER, capture_output=True, text=True, env=env, timeout=120, check=False
)
print("exit status", killed.returncode)
print(killed.stderr.strip().splitlines()[-1])
assert killed.returncode == 137
kills["failpoint exit"] = len([e for e in ledger.events() if e.dst is not None])
show_operations(ledger.list(thread_id=THREAD))
print("mails in the sink:", len(services.mails()))

# %%
result = agent.resume(THREAD)
assert result.status is RunStatus.DONE, result
show_operations(result.operations)
print(result.final_message)

# %% [markdown]
# ## Count
#
# Two kills, two resumes: the ticket service and the mail sink each hold exactly one
# record, and the ticket service received exactly one create request.

# %%
from effectgate.testing.oracle import checkpoint_problems, world

w = world(state)
print(w.as_dict())
print("ticket create requests:", services.stats("tickets")["create_requests"])
assert (w.tickets, w.mails) == (1, 1)
assert (w.duplicate_tickets, w.duplicate_mails) == (0, 0)
assert services.stats("tickets")["create_requests"] == 1
assert checkpoint_problems(state.checkpoints, THREAD) == []

# %% [markdown]
# ## The timeline
#
# Each row is one operation, each bar a state it was in, read from the ledger's event
# log; the x axis counts ledger events in commit order (not seconds), so the moment in
# `UNKNOWN` is as visible as the minutes in review. The dotted lines are the two kills:
# the ticket stood `IN_FLIGHT` across the first, the mail across the second, and each
# went `UNKNOWN → SUCCEEDED` by lookup on resume, still attempt 1.

# %%
from IPython.display import Image, display

import _pictures

display(Image(data=_pictures.draw_timeline(ledger, marks=kills)))

# %%
stack.close()
ledger.close()
services.stop()
