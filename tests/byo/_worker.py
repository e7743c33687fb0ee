"""A worker process running one thread of a bring-your-own agent to the end.

``python -m tests.byo._worker --variant graph|subgraph|middleware|hitl
--state-dir DIR --thread ID`` builds the agent on ``DIR`` (demo services
already running), starts the thread or continues it, approves every review
by interrupt id, and prints one JSON line. ``EFFECTGATE_FAILPOINT`` (the
effectgate variants) or ``BYO_KILL_AFTER=<tool>`` (the plain HITL variant:
exit right after the tool's external call returned) kills it on purpose.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from effectgate import StateDir, default_tools
from effectgate.demo.services import published_endpoints
from effectgate.graph import StepDurableSaver
from effectgate.ledger import SqliteLedger
from effectgate.models import make_model
from effectgate.testing.worker import DEFAULT_TASK
from tests.byo import _agents

VARIANTS = ("graph", "subgraph", "middleware", "hitl")


def build(variant: str, sd: StateDir, ledger: SqliteLedger, saver: StepDurableSaver) -> Any:
    """The compiled agent of one variant, on the state directory's files."""
    model = make_model("scripted:incident")
    tools = default_tools(sd.workspace, published_endpoints(sd.services))
    if variant == "graph":
        return _agents.user_graph(model, tools, ledger=ledger, checkpointer=saver)
    if variant == "subgraph":
        return _agents.parent_graph(model, tools, ledger=ledger, checkpointer=saver)
    if variant == "middleware":
        return _agents.middleware_agent(model, tools, ledger=ledger, checkpointer=saver)
    return _agents.hitl_agent(model, tools, checkpointer=saver)


def approve_all(value: Any) -> dict[str, Any]:
    """Approve every action of a review interrupt (HITL's and effectgate's shape)."""
    return {"decisions": [{"type": "approve"} for _ in value["action_requests"]]}


def run(args: argparse.Namespace) -> int:
    """Run or continue the thread until it ends; return 0."""
    sd = StateDir.open(args.state_dir)
    conn = sqlite3.connect(sd.checkpoints, check_same_thread=False, timeout=30.0)
    ledger = SqliteLedger(sd.ledger)
    try:
        graph = build(args.variant, sd, ledger, StepDurableSaver(conn))
        config: Any = {"configurable": {"thread_id": args.thread}}
        snapshot = graph.get_state(config)
        reviews = 0
        step: Any = (
            {"messages": [HumanMessage(DEFAULT_TASK)]} if snapshot.metadata is None else None
        )
        while True:
            if step is None and snapshot.metadata is not None:
                if snapshot.interrupts:
                    reviews += 1
                    step = Command(resume={i.id: approve_all(i.value) for i in snapshot.interrupts})
                elif not snapshot.next:
                    break
            graph.invoke(step, config, version="v2", durability="sync")
            step = None
            snapshot = graph.get_state(config)
        print(json.dumps({"status": "done", "reviews": reviews}), flush=True)
        return 0
    finally:
        conn.close()
        ledger.close()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run the thread."""
    parser = argparse.ArgumentParser(prog="python -m tests.byo._worker")
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--thread", required=True)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
