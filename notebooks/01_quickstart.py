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
# # 01 · Quickstart: review, approve, receipts, ledger
#
# effectgate is a LangGraph agent whose side effects are safe to replay. Every
# side-effecting tool call stops at a **human review** (a LangGraph `interrupt()`),
# and every approved call goes through a durable **operation ledger** before it
# touches the outside world, so a resume, a replay or a restart after a crash never
# repeats a write.
#
# This notebook runs the packaged *incident* demo end to end, offline:
#
# 1. start two small external systems on 127.0.0.1 (a ticket service and a mail sink),
# 2. build the agent with the scripted (offline) model,
# 3. run until the review interrupt and read the review request,
# 4. approve, and look at the receipts, the ledger and the external systems' own storage.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("01_quickstart-")  # the directory is created if missing

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


# %% [markdown]
# ## The outside world
#
# `DemoServices` starts a ticket service and a mail sink as separate processes. They keep
# their own SQLite files, so "did it happen?" is answered by *their* storage, never by
# effectgate. We set the order service's error rate to 12 %, above the demo's 5 % alert
# threshold, so the agent has an incident to handle.
#
# A `StateDir` holds everything else: the LangGraph checkpoints, the ledger, the file
# tools' workspace and the services' data.

# %%
from effectgate import StateDir
from effectgate.demo import DemoServices

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)
print("ticket service:", services.endpoints.ticket_url.rsplit(":", 1)[0], "(port chosen by the OS)")

# %% [markdown]
# ## The agent
#
# `open_agent` wires a chat model, the built-in tools (files, shell, tickets, mail), a
# SQLite checkpointer and a SQLite ledger to the state directory. `"scripted:incident"`
# is an offline model that plays a fixed script: read the error rate, open a ticket,
# then mail the on-call engineer and write an incident note *in parallel*.
#
# `open_agent` is a context manager; an `ExitStack` keeps it open across cells.

# %%
from contextlib import ExitStack

from effectgate import RunStatus, open_agent

stack = ExitStack()
agent = stack.enter_context(
    open_agent(state, model="scripted:incident", endpoints=services.endpoints)
)

# %% [markdown]
# ### The graph
#
# Drawn from `agent.graph.get_graph()`, LangGraph's own description of the compiled
# graph (with matplotlib, no network call). `agent` calls the model; reads go to
# `tools`; every side-effecting call goes through `review`, the node holding the
# `interrupt()`, and then runs in its own node `effect.<tool>`, which asks the ledger
# before it acts. Dashed edges are conditional; grey ones lead back to the model.

# %%
from IPython.display import Image, display

import _pictures

display(Image(data=_pictures.draw_graph(agent.graph.get_graph())))

# %% [markdown]
# ### The operation states
#
# Every approved call becomes an **operation** in the ledger. Its states and every move
# between them, drawn from the one table the ledger enforces
# (`effectgate.ledger.TRANSITIONS`; [docs/architecture.md](../docs/architecture.md#operation-states)
# explains each move). `FAILED` means *known* not applied; `UNKNOWN` and
# `NEEDS_RECONCILIATION` mean nobody knows yet, and say so.

# %%
from effectgate.ledger import TRANSITIONS

display(Image(data=_pictures.draw_state_machine(TRANSITIONS)))

# %% [markdown]
# ### Run until the first review

# %%
TASK = "Check the order service and handle any incident."
THREAD = "incident-1"
result = agent.start(TASK, thread_id=THREAD)
result.status

# %% [markdown]
# ## The review request
#
# Reading the error rate is a read-only call, so it ran without asking. Opening a
# ticket is a write: the run stopped at the review interrupt. The request carries
# everything a reviewer needs: the arguments, a preview of exactly what will happen,
# the tool's **effect kind** (how it can be recovered if its outcome is ever unknown),
# the **operation id** (the idempotency key) and the **intent hash** (SHA-256 of the
# tool and its normalized arguments: an approval authorises exactly this hash).

# %%
assert result.status is RunStatus.WAITING_REVIEW
(pending,) = result.interrupts
request = pending.value
(action,) = request["action_requests"]
print("tool:         ", action["name"])
print("effect kind:  ", action["effect_kind"])
print("operation id: ", action["operation_id"])
print("intent hash:  ", action["intent_hash"])
print("approval TTL: ", action["approval_ttl_s"], "s")
print("decisions:    ", request["review_configs"][0]["allowed_decisions"])
print()
print(action["preview"])

