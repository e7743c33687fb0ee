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
# # 06 · Your own tools: keyed, reconcilable, unsafe
#
# A tool is a `ToolSpec`: a name, a pydantic argument schema, a function
# `func(args, ctx)`, and an **effect kind** that tells effectgate how to settle an
# outcome nobody saw (a crash or a timeout mid-call). This notebook writes three
# tools against a small external system of its own (one SQLite file standing in
# for a payments API and a status board), runs them through review and the ledger,
# breaks them on purpose, and shows the business-key pitfall.
#
# The reference for everything here is [docs/custom-tools.md](../docs/custom-tools.md).

# %%
import os
import sqlite3
import tempfile
from pathlib import Path

# Everything this notebook writes goes into one new directory, created in
# EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
import _stable
workdir = _stable.workdir("06_custom_tools-")  # the directory is created if missing
EXTERNAL = workdir / "external.sqlite3"  # the "outside world": not effectgate's to write


def external(sql, params=()):
    """Run one statement against the external system and return its rows."""
    with sqlite3.connect(EXTERNAL) as db:
        return db.execute(sql, params).fetchall()


external("CREATE TABLE IF NOT EXISTS refunds (key TEXT PRIMARY KEY, order_id TEXT, cents INT)")
_ = external("CREATE TABLE IF NOT EXISTS posts (client_id TEXT PRIMARY KEY, text TEXT)")

# %% [markdown]
# ## A keyed tool: the external system deduplicates by a key we send
#
# `refund` sends the **operation id** as its idempotency key (`ctx.operation_id`); the
# payments system stores it with a unique constraint, so a second request with the same
# key returns the first refund instead of paying twice (Stripe's `Idempotency-Key`
# works the same way). Its **business key** (`operation_key`) makes the operation id
# `refund:<order>:<cents>`: the same refund re-proposed by the model later, under a new
# tool-call id, is the same operation.
#
# `func(args, ctx)` receives the validated arguments (an instance of the schema) and a
# `ToolContext` (`operation_id`, `thread_id`, `tool_call_id`, `attempt`,
# `deadline_at`). It returns a `ToolResult` (a JSON value and an optional reference a
# person can check), or raises `Rejected` (refused for good: not applied),
# `NotAccepted` (not applied, may retry) or `OutcomeUnknown` (may have been applied).

# %%
from pydantic import BaseModel, ConfigDict, Field

from effectgate import EffectKind, Lookup, ToolContext, ToolResult, ToolSpec
from effectgate.errors import OutcomeUnknown


class RefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    order_id: str
    cents: int = Field(gt=0, description="Amount in cents.")


def refund(args: RefundArgs, ctx: ToolContext) -> ToolResult:
    external(
        "INSERT OR IGNORE INTO refunds VALUES (?, ?, ?)", (ctx.operation_id, args.order_id, args.cents)
    )
    ((key, order_id, cents),) = external("SELECT * FROM refunds WHERE key = ?", (ctx.operation_id,))
    return ToolResult(value={"order_id": order_id, "cents": cents}, reference=key)


REFUND = ToolSpec(
    name="refund",
    description="Refund part of an order.",
    args_schema=RefundArgs,
    func=refund,
    kind=EffectKind.KEYED,
    operation_key=lambda a: f"refund:{a.order_id}:{a.cents}",  # every field that matters
)

# %% [markdown]
# ## A reconcilable tool: the external system can be asked later
#
# `post_status` writes a post tagged with the operation id; the **reconciler** (a
# lookup with the same `(args, ctx)` signature) asks the board whether a post with that
# tag exists. After a timeout the dispatcher asks before doing anything else: found →
# `SUCCEEDED` with the found post as receipt; not found → a retry, because
# `not_found_is_final=True` says a post that is not there now will never appear.
#
# To show it, the first attempt commits the post and then "loses the reply".

# %%
LOST_REPLIES = {"post_status": 1}  # how many replies to lose, per tool


def post_status(args, ctx: ToolContext) -> ToolResult:
    external("INSERT OR IGNORE INTO posts VALUES (?, ?)", (ctx.operation_id, args.text))
    if LOST_REPLIES["post_status"] > 0:
        LOST_REPLIES["post_status"] -= 1
        raise OutcomeUnknown("post_status: connection reset after sending")
    return ToolResult(value={"text": args.text}, reference=ctx.operation_id)


def find_post(args, ctx: ToolContext) -> Lookup:
    rows = external("SELECT text FROM posts WHERE client_id = ?", (ctx.operation_id,))
    if not rows:
        return Lookup.not_found(f"no post tagged {ctx.operation_id}")
    return Lookup.found({"text": rows[0][0]}, reference=ctx.operation_id)


class PostArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str = Field(min_length=1)


POST = ToolSpec(
    name="post_status",
    description="Post a line on the status board.",
    args_schema=PostArgs,
    func=post_status,
    kind=EffectKind.RECONCILABLE,
    reconciler=find_post,
    not_found_is_final=True,
)

