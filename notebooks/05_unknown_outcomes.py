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
# # 05 · Unknown outcomes: reconcile, park, decide
#
# A timeout after a request was sent does not mean it failed: the other side may have
# committed it. effectgate records such an attempt as `UNKNOWN`, and the **tool's
# contract** decides what happens next:
#
# | effect kind | after `UNKNOWN` |
# |---|---|
# | `idempotent` / `keyed` | a new attempt with the same arguments / the same key |
# | `reconcilable` | look it up: found → `SUCCEEDED`; cannot ask → `NEEDS_RECONCILIATION` |
# | `unsafe` | `NEEDS_RECONCILIATION`: a human decides, with the evidence |
#
# This notebook shows three cases: a ticket that timed out after commit (reconciled by
# lookup), a mail that timed out while lookups were down (parked, then a human verdict),
# and a shell command that timed out (unsafe: parked, then a human verdict). It ends
# with the ledger metrics and a timeline of every operation's states.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("05_unknown_outcomes-")  # the directory is created if missing

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
# ## Tools with short timeouts
#
# We build the tool list ourselves, with short timeouts (one second for the ticket and
# mail clients, two for shell commands), so that this notebook does not wait long.

# %%
from contextlib import ExitStack

from effectgate import OpState, RunStatus, StateDir, open_agent
from effectgate.demo import DemoServices
from effectgate.tools import file_tools, mail_tools, shell_tool, ticket_tools

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)
ep = services.endpoints
tools = [
    *file_tools(state.workspace),
    shell_tool(state.workspace, timeout_s=2.0),
    *ticket_tools(ep.ticket_url, timeout_s=1.0),
    *mail_tools(ep.smtp_host, ep.smtp_port, ep.mail_url, timeout_s=1.0),
]
table([(t.name, t.kind.value) for t in tools], ["tool", "effect kind"])
stack = ExitStack()
agent = stack.enter_context(open_agent(state, tools=tools))


def approve_all(result):
    """Approve every call of every pending review, each answer keyed by its review's id."""
    return {
        pending.id: {
            "decisions": [{"type": "approve"}] * len(pending.value["action_requests"]),
            "reviewer": "ana",
        }
        for pending in result.interrupts
    }


# %% [markdown]
# ## 1. Timeout after commit, lookups working → reconciled
#
# The ticket service commits the ticket, then holds the connection for two seconds
# without answering; our client gives up after one. The attempt is `UNKNOWN`. The
# ticket tool can look a ticket up by its idempotency key: found, so the operation is
# `SUCCEEDED` with a receipt from the lookup (`source = reconcile`), attempt 1.

# %%
services.set_fault("tickets", "timeout-after-commit", delay_s=2)
THREAD = "incident-1"
result = agent.start("Check the order service and handle any incident.", thread_id=THREAD)
result = agent.resume(THREAD, answers=approve_all(result))
(ticket_op,) = agent.ledger.list(thread_id=THREAD, tool="create_ticket")
show_operations([ticket_op])
assert (ticket_op.state, ticket_op.attempt) == (OpState.SUCCEEDED, 1)
assert ticket_op.receipt.source == "reconcile"
for e in agent.ledger.events(operation_id=ticket_op.operation_id):
    detail = {k: "<worker id>" if k == "worker" else v for k, v in e.detail.items()}
    print(f"{e.src.value if e.src else '':9} -> {e.dst.value:10} {detail}")

# %% [markdown]
# ## 2. Timeout after commit, lookups down → parked → human verdict
#
# Now the mail sink accepts the mail, holds the connection, and refuses lookups
# (`ambiguous-unqueryable`). The mail's outcome is unknown and nobody can ask, so the
# operation is parked as `NEEDS_RECONCILIATION`, and the run stops at a
# **reconciliation interrupt** carrying the evidence. The note, written in parallel,
# succeeded on its own.

# %%
import json

services.set_fault("mail", "ambiguous-unqueryable", delay_s=2)
result = agent.resume(THREAD, answers=approve_all(result))
assert result.status is RunStatus.WAITING_RECONCILIATION
show_operations(result.operations)
(pending,) = result.interrupts
print(json.dumps(pending.value["evidence"], indent=2, ensure_ascii=False))

# %% [markdown]
# While it waits, the ledger metrics show the open unknown and its age.

# %%
metrics = agent.ledger.metrics()
print("open unknowns:", metrics.open_unknowns)
print("oldest reconciliation age measured:", metrics.oldest_reconciliation_age_s is not None)
assert metrics.open_unknowns == 1

