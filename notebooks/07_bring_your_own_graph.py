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
# # 07 · Add effectgate to the agent you already have
#
# You have a LangChain `create_agent` agent with `HumanInTheLoopMiddleware`: a person
# approves each ticket before it is opened. We kill its worker process right after the
# ticket service committed a ticket, before the agent saved the tool's result, and
# resume in a new process. It opens **a second ticket**.
#
# Then the same agent with one line changed, `EffectGateMiddleware` in place of
# `HumanInTheLoopMiddleware`, killed at the same moment:
#
# 1. with the same plain `@tool`: the resume does not call it again; it asks a person
#    whether the ticket exists (the tool declares no way to look it up);
# 2. with effectgate's declared ticket tool (an idempotency key and a lookup): the
#    resume finds the ticket by its key and finishes on its own.
#
# Every count below is read from the ticket service's own SQLite file. The kills happen
# in **subprocesses**, never in this kernel.

# %%
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from effectgate import SqliteLedger, StateDir
from effectgate.demo import DemoServices
from effectgate.demo.services import read_tickets

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("07_bring_your_own_graph-")  # the directory is created if missing


def open_world(name):
    """A state directory with its own ticket service and mail sink (error rate above 5%)."""
    state = StateDir.open(workdir / name)
    services = DemoServices(state.services)
    services.start()
    services.set_error_rate("orders", 0.12)
    return state, services


def tickets(state):
    """The ticket service's own rows: (ticket id, title)."""
    return [(t["ticket_id"], t["title"]) for t in read_tickets(state.services)]


# %% [markdown]
# ## The agent
#
# One file, `incident_agent.py`: an offline scripted model that opens one ticket, a
# plain `@tool` that POSTs it, and `create_agent` with a checkpointer. `--gate` picks the
# middleware; everything else is the same. `KILL_AFTER_TICKET=1` exits the process
# right after the ticket service answered, as a `kill -9` would. With effectgate the
# same moment is its failpoint `AFTER_EXTERNAL_COMMIT@create_ticket`.

# %%
AGENT = r'''
import json, os, sqlite3, sys, uuid

import httpx
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from effectgate import EffectGateMiddleware, ScriptedChatModel, SqliteLedger, StateDir
from effectgate.tools import ticket_tools

state = StateDir.open(sys.argv[1])
gate = sys.argv[2]            # "hitl" | "effectgate" | "effectgate-declared"
verdict = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
url = json.loads((state.services / "endpoints.json").read_text())["ticket_url"]

model = ScriptedChatModel.from_script({
    "name": "one-ticket",
    "turns": [{"say": "Opening a ticket.", "tool_calls": [{"name": "create_ticket", "args": {
        "title": "orders: error rate above 5%", "body": "Error rate 0.12.",
        "alert_id": "orders-error-rate"}}]}],
    "final": "Ticket opened.",
})


@tool
def create_ticket(title: str, body: str, severity: str = "high", alert_id: str = "") -> str:
    """Open an incident ticket."""
    response = httpx.post(f"{url}/tickets", json={"title": title, "body": body,
                          "severity": severity, "alert_id": alert_id or None},
                          headers={"Idempotency-Key": uuid.uuid4().hex})
    response.raise_for_status()
    if os.environ.get("KILL_AFTER_TICKET"):
        os._exit(137)         # the ticket exists; the agent never hears back
    return response.text


ledger = SqliteLedger(state.ledger)
if gate == "hitl":
    tools, middleware = [create_ticket], [HumanInTheLoopMiddleware({"create_ticket": True})]
elif gate == "effectgate":
    tools, middleware = [], [EffectGateMiddleware([create_ticket], ledger=ledger)]
else:
    declared = [t for t in ticket_tools(url) if t.name == "create_ticket"]
    tools, middleware = [], [EffectGateMiddleware(declared, ledger=ledger)]

conn = sqlite3.connect(state.checkpoints, check_same_thread=False)
agent = create_agent(model, tools, middleware=middleware, checkpointer=SqliteSaver(conn))
config = {"configurable": {"thread_id": "incident-1"}}

while True:
    snap = agent.get_state(config)
    if snap.metadata is None:
        step = {"messages": [("user", "Handle the orders incident.")]}
    elif snap.interrupts:
        answers = {}
        for item in snap.interrupts:
            if item.value.get("type") == "reconciliation":
                if verdict is None:   # a person must say what happened
                    print(json.dumps({"waiting_for": item.value}, default=str))
                    sys.exit(3)
                answers[item.id] = verdict
            else:
                answers[item.id] = {"decisions": [{"type": "approve"}
                                                  for _ in item.value["action_requests"]]}
        step, verdict = Command(resume=answers), None
    elif snap.next:
        step = None
    else:
        print(json.dumps({"done": snap.values["messages"][-1].content}))
        break
    agent.invoke(step, config, durability="sync")
'''
agent_file = workdir / "incident_agent.py"
agent_file.write_text(AGENT)


