"""Side effects per second with 1, 2, 4 (8) worker processes on PostgreSQL, distinct threads.

Two systems, each in its own fresh schema of one scratch database:

- ``langgraph_pg``: plain LangGraph, ``create_agent`` + ``HumanInTheLoopMiddleware``
  + ``PostgresSaver`` on a ``psycopg_pool`` pool, ``durability="sync"``;
- ``effectgate_pg``: ``open_agent(..., store=<url>)``: ``PostgresLedger`` and
  ``StepDurablePostgresSaver`` (thread lease, review node, ledger claim and result).

Same scripted model, same no-op ``record`` tool, same step as the other
benchmarks (``_common``): one step is one approved side effect. Each worker
process opens its system, says ready, and per round waits for a common go,
then runs a fresh thread: start plus ``M`` approved effects. Per round the
rate is all effects over the time from the go to the last worker's end; the
systems alternate round by round. Reported: median and min-max over rounds.

The server is ``EFFECTGATE_TEST_POSTGRES`` (default the local one); a scratch
database is created and dropped.

Usage: ``python benchmarks/bench_postgres.py [--workers 1 2 4 8]`` (writes results/postgres.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common as c

SYSTEMS = ["langgraph_pg", "effectgate_pg"]


class LangGraphPg(c.System):
    """``create_agent`` + HITL middleware + ``PostgresSaver`` (pooled), ``durability="sync"``."""

    name = "langgraph_pg"

    def __init__(self, url: str, script: dict[str, Any]) -> None:
        super().__init__(Path("."), script)
        from langchain.agents import create_agent
        from langchain.agents.middleware import HumanInTheLoopMiddleware
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        from effectgate.models import ScriptedChatModel

        _, lc_tool = c.record_tools(self.sink)
        kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        self.pool: Any = ConnectionPool(url, min_size=1, max_size=2, kwargs=kwargs)
        saver = PostgresSaver(self.pool)
        saver.setup()
        hitl = HumanInTheLoopMiddleware(
            interrupt_on={c.TOOL: {"allowed_decisions": ["approve", "edit", "reject"]}}
        )
        self.graph = create_agent(
            ScriptedChatModel.from_script(script),
            [lc_tool],
            middleware=[hitl],
            checkpointer=saver,
            system_prompt=c.SYSTEM_PROMPT,
        )

    def _stream(self, value: Any, thread_id: str) -> None:
        cfg: Any = {"configurable": {"thread_id": thread_id}}
        for _ in self.graph.stream(value, cfg, stream_mode="updates", durability="sync"):
            pass

    def start(self, thread_id: str) -> None:
        self._stream({"messages": [{"role": "user", "content": c.TASK}]}, thread_id)

    def step(self, thread_id: str) -> None:
        from langgraph.types import Command

        self._stream(Command(resume={"decisions": [{"type": "approve"}]}), thread_id)

    def close(self) -> None:
        self.pool.close()


class EffectgatePg(c.System):
    """effectgate's ``Agent`` with ``store=<url>``: PostgreSQL ledger and checkpoints."""

    name = "effectgate_pg"

    def __init__(self, url: str, root: Path, script: dict[str, Any]) -> None:
        super().__init__(root, script)
        from effectgate._app import open_agent
        from effectgate.models import ScriptedChatModel

        spec, _ = c.record_tools(self.sink)
        self._cm = open_agent(
            root,
            model=ScriptedChatModel.from_script(script),
            tools=[spec],
            system_prompt=c.SYSTEM_PROMPT,
            store=url,
        )
        self.agent = self._cm.__enter__()

    def start(self, thread_id: str) -> None:
        result = self.agent.start(c.TASK, thread_id=thread_id)
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate start ended {result.status}: {result.error}")

    def step(self, thread_id: str) -> None:
        pending = self.agent.status(thread_id).interrupts
        # each answer names the review it answers
        result = self.agent.resume(thread_id, answers={p.id: c.APPROVE for p in pending})
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate step ended {result.status}: {result.error}")

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def _open(system: str, url: str, root: Path, calls: int) -> c.System:
    script = c.make_script(calls + 2)
    return LangGraphPg(url, script) if system == "langgraph_pg" else EffectgatePg(url, root, script)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.005)


def child_worker(system: str, url: str, root: Path, thread: str, calls: int, sync: Path) -> None:
    """One worker process: open, say ready; per round wait for go, run a fresh thread, report."""
    rounds = int((sync / "rounds").read_text())
    sys_ = _open(system, url, root, calls)
    (sync / f"ready-{thread}").touch()
    for r in range(rounds):
        _wait_for(sync / f"go-{r}")
        before = len(sys_.sink)
        t0 = time.monotonic()
        sys_.start(f"{thread}-r{r}")
        for _ in range(calls):
            sys_.step(f"{thread}-r{r}")
        t1 = time.monotonic()
        tmp = sync / f"partial-{r}-{thread}"
        tmp.write_text(json.dumps({"t0": t0, "t1": t1, "effects": len(sys_.sink) - before}))
        tmp.replace(sync / f"report-{r}-{thread}.json")
    _wait_for(sync / "quit")
    sys_.close()