# %% [markdown]
# A verdict is `succeeded` (with the reference you checked), `failed`, or `retry`. A
# retry may duplicate the mail, so it is refused unless the human acknowledges that
# risk explicitly:

# %%
from effectgate.errors import DecisionError

mail_id = pending.value["operation_id"]
try:
    agent.resume(THREAD, verdicts={mail_id: {"verdict": "retry"}})
except DecisionError as exc:
    print("refused:", exc)

# %% [markdown]
# The human looks in the mail sink (here: its own storage) for the Message-ID the tool
# used, finds the mail, and says so. The verdict becomes the receipt (`source = human`)
# and the thread finishes without sending anything again.

# %%
(delivered,) = services.mails()
print("found in the mail sink:", delivered["message_id"], delivered["subject"])
result = agent.resume(
    THREAD,
    verdicts={
        mail_id: {
            "verdict": "succeeded",
            "reference": delivered["message_id"],
            "evidence": "found in the mail sink's mailbox",
            "reviewer": "ana",
        }
    },
)
assert result.status is RunStatus.DONE
show_operations(result.operations)
assert len(services.mails()) == 1

# %% [markdown]
# ## 3. An unsafe tool → parked → human verdict
#
# `run_shell` is **unsafe**: it has no idempotency key and nothing can be asked
# afterwards, so any unknown outcome goes to a human. This command appends a line to a
# log and then hangs; the tool kills it after its two-second timeout.

# %%
from effectgate import ScriptedChatModel

DEPLOY = {
    "name": "deploy",
    "turns": [
        {
            "say": "Recording the deployment.",
            "tool_calls": [
                {
                    "name": "run_shell",
                    "args": {
                        "command": "echo 'orders v2 deployed' >> deploy.log; sleep 10"
                    },
                }
            ],
        },
        {"say": "Deployment recorded."},
    ],
}
shell_agent = stack.enter_context(
    open_agent(state, tools=tools, model=ScriptedChatModel.from_script(DEPLOY))
)
result = shell_agent.start("Record the orders v2 deployment.", thread_id="deploy-1")
preview = result.interrupts[0].value["action_requests"][0]["preview"]
print(preview.replace(str(state.workspace), "<workspace>"))
result = shell_agent.resume("deploy-1", answers=approve_all(result))
assert result.status is RunStatus.WAITING_RECONCILIATION
evidence = result.interrupts[0].value["evidence"]
print("why:       ", evidence["why"])
print("last error:", evidence["last_error"])

# %% [markdown]
# Re-running the command would append a second line. The human checks the log instead:
# the line is there, so the command did take effect.

# %%
log = (state.workspace / "deploy.log").read_text()
print(repr(log))
assert log == "orders v2 deployed\n"
shell_id = result.interrupts[0].value["operation_id"]
result = shell_agent.resume(
    "deploy-1",
    verdicts={
        shell_id: {
            "verdict": "succeeded",
            "reference": "deploy.log line 1",
            "evidence": "the line is in the log, once",
            "reviewer": "ana",
        }
    },
)
assert result.status is RunStatus.DONE
show_operations(result.operations)

# %% [markdown]
# ## Ledger metrics
#
# Computed from the ledger alone: operations by state, how often the first attempt
# succeeded, how many stored receipts were handed back instead of calling a tool, and
# how many unknowns are still open.

# %%
metrics = agent.ledger.metrics()
print("operations by state:", {k: v for k, v in metrics.by_state.items() if v})
print("first-attempt success rate:", metrics.first_attempt_success_rate)
print("mean attempts:", metrics.mean_attempts)
print("receipts reused:", metrics.results_reused)
print("open unknowns:", metrics.open_unknowns)
assert metrics.open_unknowns == 0
sources = sorted(op.receipt.source for op in agent.ledger.list())
print("receipt sources:", sources)

# %% [markdown]
# ## A timeline of every operation
#
# Each row is one operation; each bar is a state it was in, from the ledger's event log
# (`ledger.events()`). The x axis counts ledger events in commit order rather than
# seconds, so every state is visible however short it was: the ticket went
# `IN_FLIGHT → UNKNOWN → SUCCEEDED` within a second, while the mail and the shell
# command sat in `NEEDS_RECONCILIATION` until the human verdicts. Drawn with matplotlib
# by `notebooks/_pictures.py`.

# %%
from IPython.display import Image, display

import _pictures

png = _pictures.draw_timeline(agent.ledger)
(workdir / "timeline.png").write_bytes(png)
display(Image(data=png))

# %%
stack.close()
services.stop()
