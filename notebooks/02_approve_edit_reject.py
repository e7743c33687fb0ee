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
# # 02 · Approve, edit, reject, and an approval that expires
#
# One AI message can propose several side-effecting calls at once. The review interrupt
# asks about all of them together, and the reviewer answers each one separately:
#
# * **approve** runs the call as proposed,
# * **edit** runs *different* arguments (the approval is bound to their new intent hash,
#   and the model is told what actually ran),
# * **reject** runs nothing and tells the model why,
# * **respond** (wherever reject is allowed) runs nothing and hands the model the
#   reviewer's text as the call's answer.
#
# At the end, an approval that expires before its call starts goes back to review.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("02_approve_edit_reject-")  # the directory is created if missing

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
from contextlib import ExitStack

from effectgate import RunStatus, ScriptedChatModel, StateDir, open_agent
from effectgate.demo import DemoServices

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
stack = ExitStack()

# %% [markdown]
# ## A model that proposes three writes in one message
#
# `ScriptedChatModel.from_script` plays an in-memory script offline. This one opens a
# ticket, mails *everyone* and writes a note, all in a single AI message.

# %%
TRIAGE = {
    "name": "triage",
    "turns": [
        {
            "say": "Filing the incident: ticket, mail and note.",
            "tool_calls": [
                {
                    "name": "create_ticket",
                    "args": {
                        "title": "orders: error rate above 5%",
                        "body": "The order service's error rate is 0.12.",
                        "severity": "high",
                        "alert_id": "orders-error-rate",
                    },
                },
                {
                    "name": "send_email",
                    "args": {
                        "to": ["everyone@example.com"],
                        "subject": "orders are failing",
                        "body": "The order service is failing. Ticket to follow.",
                    },
                },
                {
                    "name": "write_file",
                    "args": {"path": "incidents/orders.md", "content": "# orders\n"},
                },
            ],
        },
        {"say": "Filed what the reviewer allowed."},
    ],
}
agent = stack.enter_context(
    open_agent(
        state, model=ScriptedChatModel.from_script(TRIAGE), endpoints=services.endpoints
    )
)
THREAD = "triage-1"
result = agent.start("Triage the orders incident.", thread_id=THREAD)
assert result.status is RunStatus.WAITING_REVIEW
(pending,) = result.interrupts
actions = pending.value["action_requests"]
table(
    [
        (a["name"], a["effect_kind"], a["operation_id"], a["intent_hash"][:16])
        for a in actions
    ],
    ["tool", "kind", "operation_id", "intent_hash"],
)

# %% [markdown]
# ## Decide: approve one, edit one, reject one
#
# The mail goes to the on-call engineer instead of everyone, with a clearer subject.
# Below is the diff between the proposed and the edited arguments. The answer holds one
# decision per call, in the order of the request, and is keyed by the id of the review
# it answers (`answers={pending.id: ...}`).

# %%
import difflib
import json

ticket, mail, note = actions
edited_mail = {
    **mail["args"],
    "to": ["oncall@example.com"],
    "subject": "[high] orders error rate above 5%",
}


def pretty(args):
    return json.dumps(args, indent=2, sort_keys=True).splitlines()


print(
    "\n".join(
        difflib.unified_diff(
            pretty(mail["args"]), pretty(edited_mail), "proposed", "edited", lineterm=""
        )
    )
)

# %%
answer = {
    "decisions": [
        {"type": "approve"},
        {"type": "edit", "edited_action": {"name": "send_email", "args": edited_mail}},
        {"type": "reject", "message": "Notes go into the ticket; no files today."},
    ],
    "reviewer": "ana",
}
result = agent.resume(THREAD, answers={pending.id: answer})
assert result.status is RunStatus.DONE
show_operations(result.operations)

# %% [markdown]
# An answer is bound to the review it was given for. The same answer sent again (a
# client retrying after a lost reply) changes nothing and says so; an answer that names
# no review is refused, so an "approve" written for one review can never approve
# whatever waits later.

# %%
from effectgate.errors import DecisionError

again = agent.resume(THREAD, answers={pending.id: answer})
print("the same answer again:", again.status.value, again.already_decided)
try:
    agent.resume(THREAD, decisions=answer)
except DecisionError as exc:
    print("refused:", str(exc).splitlines()[0])
else:
    raise AssertionError("an answer that names no review must be refused")

# %% [markdown]
# ## The edit has a new intent hash
#
# The ledger stores the *edited* arguments and their hash; the approval record names the
# reviewer, the decision and the hash it authorises. Recomputing the hash from the
# stored arguments with `effectgate.tools.intent_hash` gives the same value, and it is
# not the hash the model proposed.