class _Group:
    """``workers`` processes of one system on one schema, kept for every round."""

    def __init__(self, system: str, url: str, workers: int, calls: int, rounds: int) -> None:
        self.system, self.workers = system, workers
        self.base = c.work_dir("postgres")
        root, self.sync = self.base / "state", self.base / "sync"
        self.sync.mkdir()
        (self.sync / "rounds").write_text(str(rounds))
        warm = _open(system, url, root, 2)  # tables and schema once: workers measure steady state
        try:
            warm.start("init")
        finally:
            warm.close()
        cmd = [sys.executable, __file__, "--worker", system, url, str(root)]
        self.logs = [(self.sync / f"stderr-{i}.txt").open("wb") for i in range(workers)]
        self.procs = [
            subprocess.Popen([*cmd, f"w{i}", str(calls), str(self.sync)], stderr=log)
            for i, log in enumerate(self.logs)
        ]
        while len(list(self.sync.glob("ready-*"))) < workers:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a {system} worker died before starting: {self.errors()}")
            time.sleep(0.01)

    def round(self, r: int) -> float:
        go_at = time.monotonic()
        (self.sync / f"go-{r}").touch()
        while len(list(self.sync.glob(f"report-{r}-*.json"))) < self.workers:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a {self.system} worker died: {self.errors()}")
            time.sleep(0.005)
        reports = [json.loads(f.read_text()) for f in self.sync.glob(f"report-{r}-*.json")]
        return sum(rep["effects"] for rep in reports) / (max(rep["t1"] for rep in reports) - go_at)

    def errors(self) -> str:
        return " | ".join(
            f.read_text(errors="replace")[-1500:] for f in sorted(self.sync.glob("stderr-*"))
        )

    def close(self) -> None:
        (self.sync / "quit").touch()
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
        for log in self.logs:
            log.close()


def run(admin_dsn: str, worker_counts: list[int], calls: int, rounds: int) -> dict[str, Any]:
    """Every (system, worker count) on its own schema; rounds alternate between the systems."""
    import psycopg

    from effectgate.testing.postgres import scratch_database, with_search_path

    rates: dict[tuple[str, int], list[float]] = {}
    with scratch_database(admin_dsn) as db:
        for n in worker_counts:
            groups: dict[str, _Group] = {}
            try:
                for s in SYSTEMS:
                    schema = f"{s}_{n}"
                    with psycopg.connect(db, autocommit=True) as conn:
                        conn.execute(f'CREATE SCHEMA "{schema}"')
                    groups[s] = _Group(s, with_search_path(db, schema), n, calls, rounds)
                for r in range(rounds):
                    for s in c.rotated(SYSTEMS, r):
                        rates.setdefault((s, n), []).append(groups[s].round(r))
                    c.log(f"  {n} worker(s), round {r + 1}/{rounds}: " + ", ".join(
                        f"{s} {rates[s, n][-1]:.1f}/s" for s in SYSTEMS))  # fmt: skip
            finally:
                for g in groups.values():
                    g.close()
    out: dict[str, Any] = {
        s: {str(n): c.spread(rates[s, n], 1) for n in worker_counts} for s in SYSTEMS
    }
    out["ratio_effectgate_over_langgraph_time_per_effect"] = {
        str(n): round(
            c.percentile(rates["langgraph_pg", n], 0.5)
            / c.percentile(rates["effectgate_pg", n], 0.5),  # type: ignore[operator]
            3,
        )
        for n in worker_counts
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--worker", nargs=6, metavar=("SYSTEM", "URL", "DIR", "THREAD", "CALLS", "SYNC")
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    if args.worker:
        s, url, d, t, n, sync = args.worker
        child_worker(s, url, Path(d), t, int(n), Path(sync))
        return
    import os

    from effectgate.testing.postgres import DEFAULT_DSN, ENV_DSN

    q = c.quick()
    params: dict[str, Any] = {
        "workers": args.workers,
        "calls_per_worker": args.calls or (3 if q else 20),
        "rounds": args.rounds or (2 if q else 3),
    }
    c.log("postgres: worker processes on one PostgreSQL, distinct threads")
    results = run(
        os.environ.get(ENV_DSN) or DEFAULT_DSN,
        params["workers"],
        params["calls_per_worker"],
        params["rounds"],
    )
    c.log(f"wrote {c.write_result('postgres', params, results)}")


if __name__ == "__main__":
    main()