# %% [markdown]
# ## An unsafe tool: neither a key nor a lookup
#
# `append_note` appends a line to a file. Appending twice writes two lines, and the file
# cannot tell whether *this* append happened. After an unknown outcome effectgate does
# not guess: the operation waits in `NEEDS_RECONCILIATION` for a person (notebook 05
# settles such operations with a verdict).

# %%
from effectgate import StateDir

state = StateDir.open(workdir / "state")


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    line: str


def append_note(args: NoteArgs, ctx: ToolContext) -> ToolResult:
    with open(state.workspace / "notes.txt", "a") as f:
        f.write(args.line + "\n")
    raise OutcomeUnknown("append_note: the disk went away mid-write (simulated)")


NOTE = ToolSpec(
    name="append_note",
    description="Append a line to notes.txt.",
    args_schema=NoteArgs,
    func=append_note,
    kind=EffectKind.UNSAFE,
)

# %% [markdown]
# ## Run them
#
# `tools=` **replaces** the built-in tools (files, shell, tickets, mail): this agent has
# exactly these three. A scripted model (offline, deterministic) proposes one call of
# each in one message, so one review holds all three.

# %%
import contextlib

import yaml

from effectgate import open_agent

script = workdir / "script.yaml"
script.write_text(
    yaml.safe_dump(
        {
            "name": "custom",
            "turns": [
                {
                    "say": "Refunding, announcing, noting.",
                    "tool_calls": [
                        {"name": "refund", "args": {"order_id": "A-17", "cents": 1250}},
                        {"name": "post_status", "args": {"text": "A-17 refunded"}},
                        {"name": "append_note", "args": {"line": "A-17: refund 12.50"}},
                    ],
                }
            ],
        }
    )
)

stack = contextlib.ExitStack()  # keeps the agent open across cells; closed at the end
agent = stack.enter_context(open_agent(state, model=f"scripted:{script}", tools=[REFUND, POST, NOTE]))
result = agent.start("Refund order A-17.", thread_id="custom-1")
(pending,) = result.interrupts
for action in pending.value["action_requests"]:
    print(f"{action['name']:12} {action['effect_kind']:13} {action['operation_id']}")

# %%
approve = {"decisions": [{"type": "approve"}] * 3, "reviewer": "ana"}
result = agent.resume("custom-1", answers={pending.id: approve})
print(result.status)
for op in sorted(agent.ledger.list(thread_id="custom-1"), key=lambda op: op.tool):
    source = op.receipt.source if op.receipt else "-"
    print(f"{op.tool:12} {op.state.value:21} attempt {op.attempt}  receipt: {source}")

# %% [markdown]
# The refund went through on its first attempt. The post's reply was lost, so its
# operation went `IN_FLIGHT → UNKNOWN`; the lookup found the post and settled it
# (`receipt: reconcile`) without posting again. The note's outcome is unknown and
# nothing can be asked: it waits for a person. The external system's own rows:

# %%
print("refunds:", external("SELECT order_id, cents FROM refunds"))
print("posts:  ", external("SELECT text FROM posts"))
print("notes.txt:", (state.workspace / "notes.txt").read_text().splitlines())

# %% [markdown]
# ## The business-key pitfall
#
# A business key must include **every field that makes two intents different**. Key
# refunds by the order alone, `refund:<order>`, and a second, different refund of the
# same order (another item, another amount) maps onto the *first* refund's operation.
# effectgate never hands the first refund's receipt to the second, nor runs it under the
# first one's approval: the intent hash differs, so the review flags a **conflict** and
# the call is refused. Safe, but the second refund cannot happen under that key at all.
# With `refund:<order>:<cents>` (as above) the two are two operations.
#
# The opposite mistake is a key with a field the model may phrase differently each
# time (a free-text reason, a timestamp): the same business action then gets two keys,
# two operations, and two refunds.

# %%
BAD = ToolSpec(
    name="refund",
    description="Refund part of an order.",
    args_schema=RefundArgs,
    func=refund,
    kind=EffectKind.KEYED,
    operation_key=lambda a: f"refund:{a.order_id}",  # missing: cents
)
second = workdir / "second.yaml"
second.write_text(
    yaml.safe_dump(
        {
            "name": "second",
            "turns": [
                {"tool_calls": [{"name": "refund", "args": {"order_id": "B-3", "cents": 500}}]},
                {"tool_calls": [{"name": "refund", "args": {"order_id": "B-3", "cents": 900}}]},
            ],
        }
    )
)
with open_agent(state, model=f"scripted:{second}", tools=[BAD]) as bad_agent:
    r = bad_agent.start("Refund two items of order B-3.", thread_id="pitfall-1")
    (pending,) = r.interrupts
    approve = {"decisions": [{"type": "approve"}], "reviewer": "ana"}
    r = bad_agent.resume("pitfall-1", answers={pending.id: approve})
    (action,) = r.interrupts[0].value["action_requests"]
    conflict = action["conflict"]
    print("second refund proposed:", action["args"])
    print("its operation id:      ", action["operation_id"])
    print("already holds:         ", conflict["stored_args"], conflict["stored_state"])

# %%
stack.close()
