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
# # 08 · A conversation: follow-ups, a reviewer's edit, a restart in the middle
#
# An agent is a conversation. Here one thread gets three human messages:
#
# 1. the incident task (a ticket and a mail to the on-call engineer);
# 2. a follow-up, "also copy the on-call lead": the reviewer **edits** the mail's
#    recipient, and the process that sends it **dies** right after the mail sink accepted
#    the mail; a new process resumes the thread;
# 3. a follow-up asking again for turn 1's ticket: the ledger hands back its receipt.
#
# After each step we count what the ticket service and the mail sink hold in their own
# SQLite files. The end state: **1 ticket, 2 mails**. The process that dies is a
# subprocess, never this kernel.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("08_conversation-")  # the directory is created if missing

_stable.mask_ports()  # the services' ports differ per run: print 127.0.0.1:<port>

# %% [markdown]
# ## The conversation the model will play
#
# The offline scripted model plays one script per human message: the task's turns, then
# `followups[0]` for the second message and `followups[1]` for the third.
# `{{ outcomes }}` makes the model's closing sentence say what each side effect since the
# last human message actually did (ran, receipt reused, rejected...), not what it proposed.

# %%
import json

TICKET = {
    "name": "create_ticket",
    "args": {
        "title": "orders: error rate above 5%",
        "body": "The order service's error rate is above 5%.",
        "severity": "high",
        "alert_id": "orders-error-rate",  # the business key: one ticket per alert
    },
}
SCRIPT = {
    "name": "conversation",
    "final": "Nothing further.",
    "turns": [
        {
            "say": "Checking the error rate.",
            "tool_calls": [
                {"name": "get_error_rate", "args": {"service": "orders", "window_minutes": 5}}
            ],
        },
        {"say": "Above 5%: opening a ticket.", "tool_calls": [TICKET]},
        {
            "say": "Mailing the on-call engineer about TICKET-{{ result.create_ticket.ticket_id }}.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "args": {
                        "to": ["oncall@example.com"],
                        "subject": "TICKET-{{ result.create_ticket.ticket_id }}: orders errors",
                        "body": "The orders error rate is above 5%.",
                    },
                }
            ],
        },
        {"say": "Task: {{ outcomes }}."},
    ],
    "followups": [
        {
            "turns": [
                {
                    "say": "Copying the on-call lead, as asked.",
                    "tool_calls": [
                        {
                            "name": "send_email",
                            "args": {
                                "to": ["lead@example.com"],
                                "subject": "TICKET-{{ result.create_ticket.ticket_id }}: orders errors",
                                "body": "The orders error rate is above 5% (copy for the lead).",
                            },
                        }
                    ],
                },
                {"say": "Follow-up: {{ outcomes }}."},
            ]
        },
        {
            "turns": [
                {"say": "Looking the ticket up.", "tool_calls": [TICKET]},
                {"say": "TICKET-{{ result.create_ticket.ticket_id }}: {{ outcomes }}."},
            ]
        },
    ],
}
script_path = workdir / "conversation.json"
script_path.write_text(json.dumps(SCRIPT))
MODEL = f"scripted:{script_path}"

# %%
from effectgate import RunStatus, SqliteLedger, StateDir, open_agent
from effectgate.demo import DemoServices
from effectgate.testing.oracle import checkpoint_problems

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)
THREAD = "incident-1"


def counts(when):
    """What the external systems hold, read from their own storage."""
    tickets, mails = services.tickets(), services.mails()
    print(f"{when}: {len(tickets)} ticket(s), {len(mails)} mail(s)")
    for mail in mails:
        print(f"    mail to {', '.join(mail['rcpt_tos'])}: {mail['subject']}")


def approve_all(agent, result):
    """Approve every review (each answer names the interrupt it answers)."""
    while result.status is RunStatus.WAITING_REVIEW:
        (pending,) = result.interrupts
        n = len(pending.value["action_requests"])
        answer = {"decisions": [{"type": "approve"}] * n, "reviewer": "ana"}
        result = agent.resume(THREAD, answers={pending.id: answer})
    return result


# %% [markdown]
# ## Turn 1: the task
#
# The ticket and the mail each stop at a review; Ana approves both.

# %%
with open_agent(state, model=MODEL, endpoints=services.endpoints) as agent:
    result = approve_all(agent, agent.start("Handle the orders incident.", thread_id=THREAD))
print(result.status.value, "-", result.final_message)
counts("after turn 1")

# %% [markdown]
# ## Turn 2: a follow-up, and the reviewer's edit
#
# `agent.send(thread_id, message)` adds a human message to the thread and runs it
# (LangGraph's follow-up, `graph.invoke({"messages": [...]}, config)` on the same thread,
# recorded in the ledger first). The model proposes a mail to `lead@example.com`; the
# review shows the model's stated reason beside the call.