# %% [markdown]
# Nothing has been written yet: the ticket service's own storage is empty, and the
# ledger knows nothing about the ticket.

# %%
assert services.tickets() == []
assert agent.ledger.list(thread_id=THREAD) == []
print("tickets:", len(services.tickets()), " ledger operations:", 0)

# %% [markdown]
# ## Approve
#
# A resume answers the interrupt with one decision per pending call, in order. The
# shape follows LangChain's `HumanInTheLoopMiddleware` (`approve`, `edit`, `reject` or
# `respond`), plus the reviewer's name. The answer is keyed by the id of the review it
# answers (`answers={pending.id: ...}`): an answer that names no review is refused, so
# an old "approve" can never approve whatever happens to wait now.
# The ticket is created; the model then proposes two calls in one message (mail and
# note), so the run stops at a second review.

# %%
result = agent.resume(
    THREAD, answers={pending.id: {"decisions": [{"type": "approve"}], "reviewer": "ana"}}
)
assert result.status is RunStatus.WAITING_REVIEW
(pending,) = result.interrupts
for action in pending.value["action_requests"]:
    print(f"--- {action['name']} ({action['effect_kind']}) {action['operation_id']}")
    print(action["preview"])

# %%
result = agent.resume(
    THREAD,
    answers={
        pending.id: {"decisions": [{"type": "approve"}, {"type": "approve"}], "reviewer": "ana"}
    },
)
assert result.status is RunStatus.DONE
print(result.final_message)

# %% [markdown]
# ## Receipts
#
# Each executed operation ended `SUCCEEDED` with a **receipt**: the result, a reference
# in the external system (ticket number, Message-ID, content hash) and the attempt that
# produced it. The model saw the same receipts as `ToolMessage`s.

# %%
show_operations(result.operations)

# %%
import json

from langchain_core.messages import ToolMessage

for message in agent.messages(THREAD):
    if isinstance(message, ToolMessage):
        body = json.loads(message.content)
        print(f"{message.name:15} {body['status']:10} reference={body.get('reference')}")

# %% [markdown]
# ## The ledger
#
# The ledger is the durable record of every external action. Its append-only event log
# shows each transition with its time and attempt: `PROPOSED → APPROVED` (the review),
# `APPROVED → IN_FLIGHT` (committed *before* the call leaves the process) and
# `IN_FLIGHT → SUCCEEDED` (committed before the graph moves on).

# %%
# Grouped by operation (the mail and the note ran in parallel, so their events
# interleave differently from run to run), in commit order within each.
events = sorted(agent.ledger.events(thread_id=THREAD), key=lambda e: (e.operation_id, e.seq))
table(
    [
        (
            e.operation_id[:28],
            e.kind.value,
            e.src.value if e.src else "",
            e.dst.value if e.dst else "",
            e.attempt,
        )
        for e in events
    ],
    ["operation", "kind", "from", "to", "attempt"],
)

# %%
metrics = agent.ledger.metrics()
print("operations by state:", {k: v for k, v in metrics.by_state.items() if v})
print("first-attempt success rate:", metrics.first_attempt_success_rate)
print("open unknowns:", metrics.open_unknowns)

# %% [markdown]
# ## The outside world, from its own storage
#
# `effectgate.testing.oracle.world` reads the ticket service's and mail sink's SQLite
# files and the workspace bytes directly: one ticket, one mail, one note.

# %%
from effectgate.testing.oracle import world

w = world(state)
print(w.as_dict())
assert (w.tickets, w.mails) == (1, 1)
assert list(w.files) == ["incidents/orders-error-rate.md"]
print(w.files["incidents/orders-error-rate.md"].decode())

# %% [markdown]
# ## Resuming a finished thread does nothing
#
# A resume of a thread that is done runs nothing; the ticket service saw exactly one
# create request.

# %%
again = agent.resume(THREAD)
assert again.status is RunStatus.DONE
assert services.stats("tickets")["create_requests"] == 1
services.stats("tickets")

# %%
stack.close()
services.stop()