# %%
from effectgate.tools import intent_hash

(mail_op,) = agent.ledger.list(thread_id=THREAD, tool="send_email")
approval = agent.ledger.latest_approval(mail_op.operation_id)
print("proposed intent hash:", mail["intent_hash"])
print("executed intent hash:", mail_op.intent_hash)
print("approved intent hash:", approval.intent_hash)
print("approval:", approval.decision, "by", approval.reviewer)
assert mail_op.intent_hash != mail["intent_hash"]
assert approval.intent_hash == mail_op.intent_hash
assert intent_hash("send_email", mail_op.tool_version, mail_op.args) == mail_op.intent_hash

# %% [markdown]
# The external systems agree: one ticket, one mail to the on-call address only, and no
# note file (the rejected call never ran).

# %%
from effectgate.testing.oracle import world

(delivered,) = services.mails()
print(delivered["rcpt_tos"], delivered["subject"])
w = world(state)
print(w.as_dict())
assert delivered["rcpt_tos"] == ["oncall@example.com"]
assert (w.tickets, w.mails, w.files) == (1, 1, {})

# %% [markdown]
# ## What the model sees afterwards
#
# Every `tool_call_id` of the AI message is answered by exactly one `ToolMessage`
# before the model runs again (the OpenAI chat API rejects anything else). The edited
# call's answer says that a human replaced it and what ran instead; the rejected one
# says it was not executed, with the reviewer's reason.

# %%
from langchain_core.messages import AIMessage, ToolMessage

from effectgate.graph import history_problems

messages = agent.messages(THREAD)
for m in messages:
    if isinstance(m, AIMessage):
        calls = [c["name"] for c in m.tool_calls]
        print(f"AI    {m.content!r} calls={calls}")
    elif isinstance(m, ToolMessage):
        body = json.loads(m.content)
        said = body.get("note") or body.get("message") or body.get("reference")
        print(f"TOOL  {m.name:13} {body['status']:9} {said}")
    else:
        print(f"HUMAN {m.content!r}")
assert history_problems(messages) == []

# %% [markdown]
# ## An approval that expires
#
# Approvals last `Policy.approval_ttl` (one hour by default). If the call has not
# started by then, the approval no longer authorises it: the call goes back to review.
#
# To show this we use a two-second TTL and a note-writing script, and we stop the run
# right after the review step with LangGraph's own `interrupt_after`, as if the worker
# had been stopped between the review and the effect. Then we wait three seconds and
# resume.

# %%
import time
from datetime import timedelta

from langgraph.types import Command

from effectgate import Policy

NOTE = {
    "name": "note",
    "turns": [
        {
            "say": "Writing the note.",
            "tool_calls": [
                {
                    "name": "write_file",
                    "args": {"path": "notes/expiry.md", "content": "hi\n"},
                }
            ],
        },
        {"say": "Note written."},
    ],
}
short = stack.enter_context(
    open_agent(
        state,
        model=ScriptedChatModel.from_script(NOTE),
        policy=Policy(approval_ttl=timedelta(seconds=2)),
    )
)
result = short.start("Write the note.", thread_id="note-1")
pending = result.interrupts[0]
short.graph.invoke(
    Command(resume={pending.id: {"decisions": [{"type": "approve"}], "reviewer": "ana"}}),
    {"configurable": {"thread_id": "note-1"}},
    interrupt_after=["review"],
    durability="sync",
)
show_operations(short.ledger.list(thread_id="note-1"))

# %%
import re

time.sleep(3)
result = short.resume("note-1")
assert result.status is RunStatus.WAITING_REVIEW
(action,) = result.interrupts[0].value["action_requests"]
# (the timestamp in the message is masked so the committed output stays the same)
print(re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "<time>", action["description"]))
assert "expired" in action["description"]
assert not (state.workspace / "notes/expiry.md").exists()
show_operations(result.operations)

# %% [markdown]
# The expired approval was withdrawn (the operation is `PROPOSED` again) and nothing was
# written. A fresh approval runs it once.

# %%
(pending,) = result.interrupts
result = short.resume(
    "note-1", answers={pending.id: {"decisions": [{"type": "approve"}], "reviewer": "ana"}}
)
assert result.status is RunStatus.DONE
(note_op,) = result.operations
table(
    [
        (a.decision, a.reviewer, f"{(a.expires_at - a.decided_at).total_seconds():.0f} s")
        for a in short.ledger.approvals(note_op.operation_id)
    ],
    ["decision", "reviewer", "valid for"],
)
assert (state.workspace / "notes/expiry.md").read_text() == "hi\n"

# %%
stack.close()
services.stop()
