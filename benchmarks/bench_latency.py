"""Scale-out under real model latency: effectgate and plain LangGraph on PostgreSQL, side by side.

The workload users run: model calls of hundreds of milliseconds, many threads
in flight per worker process, several worker processes on one PostgreSQL.

- **Model**: the scripted model (``ScriptedChatModel``) with a set latency per
  call (default 500 ms): ``time.sleep`` on the sync path (effectgate runs the
  graph in a worker thread, as a sync HTTP client would block it),
  ``asyncio.sleep`` on the async path (LangGraph's ``ainvoke``, as an async
  HTTP client would wait). Each thread is one task: the model asks for one
  ``record`` call, the driver approves it (a resume), the effect runs, the
  model answers: two model calls per side effect.
- **Effect**: a local, cheap write: one line appended (``O_APPEND``, no
  fsync) to a per-worker, per-system file, holding the thread id and the
  time (``time.monotonic``, system-wide on Linux). The files are the effect's
  own storage: every count below is read back from them.
- **effectgate**: ``open_agent(..., store=<url>)`` (``PostgresLedger`` +
  ``StepDurablePostgresSaver``), driven with ``Agent.astart`` /
  ``Agent.aresume`` from one event loop, the tool an IDEMPOTENT ``ToolSpec``.
- **langgraph**: ``create_agent`` + ``HumanInTheLoopMiddleware`` +
  ``AsyncPostgresSaver`` on an ``AsyncConnectionPool`` (max 4 connections,
  as effectgate's pools), ``ainvoke`` and ``Command(resume=...)``,
  ``durability="sync"``, the tool an async LangChain tool.
- **effectgate_wide** (diagnostic; not in ``--quick``): effectgate with the event
  loop's default executor sized to the threads in flight. ``asyncio.to_thread``
  uses that executor, whose default size is ``min(32, cpus + 4)``: 6 on this
  machine.

``N`` worker processes (one event loop each) run ``K`` threads in flight each:
``K`` slots per worker, each slot running ``M`` threads one after the other;
the ``N*K`` slots start spread evenly over one model-time period so the load
is steady rather than in lock-step bursts. Each system has its own fresh
schema of the database (``lat_<random>_eg``, ``lat_<random>_lg``), dropped at
the end. Each worker opens the round's system before the round and closes it
after (so at most one system's connections are open at a time), and runs one
untimed warm-up thread after opening (its effect is counted with the others).

**Rate** (effects/s) of a round: the sum over its slots of ``(M - 1) /
(time of the slot's last effect - time of its first)``, from the effect files:
each slot's steady cycle time, ramp-up and tail excluded. **Ideal**: ``N*K /
(model time + step time)`` with model time = 2 calls x latency and step time =
the system's own time per thread beyond the model's, measured in the same run
with one worker and one thread (``1 x 1`` rows). Each (system, N, K) is run
``--reps`` times, the systems taking turns (order rotated); reported: median
and min-max. Per round also: the workers' CPU time per effect
(``time.process_time``) and the fraction of the machine's cores busy
(``/proc/stat``, every process: workers, PostgreSQL, other users).

Writes ``results/latency.json``, ``results/latency.md`` (table and verdicts)
and ``results/latency.png`` (effects/s against workers, both systems, the
ideal lines).

Usage: ``python benchmarks/bench_latency.py [--workers 1 2 4 8] [--threads 10]
[--latency-ms 500] [--per-slot 5] [--reps 3] [--systems effectgate langgraph]``;
``--quick``: workers 1 and 2, 2 threads, 100 ms, 2 threads per slot, one
repetition. The server is ``--dsn`` (default ``$EFFECTGATE_TEST_POSTGRES`` or
``postgresql://postgres@127.0.0.1:5432/test``). ``--keep`` keeps the effect
files (their directory is in the JSON); ``--profile`` instead profiles one
thread of each system (latency 0, cProfile) and writes
``results/latency_profile.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import _common as c
from langchain_core.runnables import RunnableConfig  # resolved at runtime by ToolNode

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
SYSTEMS = ("effectgate", "langgraph")
ALL_SYSTEMS = ("effectgate", "langgraph", "effectgate_wide")
LABELS = {
    "effectgate": "effectgate",
    "langgraph": "LangGraph (create_agent + HITL + AsyncPostgresSaver)",
    "effectgate_wide": "effectgate, default executor sized to K",
}
MODEL_CALLS_PER_THREAD = 2
"""The model proposes the call, then (after the effect) answers: two calls per effect."""
TARGET_OF_IDEAL = 0.9

# ----------------------------------------------------------------------- model and effect


def slow_model(latency_s: float) -> Any:
    """The benchmarks' scripted model (one ``record`` call, then the answer), ``latency_s``/call."""
    from langchain_core.outputs import ChatGeneration, ChatResult

    from effectgate.models import ScriptedChatModel

    class SlowScriptedModel(ScriptedChatModel):
        """``ScriptedChatModel`` that takes ``latency_s`` seconds per call, sync or async."""

        latency_s: float = 0.5

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
            time.sleep(self.latency_s)
            return super()._generate(messages, stop, run_manager, **kw)

        async def _agenerate(  # type: ignore[no-untyped-def]
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ):
            await asyncio.sleep(self.latency_s)
            return ChatResult(generations=[ChatGeneration(message=self.respond(messages))])

    script = c.make_script(1)
    model = SlowScriptedModel.from_script(script)
    model.latency_s = latency_s
    return model