def run(state, gate, *, kill=None, verdict=None):
    """Run the agent in a new process; print its last line and return its exit code."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTGATE_FAILPOINT"}
    if kill == "plain":
        env["KILL_AFTER_TICKET"] = "1"
    elif kill == "effectgate":
        env["EFFECTGATE_FAILPOINT"] = "AFTER_EXTERNAL_COMMIT@create_ticket"
    argv = [sys.executable, str(agent_file), str(state.root), gate]
    if verdict is not None:
        argv.append(json.dumps(verdict))
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    waiting = json.loads(last).get("waiting_for") if last.startswith("{") else None
    if waiting:  # the reconciliation request a person would be shown
        why = waiting["evidence"]["why"]
        last = f"waits for a verdict on {waiting['tool']}, attempt {waiting['attempt']}: {why}"
    print(f"exit {proc.returncode}: {last[:300]}")
    return proc.returncode


# %% [markdown]
# ## 1 · `HumanInTheLoopMiddleware`: killed after the commit, resumed

# %%
state, services = open_world("hitl")
assert run(state, "hitl", kill="plain") == 137
print("after the kill:", tickets(state))
assert run(state, "hitl") == 0
print("after the resume:", tickets(state))
assert len(tickets(state)) == 2  # the resume ran the tool again: a duplicate ticket
services.stop()

# %% [markdown]
# The checkpoint never recorded the tool's result, so the resume re-ran the tool node,
# and the tool had no way to know it had already run.
#
# ## 2 · `EffectGateMiddleware`, the same plain `@tool`
#
# The only change is the middleware. effectgate records the attempt in its ledger
# (`IN_FLIGHT`) before calling the tool. After the kill, the resume finds that attempt
# whose worker is gone. The tool declares nothing (a plain `@tool` is `unsafe`), so
# effectgate does not call it again. It asks a person instead.

# %%
state, services = open_world("effectgate-plain")
assert run(state, "effectgate", kill="effectgate") == 137
print("after the kill:", tickets(state))
assert run(state, "effectgate") == 3  # waiting for a reconciliation verdict
print("after the resume:", tickets(state))
assert len(tickets(state)) == 1

# %% [markdown]
# The reviewer looks in the ticket system, finds the ticket, and says so, citing it:

# %%
(ticket_id, _), = tickets(state)
verdict = {"verdict": "succeeded", "attempt": 1, "reference": f"TICKET-{ticket_id}",
           "evidence": "found in the ticket service"}
assert run(state, "effectgate", verdict=verdict) == 0
print("after the verdict:", tickets(state))
assert len(tickets(state)) == 1
services.stop()

# %% [markdown]
# ## 3 · `EffectGateMiddleware` with effectgate's declared ticket tool
#
# `effectgate.tools.ticket_tools` declares `create_ticket` as keyed: the operation id is
# sent as the `Idempotency-Key`, and a lookup finds a ticket by that key. After the same
# kill, the resume asks the ticket service and reads the ticket back: nobody is asked,
# nothing is sent twice.

# %%
state, services = open_world("effectgate-declared")
assert run(state, "effectgate-declared", kill="effectgate") == 137
assert run(state, "effectgate-declared") == 0
print("after the resume:", tickets(state))
assert len(tickets(state)) == 1

with SqliteLedger(state.ledger) as ledger:
    for op in ledger.list():
        print(op.tool, op.state.value, "attempt", op.attempt, op.receipt.source, op.operation_id)
services.stop()

# %% [markdown]
# ## What changed, and what it costs
#
# One line of the agent. The tools still run in `create_agent`'s tool node; the
# middleware's `wrap_tool_call` dispatches each reviewed call through the ledger instead
# of calling the tool directly. [docs/bring-your-own-graph.md](../docs/bring-your-own-graph.md)
# lists where this differs from effectgate's own graph, and how to add the same review
# and effect nodes to a `StateGraph` of your own.