# %%
with open_agent(state, model=MODEL, endpoints=services.endpoints) as agent:
    result = agent.send(THREAD, "Also copy the on-call lead.")
    reason = agent.messages(THREAD)[-1].text
print(result.status.value)
(pending,) = result.interrupts
(action,) = pending.value["action_requests"]
print("model's reason:", reason)
print("proposed:", action["name"], json.dumps(action["args"]["to"]))
print("operation:", action["operation_id"])

# %% [markdown]
# The lead this week is Dana, not the shared `lead@example.com` alias. Ana edits the
# recipient. An edit is a new call: new arguments, a new intent hash, validated by the
# tool's schema when the answer arrives.

# %%
import difflib

edited = {**action["args"], "to": ["dana.lead@example.com"]}


def pretty(args):
    return json.dumps(args, indent=2, sort_keys=True).splitlines()


diff = difflib.unified_diff(pretty(action["args"]), pretty(edited), "shown", "edited", lineterm="")
print("\n".join(diff))
answer = {
    "decisions": [{"type": "edit", "edited_action": {"name": "send_email", "args": edited}}],
    "reviewer": "ana",
}

# %% [markdown]
# ## A restart in the middle
#
# A separate Python process carries Ana's answer to the thread. It runs with the failpoint
# `AFTER_EXTERNAL_COMMIT@send_email`: it exits (status 137, as if killed) right after the
# mail sink accepted the edited mail, before the ledger recorded the result.

# %%
import subprocess
import sys

SENDER = """
import json, sys
from effectgate import StateDir, open_agent
from effectgate.demo.services import published_endpoints

state_dir, model, answers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sd = StateDir.open(state_dir)
endpoints = published_endpoints(sd.services)
with open_agent(sd, model=model, endpoints=endpoints) as agent:
    print(agent.resume("incident-1", answers=answers).status.value)
"""
env = {**os.environ, "EFFECTGATE_FAILPOINT": "AFTER_EXTERNAL_COMMIT@send_email"}
sender = subprocess.run(
    [sys.executable, "-c", SENDER, str(state.root), MODEL, json.dumps({pending.id: answer})],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
)
print("the sending process exited with status", sender.returncode)
assert sender.returncode == 137, sender.stderr[-2000:]
counts("after the kill")

with SqliteLedger(state.ledger) as ledger:
    mails = ledger.list(thread_id=THREAD, tool="send_email")
    (lead_mail,) = [op for op in mails if op.args["to"] == ["dana.lead@example.com"]]
print("ledger:", lead_mail.state.value, "attempt", lead_mail.attempt, "- the outcome is not recorded")

# %% [markdown]
# The mail went out; the ledger says `IN_FLIGHT`. A new agent in this kernel (a fresh
# process for the state directory) resumes the thread. The worker that claimed the
# attempt is provably gone (same host, its pid no longer exists), so the operation goes
# `UNKNOWN` and the mail sink is asked for the mail by its `Message-ID`: found, recorded
# `SUCCEEDED`, attempt 1. Nothing is sent again.

# %%
with open_agent(state, model=MODEL, endpoints=services.endpoints) as agent:
    result = agent.resume(THREAD)
print(result.status.value, "-", result.final_message)
with SqliteLedger(state.ledger) as ledger:
    moves = [e.dst.value for e in ledger.events(operation_id=lead_mail.operation_id) if e.dst]
    lead_mail = ledger.get(lead_mail.operation_id)
print(" -> ".join(moves))
print("receipt:", lead_mail.receipt.source, lead_mail.receipt.reference)
counts("after the resume")

# %% [markdown]
# ## Turn 3: the same ticket again
#
# The third message asks for the incident's ticket; the model proposes `create_ticket`
# with the same alert. Its business key names the operation turn 1 finished, with the
# same arguments, so nobody is asked and nothing is sent: the stored receipt comes back.

# %%
with open_agent(state, model=MODEL, endpoints=services.endpoints) as agent:
    result = agent.send(THREAD, "Which ticket tracks this? Open one if there is none.")
    history = agent.messages(THREAD)
print(result.status.value, "-", result.final_message)
counts("after turn 3")

# %% [markdown]
# ## The whole conversation
#
# Three human messages, every tool call answered right after the message that made it
# (a history the model API accepts at every checkpoint), and in the external systems one
# ticket and two mails: on-call from turn 1, Dana from turn 2, each once.

# %%
for message in history:
    calls = [call["name"] for call in getattr(message, "tool_calls", [])]
    text = message.text if isinstance(message.text, str) else str(message.content)
    line = " ".join(text.split())
    print(f"{message.type:>6}: {line[:90]}" + (f"  -> {', '.join(calls)}" if calls else ""))
print("history problems at any checkpoint:", checkpoint_problems(state.checkpoints, THREAD))
counts("in the end")
services.stop()
