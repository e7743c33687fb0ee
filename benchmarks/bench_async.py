"""Many threads at once from one event loop: effectgate's async API against plain LangGraph async.

Each system runs ``T`` threads concurrently in one process, each thread a
start plus ``M`` approved side effects (the same no-op ``record`` effect and
scripted model as the other benchmarks):

- baseline: ``create_agent`` + ``HumanInTheLoopMiddleware`` with
  ``AsyncSqliteSaver`` (aiosqlite), driven with ``ainvoke`` and
  ``Command(resume=...)``, ``durability="sync"``;
- effectgate: ``Agent.astart`` / ``Agent.aresume`` on one agent (each run in a
  worker thread; thread leases, the ledger, the review and effect nodes).

Reported: side effects per second over the whole group (from the first start
to the last thread's end), per round, and the paired ratio effectgate /
baseline (rounds alternate which system goes first). Each system checks that
every approval ran exactly one effect.

Usage: ``python benchmarks/bench_async.py [--threads 50] [--calls 4] [--rounds 3]``
(writes results/async.json; ``EFFECTGATE_BENCH_QUICK=1`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import _common as c


async def _baseline(root: Path, threads: int, calls: int) -> float:
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.types import Command

    from effectgate.models import ScriptedChatModel

    root.mkdir(parents=True, exist_ok=True)
    sink: list[str] = []
    _, lc_tool = c.record_tools(sink)
    hitl = HumanInTheLoopMiddleware(
        interrupt_on={c.TOOL: {"allowed_decisions": ["approve", "edit", "reject"]}}
    )
    async with AsyncSqliteSaver.from_conn_string(str(root / "checkpoints.sqlite3")) as saver:
        graph = create_agent(
            ScriptedChatModel.from_script(c.make_script(calls)),
            [lc_tool],
            middleware=[hitl],
            checkpointer=saver,
            system_prompt=c.SYSTEM_PROMPT,
        )

        async def one(thread_id: str) -> None:
            cfg: Any = {"configurable": {"thread_id": thread_id}}
            value: Any = {"messages": [{"role": "user", "content": c.TASK}]}
            for _ in range(calls + 1):
                await graph.ainvoke(value, cfg, durability="sync")
                value = Command(resume={"decisions": [{"type": "approve"}]})

        began = time.perf_counter()
        await asyncio.gather(*(one(f"t{i}") for i in range(threads)))
        elapsed = time.perf_counter() - began
    if len(sink) != threads * calls:
        raise RuntimeError(f"baseline ran {len(sink)} effects for {threads * calls} approvals")
    return threads * calls / elapsed


async def _effectgate(root: Path, threads: int, calls: int) -> float:
    from effectgate import open_agent
    from effectgate.models import ScriptedChatModel

    sink: list[str] = []
    spec, _ = c.record_tools(sink)
    with open_agent(
        root,
        model=ScriptedChatModel.from_script(c.make_script(calls)),
        tools=[spec],
        system_prompt=c.SYSTEM_PROMPT,
    ) as agent:

        async def one(thread_id: str) -> None:
            result = await agent.astart(c.TASK, thread_id=thread_id)
            while result.status.value == "waiting_review":
                # each answer names the review it answers
                answers = {p.id: c.APPROVE for p in result.interrupts}
                result = await agent.aresume(thread_id, answers=answers)
            if result.status.value != "done":
                raise RuntimeError(f"{thread_id} ended {result.status}: {result.error}")

        began = time.perf_counter()
        await asyncio.gather(*(one(f"t{i}") for i in range(threads)))
        elapsed = time.perf_counter() - began
    if len(sink) != threads * calls:
        raise RuntimeError(f"effectgate ran {len(sink)} effects for {threads * calls} approvals")
    return threads * calls / elapsed


def run(threads: int, calls: int, rounds: int) -> dict[str, Any]:
    """Alternate the systems ``rounds`` times; return rates and paired ratios."""
    rates: dict[str, list[float]] = {"baseline": [], "effectgate": []}
    for k in range(rounds):
        order = ["baseline", "effectgate"] if k % 2 == 0 else ["effectgate", "baseline"]
        for name in order:
            root = c.work_dir(f"async-{name}-{k}")
            shutil.rmtree(root, ignore_errors=True)
            fn = _baseline if name == "baseline" else _effectgate
            rate = asyncio.run(fn(root, threads, calls))
            rates[name].append(rate)
            c.log(f"  round {k}: {name} {rate:.1f} side effects/s")
            shutil.rmtree(root, ignore_errors=True)
    ratios = [e / b for e, b in zip(rates["effectgate"], rates["baseline"], strict=True)]
    return {
        "effects_per_s": {name: c.spread(v, 1) for name, v in rates.items()},
        "ratio_effectgate_over_baseline": c.spread(ratios, 3),
        "median_ratio": round(statistics.median(ratios), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    q = c.quick()
    parser.add_argument("--threads", type=int, default=10 if q else 50)
    parser.add_argument("--calls", type=int, default=2 if q else 4)
    parser.add_argument("--rounds", type=int, default=2 if q else 3)
    args = parser.parse_args()
    params = {"threads": args.threads, "calls_per_thread": args.calls, "rounds": args.rounds}
    c.log(f"async: {args.threads} threads at once, {args.calls} approved effects each")
    results = run(args.threads, args.calls, args.rounds)
    c.log(f"wrote {c.write_result('async', params, results)}")


if __name__ == "__main__":
    main()