class EffectFile:
    """The side effect's own storage: one appended line per effect: ``<thread id> <monotonic>``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, thread_id: str) -> None:
        """Append one effect line (one ``write`` system call, atomic under ``O_APPEND``)."""
        os.write(self.fd, f"{thread_id} {time.monotonic():.6f}\n".encode())

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


def read_effects(effects_dir: Path, system: str) -> list[tuple[str, float]]:
    """Every effect line of ``system`` in ``effects_dir``: ``(thread id, monotonic s)``."""
    out: list[tuple[str, float]] = []
    for path in sorted(effects_dir.glob(f"{system}.w*.log")):
        for line in path.read_text().splitlines():
            tid, at = line.split(" ")
            out.append((tid, float(at)))
    return out


def thread_id(system: str, rnd: int, worker: int, slot: int, seq: int) -> str:
    """The thread id of one thread: what ran it, in which round, worker, slot and order."""
    return f"{system}-r{rnd}-w{worker}-s{slot}-n{seq}"


# ---------------------------------------------------------------------------- systems


class _EffectgateRunner:
    """effectgate ``Agent`` on PostgreSQL, driven with ``astart``/``aresume``."""

    def __init__(self, url: str, root: Path, latency_s: float, effects: EffectFile) -> None:
        from pydantic import BaseModel

        from effectgate import open_agent
        from effectgate.tools import EffectKind, ToolResult, ToolSpec

        class RecordArgs(BaseModel):
            key: str
            value: int

        def effect(args: RecordArgs, ctx: Any) -> ToolResult:
            effects.write(ctx.thread_id)
            return ToolResult(value={"ok": True, "key": args.key})

        spec = ToolSpec(
            name=c.TOOL,
            description="Record a value.",
            args_schema=RecordArgs,
            func=effect,
            kind=EffectKind.IDEMPOTENT,
        )
        self._stack = ExitStack()
        self.agent = self._stack.enter_context(
            open_agent(
                root,
                model=slow_model(latency_s),
                tools=[spec],
                system_prompt=c.SYSTEM_PROMPT,
                store=url,
            )
        )

    async def one(self, tid: str) -> None:
        result = await self.agent.astart(c.TASK, thread_id=tid)
        while result.status.value == "waiting_review":
            answers = {p.id: c.APPROVE for p in result.interrupts}
            result = await self.agent.aresume(tid, answers=answers)
        if result.status.value != "done":
            raise RuntimeError(f"effectgate {tid} ended {result.status}: {result.error}")

    async def aclose(self) -> None:
        self._stack.close()


class _LangGraphRunner:
    """``create_agent`` + HITL middleware + ``AsyncPostgresSaver``, ``ainvoke``."""

    @classmethod
    async def open(cls, url: str, latency_s: float, effects: EffectFile) -> _LangGraphRunner:
        from langchain.agents import create_agent
        from langchain.agents.middleware import HumanInTheLoopMiddleware
        from langchain_core.tools import StructuredTool
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool
        from pydantic import BaseModel

        class RecordArgs(BaseModel):
            key: str
            value: int

        async def record(key: str, value: int, config: RunnableConfig) -> dict[str, Any]:
            effects.write(str(config["configurable"]["thread_id"]))
            return {"ok": True, "key": key}

        tool = StructuredTool.from_function(
            coroutine=record, name=c.TOOL, description="Record a value.", args_schema=RecordArgs
        )
        self = cls()
        self._stack = AsyncExitStack()
        kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
        pool: Any = AsyncConnectionPool(url, min_size=1, max_size=4, kwargs=kwargs, open=False)
        await pool.open(wait=True)
        self._stack.push_async_callback(pool.close)
        hitl = HumanInTheLoopMiddleware(
            interrupt_on={c.TOOL: {"allowed_decisions": ["approve", "edit", "reject"]}}
        )
        self.graph = create_agent(
            slow_model(latency_s),
            [tool],
            middleware=[hitl],
            checkpointer=AsyncPostgresSaver(pool),
            system_prompt=c.SYSTEM_PROMPT,
        )
        return self

    async def one(self, tid: str) -> None:
        from langgraph.types import Command

        cfg: Any = {"configurable": {"thread_id": tid}}
        value: Any = {"messages": [{"role": "user", "content": c.TASK}]}
        out = await self.graph.ainvoke(value, cfg, durability="sync")
        while out.get("__interrupt__"):
            resume = Command(resume={"decisions": [{"type": "approve"}]})
            out = await self.graph.ainvoke(resume, cfg, durability="sync")
        last = out["messages"][-1]
        if getattr(last, "tool_calls", None) or last.type != "ai":
            raise RuntimeError(f"langgraph {tid} did not finish: last message {last!r}")

    async def aclose(self) -> None:
        await self._stack.aclose()


# ----------------------------------------------------------------------------- worker


async def _worker(urls: dict[str, str], root: Path, effects_dir: Path, index: int) -> None:
    """One worker process: read commands (one JSON object a line) on stdin, answer on stdout."""
    loop = asyncio.get_running_loop()
    # asyncio's own default, made explicit so a wide round can swap it and back.
    default_pool = ThreadPoolExecutor(thread_name_prefix="asyncio")
    loop.set_default_executor(default_pool)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    files = {s: EffectFile(effects_dir / f"{s}.w{index}.log") for s in ALL_SYSTEMS}
    runner: Any = None
    latency_s = 0.0

    def answer(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    answer({"ready": index})
    while line := await reader.readline():
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "open":
            system, latency_s = cmd["system"], cmd["latency_s"]
            if system == "langgraph":
                runner = await _LangGraphRunner.open(urls["lg"], latency_s, files[system])
            else:
                runner = _EffectgateRunner(urls["eg"], root, latency_s, files[system])
            # one thread before the round, untimed: first-call costs (plans, pools) out
            await runner.one(f"{system}-r{cmd['round']}-w{index}-warm")
            answer({"opened": system})
        elif op == "run":
            wide = cmd["system"] == "effectgate_wide"
            if wide:
                loop.set_default_executor(ThreadPoolExecutor(max_workers=cmd["k"] + 4))
            try:
                report = await _round(runner, cmd, index)
            finally:
                if wide:
                    loop.set_default_executor(default_pool)
            answer(report)
        elif op == "close":
            await runner.aclose()
            runner = None
            answer({"closed": True})
        elif op == "quit":
            break
    for f in files.values():
        f.close()


async def _round(runner: Any, cmd: dict[str, Any], w: int) -> dict[str, Any]:
    system, rnd, n, k, m = cmd["system"], cmd["round"], cmd["n"], cmd["k"], cmd["m"]
    period = cmd["period_s"]

    async def slot(j: int) -> None:
        # Slot g of the N*K slots starts at g/(N*K) of one model-time period.
        await asyncio.sleep(period * (w * k + j) / (n * k))
        for seq in range(m):
            await runner.one(thread_id(system, rnd, w, j, seq))

    t0, cpu0 = time.monotonic(), time.process_time()
    await asyncio.gather(*(slot(j) for j in range(k)))
    return {"t0": t0, "t1": time.monotonic(), "cpu_s": time.process_time() - cpu0}


# ----------------------------------------------------------------------------- driver


def _machine_busy() -> tuple[int, int]:
    """``(busy, total)`` jiffies of all cores since boot (``/proc/stat``; (0, 0) elsewhere)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class _Workers:
    """``count`` worker processes, each ready to open either system and run rounds."""

    def __init__(self, count: int, urls: dict[str, str], root: Path, effects_dir: Path) -> None:
        self.logs_dir = effects_dir.parent / "logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "--worker", json.dumps(urls), str(root), str(effects_dir)]
        self.procs: list[subprocess.Popen[str]] = []
        for i in range(count):
            log = (self.logs_dir / f"worker-{i}.txt").open("w")
            self.procs.append(
                subprocess.Popen(
                    [*cmd, str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
            )
        for i in range(count):
            self._read(i)  # {"ready": i}

    def _read(self, i: int) -> dict[str, Any]:
        out = self.procs[i].stdout
        assert out is not None
        line = out.readline()
        if not line:
            tail = (self.logs_dir / f"worker-{i}.txt").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker {i} died:\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, which: Sequence[int], cmds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send each worker its command at once; return their answers in order."""
        for i, cmd in zip(which, cmds, strict=True):
            stdin = self.procs[i].stdin
            assert stdin is not None
            stdin.write(json.dumps(cmd) + "\n")
            stdin.flush()
        return [self._read(i) for i in which]

    def close(self) -> None:
        for p in self.procs:
            try:
                if p.stdin is not None:
                    p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _slot_rates(lines: list[tuple[str, float]], prefix: str) -> tuple[float, int, list[int]]:
    """Sum of per-slot steady rates for one round, its effect count, effects per slot."""
    slots: dict[str, list[float]] = {}
    for tid, at in lines:
        if tid.startswith(prefix) and not tid.endswith("-warm"):
            slots.setdefault(tid.rsplit("-n", 1)[0], []).append(at)
    rate = 0.0
    for times in slots.values():
        if len(times) >= 2 and max(times) > min(times):
            rate += (len(times) - 1) / (max(times) - min(times))
    return rate, sum(len(t) for t in slots.values()), sorted(len(t) for t in slots.values())


def _prepare(admin_dsn: str, prefix: str) -> dict[str, str]:
    """Create the run's schemas and both systems' tables (once, before any worker)."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    from effectgate.testing.postgres import with_search_path

    urls = {key: with_search_path(admin_dsn, f"{prefix}_{key}") for key in ("eg", "lg")}
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        for key in urls:
            conn.execute(f'CREATE SCHEMA "{prefix}_{key}"')
    with PostgresSaver.from_conn_string(urls["lg"]) as saver:
        saver.setup()
    return urls


def _drop(admin_dsn: str, prefix: str) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=10) as conn:
        for key in ("eg", "lg"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{prefix}_{key}" CASCADE')


def run(
    admin_dsn: str,
    systems: Sequence[str],
    workers: Sequence[int],
    k: int,
    latency_s: float,
    per_slot: int,
    reps: int,
    keep: bool,
) -> dict[str, Any]:
    """The whole grid; returns rates, ideals, costs and the effect counts read back."""
    from effectgate import open_agent

    base = c.work_dir("latency")
    effects_dir, root = base / "effects", base / "state"
    prefix = f"lat_{secrets.token_hex(4)}"
    urls = _prepare(admin_dsn, prefix)
    period = MODEL_CALLS_PER_THREAD * latency_s
    configs = [(1, 1)] + [(n, k) for n in workers]  # 1 x 1: the step time, for the ideal
    rounds: list[dict[str, Any]] = []
    expected = {s: 0 for s in systems}
    pool: _Workers | None = None
    try:
        # effectgate's tables and the state directory once, before the workers race for them
        with open_agent(root, model=slow_model(0.0), tools=[], store=urls["eg"]):
            pass
        pool = _Workers(max(workers), urls, root, effects_dir)
        rnd = 0
        for rep in range(reps):
            for ci, (n, kk) in enumerate(configs):
                for system in c.rotated(list(systems), rep + ci):
                    rnd += 1
                    which = list(range(n))
                    opening = {"op": "open", "system": system, "latency_s": latency_s,
                               "round": rnd}  # fmt: skip
                    pool.ask(which, [opening] * n)
                    busy0, total0 = _machine_busy()
                    go = time.monotonic()
                    cmd = {"op": "run", "system": system, "round": rnd, "n": n, "k": kk,
                           "m": per_slot, "period_s": period}  # fmt: skip
                    reports = pool.ask(which, [cmd] * n)
                    busy1, total1 = _machine_busy()
                    pool.ask(which, [{"op": "close"}] * n)
                    expected[system] += n * (kk * per_slot + 1)  # + one warm-up thread each
                    rate, count, per = _slot_rates(
                        read_effects(effects_dir, system), f"{system}-r{rnd}-"
                    )
                    if count != n * kk * per_slot or set(per) != {per_slot}:
                        raise RuntimeError(
                            f"{system} round {rnd}: {count} effects stored for "
                            f"{n * kk * per_slot} approvals (per slot {per})"
                        )
                    wall = max(r["t1"] for r in reports) - go
                    row = {
                        "system": system, "rep": rep, "n": n, "k": kk, "round": rnd,
                        "rate": rate,
                        "round_rate": count / wall,
                        "cpu_ms_per_effect": 1000 * sum(r["cpu_s"] for r in reports) / count,
                        "machine_busy": (busy1 - busy0) / (total1 - total0)
                        if total1 > total0 else -1.0,
                        "load_1m": os.getloadavg()[0],
                    }  # fmt: skip
                    rounds.append(row)
                    c.log(
                        f"  rep {rep + 1}/{reps} {n}x{kk} {system}: {rate:.2f} effects/s "
                        f"(cpu {row['cpu_ms_per_effect']:.1f} ms/effect, "
                        f"machine busy {row['machine_busy']:.0%})"
                    )
    finally:
        if pool is not None:
            pool.close()
        _drop(admin_dsn, prefix)
    stored = {}
    for s in systems:
        lines = read_effects(effects_dir, s)
        stored[s] = {"effects": len(lines), "distinct_threads": len({t for t, _ in lines})}
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return _summarise(rounds, systems, workers, k, latency_s, per_slot) | {
        "effects_expected": expected,
        "effects_stored": stored,
        "effects_dir": str(effects_dir) if keep else None,
        "schemas": [f"{prefix}_eg", f"{prefix}_lg"],
        "rounds": [
            {key: round(v, 4) if isinstance(v, float) else v for key, v in r.items()}
            for r in rounds
        ],
    }


def _summarise(
    rounds: list[dict[str, Any]],
    systems: Sequence[str],
    workers: Sequence[int],
    k: int,
    latency_s: float,
    per_slot: int,
) -> dict[str, Any]:
    model_s = MODEL_CALLS_PER_THREAD * latency_s

    def pick(s: str, n: int, kk: int, key: str) -> list[float]:
        return [r[key] for r in rounds if r["system"] == s and r["n"] == n and r["k"] == kk]

    step_s = {}
    for s in systems:
        # one slot alone: its rate is 1 / (model time + step time)
        cycle = [1 / r for r in pick(s, 1, 1, "rate")]
        step_s[s] = max(0.0, statistics.median(cycle) - model_s)
    grid: dict[str, Any] = {}
    for s in systems:
        grid[s] = {}
        for n in workers:
            rates = pick(s, n, k, "rate")
            ideal = n * k / (model_s + step_s[s])
            grid[s][str(n)] = {
                "effects_per_s": c.spread(rates, 2),
                "ideal": round(ideal, 2),
                "of_ideal": c.spread([r / ideal for r in rates], 3),
                "round_effects_per_s": c.spread(pick(s, n, k, "round_rate"), 2),
                "cpu_ms_per_effect": c.spread(pick(s, n, k, "cpu_ms_per_effect"), 1),
                "machine_busy": c.spread(pick(s, n, k, "machine_busy"), 2),
                "load_1m": c.spread(pick(s, n, k, "load_1m"), 2),
            }
    return {
        "model_s_per_thread": model_s,
        "step_ms": {s: round(1000 * v, 1) for s, v in step_s.items()},
        "step_rounds_effects_per_s": {s: c.spread(pick(s, 1, 1, "rate"), 3) for s in systems},
        "grid": grid,
    }


# ----------------------------------------------------------------------------- output


def _fmt(sp: dict[str, Any], digits: int = 1) -> str:
    return f"{sp['median']:.{digits}f} ({sp['min']:.{digits}f}-{sp['max']:.{digits}f})"


def write_markdown(doc: dict[str, Any], path: Path) -> None:
    """``results/latency.md``: the grid, the targets and their verdicts."""
    p, res = doc["params"], doc["results"]
    systems, grid = p["systems"], res["grid"]
    k, workers = p["threads"], p["workers"]
    cpus = doc["machine"]["cpus"] or 1
    lines = [
        "# Scale-out under real latency (`benchmarks/bench_latency.py`)",
        "",
        f"Model latency {p['latency_ms']} ms per call, {MODEL_CALLS_PER_THREAD} calls per "
        f"thread (one side effect each), {k} threads in flight per worker, "
        f"{p['per_slot']} threads per slot, {p['reps']} repetition(s); PostgreSQL, "
        f"commit {doc['machine']['commit']}, {doc['machine']['cpus']} cores, "
        f"load {doc['machine']['load_avg_1m']} at the end, {doc['when']}"
        + (" (quick mode)" if doc["quick"] else "")
        + ".",
        "",
        "Effects/s: median (min-max) over repetitions. Ideal = N*K / (model time + step "
        "time), step time = the system's own time per thread beyond the model's, from its "
        "1 x 1 rounds: " + ", ".join(f"{s} {res['step_ms'][s]} ms" for s in systems) + ". "
        "CPU ceiling = cores / the workers' CPU time per effect: the most effects/s the cores "
        "allow even if PostgreSQL and every other process took none. Machine busy: share of "
        "all cores busy during the round, every process counted.",
        "",
        "| workers N | threads K | system | effects/s | ideal | x ideal | CPU ms/effect (workers) "
        "| CPU ceiling | machine busy |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in workers:
        for s in systems:
            g = grid[s][str(n)]
            lines.append(
                f"| {n} | {k} | {s} | {_fmt(g['effects_per_s'], 2)} | {g['ideal']:.2f} | "
                f"{_fmt(g['of_ideal'], 2)} | {g['cpu_ms_per_effect']['median']:.1f} | "
                f"{1000 * cpus / g['cpu_ms_per_effect']['median']:.1f} | "
                f"{g['machine_busy']['median']:.0%} |"
            )
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    eg = "effectgate"
    if eg in systems:
        worst = min(workers, key=lambda n: grid[eg][str(n)]["of_ideal"]["median"])
        of = grid[eg][str(worst)]["of_ideal"]["median"]
        met = all(grid[eg][str(n)]["of_ideal"]["median"] >= TARGET_OF_IDEAL for n in workers)
        lines.append(
            f"| effectgate >= {TARGET_OF_IDEAL}x the ideal up to {max(workers)} workers x {k} "
            f"threads | lowest {of:.2f}x (at {worst} x {k}); "
            + ", ".join(f"{n}: {grid[eg][str(n)]['of_ideal']['median']:.2f}x" for n in workers)
            + f" | {'met' if met else 'NOT met'} |"
        )
    if eg in systems and "langgraph" in systems:
        ratios = {
            n: grid[eg][str(n)]["effects_per_s"]["median"]
            / grid["langgraph"][str(n)]["effects_per_s"]["median"]
            for n in workers
        }
        met = all(v >= 1.0 for v in ratios.values())
        lines.append(
            "| effectgate never below LangGraph's effects/s (medians) | effectgate/LangGraph "
            + ", ".join(f"{n}: {v:.2f}x" for n, v in ratios.items())
            + f" | {'met' if met else 'NOT met'} |"
        )
    stored, expected = res["effects_stored"], res["effects_expected"]
    lines += [
        "",
        "Side effects read back from the effect files: "
        + ", ".join(
            f"{s} {stored[s]['effects']} of {expected[s]} approved "
            f"({stored[s]['distinct_threads']} distinct threads)"
            for s in systems
        )
        + ".",
        "",
    ]
    path.write_text("\n".join(lines))


def write_plot(doc: dict[str, Any], path: Path) -> bool:
    """``results/latency.png``: effects/s against workers; each system's ideal and CPU ceiling."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        c.log("matplotlib is not installed (the bench extra has it): no plot")
        return False
    p, grid = doc["params"], doc["results"]["grid"]
    workers = p["workers"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"effectgate": "tab:blue", "langgraph": "tab:orange", "effectgate_wide": "tab:green"}
    for s in p["systems"]:
        g = [grid[s][str(n)] for n in workers]
        med = [x["effects_per_s"]["median"] for x in g]
        err = [
            [m - x["effects_per_s"]["min"] for m, x in zip(med, g, strict=True)],
            [x["effects_per_s"]["max"] - m for m, x in zip(med, g, strict=True)],
        ]
        ax.errorbar(workers, med, yerr=err, marker="o", capsize=3, color=colors.get(s),
                    label=LABELS.get(s, s))  # fmt: skip
        ax.plot(workers, [x["ideal"] for x in g], linestyle="--", color=colors.get(s),
                alpha=0.6, label=f"ideal N*K/(model + step), {s}")  # fmt: skip
        cpu_ms = statistics.median(x["cpu_ms_per_effect"]["median"] for x in g)
        cores = doc["machine"]["cpus"] or 1
        ax.axhline(1000 * cores / cpu_ms, linestyle=":", color=colors.get(s), alpha=0.6,
                   label=f"CPU ceiling: {cores} cores / workers' CPU per effect, {s}")  # fmt: skip
    ax.set_xlabel(f"worker processes N ({p['threads']} threads in flight each)")
    ax.set_ylabel("side effects per second")
    ax.set_xticks(workers)
    ax.set_title(f"Scale-out under {p['latency_ms']} ms model latency, PostgreSQL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------- profile


def profile(admin_dsn: str, threads: int) -> str:
    """Where a thread's own time goes (latency 0), each system in this process, one at a time.

    First, unprofiled: ``threads`` threads per system in blocks of 5, the
    systems taking turns block by block: wall and CPU time (``process_time``)
    per thread, median and min-max over blocks. Then ``cProfile`` of
    ``threads`` more threads per system, the timer being this process's CPU
    time, so waits on PostgreSQL do not count and a loaded machine does not
    inflate it; CPU spent in helper threads (a pool's, LangGraph's background
    writes) is charged to whatever the profiled thread was running.
    effectgate runs through its sync API here (``astart``/``aresume`` run the
    same calls in a worker thread).
    """
    import cProfile
    import io
    import pstats

    def top(prof: cProfile.Profile) -> str:
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        text.write("### by cumulative CPU time\n")
        stats.sort_stats("cumulative").print_stats(35)
        text.write("### by own CPU time\n")
        stats.sort_stats("tottime").print_stats(20)
        return text.getvalue()

    base = c.work_dir("latency-profile")
    prefix = f"lat_{secrets.token_hex(4)}"
    urls = _prepare(admin_dsn, prefix)
    out = io.StringIO()

    async def go() -> None:
        effects = EffectFile(base / "effects" / "profile.log")
        eg = _EffectgateRunner(urls["eg"], base / "state", 0.0, effects)
        lg = await _LangGraphRunner.open(urls["lg"], 0.0, effects)

        async def eg_one(tid: str) -> None:
            result = eg.agent.start(c.TASK, thread_id=tid)
            while result.status.value == "waiting_review":
                answers = {p.id: c.APPROVE for p in result.interrupts}
                result = eg.agent.resume(tid, answers=answers)

        runs = {"effectgate": eg_one, "langgraph": lg.one}
        try:
            for name, one in runs.items():
                await one(f"{name}-warm")
            wall: dict[str, list[float]] = {name: [] for name in runs}
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            block = 5
            for b in range(max(1, threads // block)):
                for name in c.rotated(list(runs), b):
                    t0, c0 = time.perf_counter(), time.process_time()
                    for i in range(block):
                        await runs[name](f"{name}-b{b}-{i}")
                    wall[name].append(1000 * (time.perf_counter() - t0) / block)
                    cpu[name].append(1000 * (time.process_time() - c0) / block)
            out.write(f"# One thread at a time, latency 0, blocks of {block}, alternating\n\n")
            for name in runs:
                out.write(
                    f"- {name}: wall {_fmt(c.spread(wall[name], 1))} ms, "
                    f"CPU {_fmt(c.spread(cpu[name], 1))} ms per thread (unprofiled)\n"
                )
            for name, one in runs.items():
                prof = cProfile.Profile(time.process_time)
                prof.enable()
                for i in range(threads):
                    await one(f"{name}-prof-{i}")
                prof.disable()
                out.write(f"\n## {name}: cProfile of {threads} threads\n\n{top(prof)}")
        finally:
            await lg.aclose()
            await eg.aclose()
            effects.close()

    try:
        asyncio.run(go())
    finally:
        _drop(admin_dsn, prefix)
        shutil.rmtree(base, ignore_errors=True)
    return out.getvalue()


# ------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("URLS", "ROOT", "EFFECTS", "INDEX"))
    parser.add_argument("--quick", action="store_true", help="N in {1,2}, K=2, 100 ms, 1 rep")
    parser.add_argument("--workers", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=None, help="K: threads in flight/worker")
    parser.add_argument("--latency-ms", type=float, default=None, help="per model call")
    parser.add_argument("--per-slot", type=int, default=None, help="threads each slot runs (>= 2)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument(
        "--systems", nargs="+", choices=ALL_SYSTEMS, help="default: all three (quick: the two)"
    )
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the effect files")
    parser.add_argument("--profile", action="store_true", help="cProfile one thread of each")
    args = parser.parse_args()
    if args.worker:
        urls, root, effects, index = args.worker
        asyncio.run(_worker(json.loads(urls), Path(root), Path(effects), int(index)))
        return
    if args.quick:
        os.environ[c.QUICK_ENV] = "1"
    q = c.quick()
    dsn = args.dsn or os.environ.get("EFFECTGATE_TEST_POSTGRES") or DEFAULT_DSN
    if args.profile:
        text = profile(dsn, args.per_slot or 20)
        c.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (c.RESULTS_DIR / "latency_profile.txt").write_text(text)
        c.log(f"wrote {c.RESULTS_DIR / 'latency_profile.txt'}")
        return
    params: dict[str, Any] = {
        "systems": args.systems or list(SYSTEMS if q else ALL_SYSTEMS),
        "workers": args.workers or ([1, 2] if q else [1, 2, 4, 8]),
        "threads": args.threads or (2 if q else 10),
        "latency_ms": args.latency_ms if args.latency_ms is not None else (100 if q else 500),
        "per_slot": args.per_slot or (2 if q else 5),
        "reps": args.reps or (1 if q else 3),
        "dsn_database": dsn.rsplit("/", 1)[-1].split("?")[0],
    }
    if params["per_slot"] < 2:
        parser.error("--per-slot must be at least 2 (a slot's rate needs two effects)")
    c.log(
        f"latency: {params['latency_ms']} ms per model call, workers {params['workers']} x "
        f"{params['threads']} threads, {params['per_slot']} per slot, {params['reps']} rep(s)"
    )
    results = run(
        dsn,
        params["systems"],
        params["workers"],
        params["threads"],
        params["latency_ms"] / 1000,
        params["per_slot"],
        params["reps"],
        args.keep,
    )
    path = c.write_result("latency", params, results)
    doc = json.loads(path.read_text())
    write_markdown(doc, c.RESULTS_DIR / "latency.md")
    plotted = write_plot(doc, c.RESULTS_DIR / "latency.png")
    c.log(f"wrote {path}, latency.md" + (", latency.png" if plotted else ""))


if __name__ == "__main__":
    main()
