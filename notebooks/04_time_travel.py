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
# # 04 · Time travel: replay every checkpoint, fork with `update_state`
#
# LangGraph keeps a checkpoint after every step, and can re-run a thread from any of
# them (*replay*) or from an edited copy (*fork*). Re-running a step that wrote to the
# outside world is exactly what effectgate makes harmless: the ledger answers with the
# stored receipt instead of calling the tool again, and a fork that changes the
# arguments of an executed call is flagged as a **conflict** for review.

# %%
import os
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("04_time_travel-")  # the directory is created if missing

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

from effectgate import RunStatus, StateDir, open_agent
from effectgate.demo import DemoServices
from effectgate.testing.oracle import world

state = StateDir.open(workdir / "state")
services = DemoServices(state.services)
services.start()
services.set_error_rate("orders", 0.12)
stack = ExitStack()
agent = stack.enter_context(open_agent(state, endpoints=services.endpoints))
THREAD = "incident-1"
CONFIG = {"configurable": {"thread_id": THREAD}}


def approve_all(result):
    """Approve every call of every pending review, each answer keyed by its review's id."""
    return {
        pending.id: {
            "decisions": [{"type": "approve"}] * len(pending.value["action_requests"]),
            "reviewer": "ana",
        }
        for pending in result.interrupts
    }


def run_to_end(result):
    while result.status is RunStatus.WAITING_REVIEW:
        result = agent.resume(THREAD, answers=approve_all(result))
    return result


TASK = "Check the order service and handle any incident."
result = run_to_end(agent.start(TASK, thread_id=THREAD))
assert result.status is RunStatus.DONE
show_operations(result.operations)

# %% [markdown]
# ## The thread's checkpoints
#
# `agent.graph` is the compiled LangGraph graph; `get_state_history` lists the
# checkpoints newest first, with the node(s) that would run next.

# %%
history = list(agent.graph.get_state_history(CONFIG))
table(
    [
        (
            s.metadata["step"],
            ", ".join(s.next) or "(end)",
            len(s.values.get("messages", [])),
            "yes" if s.interrupts else "",
        )
        for s in history
    ],
    ["step", "next", "messages", "interrupt"],
)

# %% [markdown]
# ## Replay from every checkpoint
#
# `agent.replay(thread, checkpoint_id)` re-runs the thread from that checkpoint. The
# scripted model proposes the same calls again; the ticket, the mail and the note are
# operations that already ended with these very arguments, so they are not even
# reviewed again, and dispatch hands back the stored receipts. The external systems do
# not change.

# %%
before = world(state)
reused_before = agent.ledger.metrics().results_reused
for snapshot in history:
    checkpoint_id = snapshot.config["configurable"]["checkpoint_id"]
    replayed = run_to_end(agent.replay(THREAD, checkpoint_id))
    assert replayed.status is RunStatus.DONE
after = world(state)
print("replays:", len(history))
print("stored receipts handed back:", agent.ledger.metrics().results_reused - reused_before)
print("ticket create requests:", services.stats("tickets")["create_requests"])
print("mail DATA commands:   ", services.stats("mail")["data_commands"])
assert after == before
assert services.stats("tickets")["create_requests"] == 1
assert services.stats("mail")["data_commands"] == 1

# %% [markdown]
# ## Fork with edited arguments
#
# `update_state` writes a new checkpoint on top of an old one. Here we take the
# checkpoint where the model had just proposed the ticket, and replace the proposal
# with one that has a different title, as if the model had said something else. The
# ticket's operation id comes from its alert id, so the new call maps onto the operation
# that already succeeded, with a different intent hash: a **conflict**. The review
# shows it, and `approve` is not among the allowed decisions.

# %%
snapshot = next(
    s
    for s in history  # the original run's checkpoints, listed above
    if s.next == ("review",)
    and any(c["name"] == "create_ticket" for c in s.values["messages"][-1].tool_calls)
)
proposal = snapshot.values["messages"][-1]
call = dict(proposal.tool_calls[0])
call["args"] = {**call["args"], "title": "orders: SEV1, everything is on fire"}
forked = agent.graph.update_state(
    snapshot.config,
    {"messages": [proposal.model_copy(update={"tool_calls": [call]})]},
    as_node="agent",
)
result = agent.replay(THREAD, forked["configurable"]["checkpoint_id"])
assert result.status is RunStatus.WAITING_REVIEW
(pending,) = result.interrupts
request = pending.value
(action,) = request["action_requests"]
print("allowed decisions:", request["review_configs"][0]["allowed_decisions"])
print("conflict:")
for key, value in action["conflict"].items():
    print(f"  {key}: {value}")

# %%
from effectgate.errors import DecisionError

try:
    agent.resume(
        THREAD, answers={pending.id: {"decisions": [{"type": "approve"}], "reviewer": "ana"}}
    )
except DecisionError as exc:
    print("refused:", exc)
else:
    raise AssertionError("approving a conflict must be refused")
reject = {"type": "reject", "message": "keep the first ticket"}
result = agent.resume(
    THREAD, answers={pending.id: {"decisions": [reject], "reviewer": "ana"}}
)
print(result.status, "-", result.final_message)
assert world(state) == before
assert services.stats("tickets")["create_requests"] == 1

# %% [markdown]
# ## A re-plan with new call ids
#
# A real model replayed from an old checkpoint rarely produces the same tool-call ids.
# Here a model with fresh random ids re-plans from the checkpoint just before the mail
# and the note. Their operation ids are new, but each call's intent hash equals that of
# an operation that already succeeded, so the review flags it as a **possible
# duplicate** and never approves it on its own. We reject both.

# %%
from langchain_core.messages import ToolMessage

from effectgate import ScriptedChatModel
from effectgate.models import load_script

replanner = stack.enter_context(
    open_agent(
        state,
        model=ScriptedChatModel.from_script(load_script("incident"), fresh_ids=True),
        endpoints=services.endpoints,
    )
)
before_mail = next(
    s
    for s in history  # the original run's checkpoints
    if s.next == ("agent",)
    and [m.name for m in s.values["messages"] if isinstance(m, ToolMessage)]
    == ["get_error_rate", "create_ticket"]
)
result = replanner.replay(THREAD, before_mail.config["configurable"]["checkpoint_id"])
assert result.status is RunStatus.WAITING_REVIEW
(pending,) = result.interrupts
actions = pending.value["action_requests"]
table(
    # the re-planned ids are random (as a real model's are): shown masked
    [(a["name"], a["operation_id"][:15] + "<new id>", a["possible_duplicate_of"]) for a in actions],
    ["tool", "new operation_id", "possible duplicate of"],
)
assert all(a["possible_duplicate_of"] for a in actions)
result = replanner.resume(
    THREAD,
    answers={pending.id: {"decisions": [{"type": "reject"}] * len(actions), "reviewer": "ana"}},
)
assert result.status is RunStatus.DONE
print(world(state).as_dict())
assert world(state) == before

# %%
stack.close()
services.stop()
