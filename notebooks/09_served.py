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
# # 09 · Served by `langgraph dev`, approved from the SDK
#
# The effectgate agent served by LangGraph's own development server (the in-memory
# runtime of `langgraph-cli[inmem]`, the `server` extra), and driven only through
# LangGraph's client, `langgraph_sdk`, the way Studio, Agent Chat UI or Agent Inbox
# drive it: create a thread, run it, read the review interrupt (the shape of LangChain's
# `HumanInTheLoopMiddleware`), and resume with `Command(resume={interrupt_id: answer})`.
#
# The server runs as a child process on 127.0.0.1 and a free port, against a temporary
# state directory (the ledger and the workspace), and is stopped at the end.
# `effectgate.testing.langgraph_dev.LangGraphDev` starts and stops it; the tests in
# `tests/server` use the same helper.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("09_served-")  # the directory is created if missing

_stable.mask_ports()  # the services' ports differ per run: print 127.0.0.1:<port>

# %% [markdown]
# ## Start the services and the server
#
# The demo ticket service and mail sink run on loopback, with the orders error rate at
# 12 %. `LangGraphDev` writes a `langgraph.json` naming the graph factory
# `effectgate.server:make_graph` (assistant id `effectgate`), sets
# `EFFECTGATE_STATE_DIR` and `EFFECTGATE_SERVICES` for it, starts
# `langgraph dev --no-browser --host 127.0.0.1 --port <free>` and waits for `GET /ok`.
# It is what you would run by hand:
#
# ```sh
# EFFECTGATE_STATE_DIR=.effectgate-server EFFECTGATE_SERVICES=demo \
#   langgraph dev --no-browser --host 127.0.0.1 --port 2024
# ```

# %%
from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.testing.langgraph_dev import LangGraphDev

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)

server = LangGraphDev(workdir / "server", state.root, services.endpoints)
server.start()
print("serving on 127.0.0.1:", server.url.startswith("http://127.0.0.1:"))

# %% [markdown]
# ## Create a thread and run it
#
# Only `langgraph_sdk` from here on. The run stops at the first side effect: the review
# of `create_ticket`.

# %%
import json
import re

from langgraph_sdk import get_sync_client

client = get_sync_client(url=server.url)
thread_id = client.threads.create()["thread_id"]
client.runs.wait(
    thread_id,
    "effectgate",
    input={"messages": [{"role": "user", "content": "Check the orders error rate."}]},
)
(review,) = client.threads.get_state(thread_id)["interrupts"]
for action in review["value"]["action_requests"]:
    print(action["name"], "-", action["effect_kind"], "-", action["operation_id"])
    print(json.dumps(action["args"], indent=2))
print("allowed:", review["value"]["review_configs"][0]["allowed_decisions"])

# %% [markdown]
# ## Approve from the SDK
#
# The answer is keyed by the interrupt's id, as LangGraph's `Command(resume=...)` takes
# it when several interrupts may be pending. The next stop is one review for the two
# calls of the next AI message (the mail and the incident note); both are approved.

# %%
def approve(interrupt):
    n = len(interrupt["value"]["action_requests"])
    answer = {"decisions": [{"type": "approve"}] * n, "reviewer": "ana"}
    client.runs.wait(thread_id, "effectgate", command={"resume": {interrupt["id"]: answer}})


approve(review)
(review,) = client.threads.get_state(thread_id)["interrupts"]
print([action["name"] for action in review["value"]["action_requests"]])
approve(review)
final = client.threads.get_state(thread_id)
print("interrupts left:", final["interrupts"])
summary = final["values"]["messages"][-1]["content"]
print(re.sub(r"<[0-9a-f]+@effectgate\.local>", "<message-id>", summary))  # differs per thread

# %% [markdown]
# ## Count, in the external systems' own storage

# %%
print("tickets:", len(services.tickets()))
print("mails:", len(services.mails()))
files = [p.relative_to(state.workspace).as_posix() for p in state.workspace.rglob("*") if p.is_file()]
print("files:", sorted(files))

# %% [markdown]
# ## Stop the server
#
# `stop()` sends SIGTERM to the server's process group (SIGKILL if it lingers).

# %%
server.stop()
services.stop()
print("server stopped:", server.proc.poll() is not None)
