"""Shared pieces of the benchmark suite: the two systems, instrumentation, statistics, output.

The two systems run the same offline model (``ScriptedChatModel``), the same
no-op side-effect tool and the same disk:

- ``Baseline``: what a user would otherwise build, LangChain's ``create_agent``
  with ``HumanInTheLoopMiddleware`` and a ``SqliteSaver``, run with
  ``durability="sync"``.
- ``Effectgate``: ``effectgate.open_agent`` with the same tool as an
  IDEMPOTENT ``ToolSpec``, driven through ``Agent.start``/``Agent.resume``.
- ``EffectgateGraph`` (in ``bench_side_effect``): the same compiled graph driven
  directly with ``Command(resume=...)`` (no lease, no status read-back), to
  split the runner's cost from the graph's.

One "step" is one approved side effect: resume with approve → effect → model →
the next review interrupt. The tool does nothing but append to a list, so every
figure is framework and storage overhead.

Durable commits are counted by giving every ``sqlite3`` connection a
``ProbedConnection`` factory (``probed_sqlite()``): it sees each COMMIT (the
ledger's explicit ``COMMIT`` and the saver's ``conn.commit()``), whether the
transaction changed rows (``total_changes``; an empty commit writes no WAL frame
and does no fsync) and the connection's ``synchronous`` level at that moment
(FULL = fsync at commit, NORMAL = none). ``bench_side_effect`` cross-checks the
count against real ``fsync``/``fdatasync`` system calls with ``strace``.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = Path(os.environ.get("EFFECTGATE_BENCH_RESULTS") or BENCH_DIR / "results")
"""Where results go; the test suite points ``EFFECTGATE_BENCH_RESULTS`` at a temp dir."""
SYSTEM_PROMPT = "You are a benchmark agent. Call the tools you are told to call."
TASK = "Record the values."
APPROVE: dict[str, Any] = {"decisions": [{"type": "approve"}], "reviewer": "bench"}
TOOL = "record"
WORK_ENV = "EFFECTGATE_BENCH_WORK"
QUICK_ENV = "EFFECTGATE_BENCH_QUICK"

# --------------------------------------------------------------------- statistics


def quick() -> bool:
    """Whether a smoke run (tests, ``run_all.py --quick``) asked for tiny sizes."""
    return os.environ.get(QUICK_ENV) == "1"


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Median, min and max of ``values`` (and how many), rounded."""
    vals = list(values)
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(vals), digits),
        "min": round(min(vals), digits),
        "max": round(max(vals), digits),
        "n": len(vals),
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by the nearest-rank method; ``None`` if empty."""
    vals = sorted(values)
    if not vals:
        return None
    rank = max(1, min(len(vals), round(q * len(vals) + 0.5)))
    return vals[rank - 1]


def rotated(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` rotated left by ``k``: alternates who goes first, pair by pair."""
    k %= len(items)
    return [*items[k:], *items[:k]]


def timed(fn: Callable[[], Any]) -> float:
    """Run ``fn`` once and return its wall time in milliseconds."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def timed_cpu(fn: Callable[[], Any]) -> tuple[float, float]:
    """Run ``fn`` once; return its wall time and this process's CPU time, in milliseconds.

    CPU time is ``time.process_time``: every thread of this process, user and
    system, so a saver's or an executor's worker threads count; a wait on the
    disk or on other processes does not.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


# ------------------------------------------------------------------ instrumentation

SYNC_FULL = 2


@dataclass
class Probe:
    """What one probed connection saw: commits by kind, and write-lock waits (ms)."""

    label: str
    sync: int = SYNC_FULL
    last_changes: int = 0
    durable: int = 0
    """Commits that wrote rows under ``synchronous`` >= FULL: one WAL fsync each."""
    normal: int = 0
    """Commits that wrote rows under ``synchronous=NORMAL``: no fsync at commit."""
    empty: int = 0
    """Commits of transactions that changed nothing (no WAL frame, no fsync)."""
    lock_waits_ms: list[float] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Commit counts by kind."""
        return {"durable": self.durable, "normal": self.normal, "empty": self.empty}


PROBES: list[Probe] = []
"""Every probe created in this process, in creation order."""

_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class ProbedCursor(sqlite3.Cursor):
    """Times the statement that opens an implicit write transaction (the saver's lock wait)."""

    def _timed(self, run: Callable[[], Any], sql: str) -> Any:
        if self.connection.in_transaction or not sql.lstrip().upper().startswith(_DML):
            return run()
        t0 = time.perf_counter()
        try:
            return run()
        finally:
            conn = self.connection
            assert isinstance(conn, ProbedConnection)
            conn.probe.lock_waits_ms.append((time.perf_counter() - t0) * 1e3)

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self._timed(lambda: super(ProbedCursor, self).execute(sql, parameters), sql)

    def executemany(self, sql: str, seq: Any, /) -> Any:
        return self._timed(lambda: super(ProbedCursor, self).executemany(sql, seq), sql)


class ProbedConnection(sqlite3.Connection):
    """An ``sqlite3.Connection`` that counts commits and times write-lock acquisition."""

    def __init__(self, database: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(database, *args, **kwargs)
        self.probe = Probe(label=Path(str(database)).name)
        self.probe.sync = int(super().execute("PRAGMA synchronous").fetchone()[0])
        PROBES.append(self.probe)

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or ProbedCursor)

    def _committed(self) -> None:
        p = self.probe
        if self.total_changes == p.last_changes:
            p.empty += 1
        elif p.sync >= SYNC_FULL:
            p.durable += 1
        else:
            p.normal += 1
        p.last_changes = self.total_changes

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        head = sql.lstrip()[:32].upper()
        if head.startswith("PRAGMA SYNCHRONOUS") and "=" in head:
            value = head.split("=", 1)[1].strip().rstrip(";")
            levels = {"OFF": 0, "NORMAL": 1, "FULL": 2, "EXTRA": 3}
            self.probe.sync = levels.get(value, int(value) if value.isdigit() else SYNC_FULL)
        if head.startswith("BEGIN IMMEDIATE"):
            t0 = time.perf_counter()
            cur = super().execute(sql, parameters)
            self.probe.lock_waits_ms.append((time.perf_counter() - t0) * 1e3)
            return cur
        if head.startswith(("COMMIT", "END")) and self.in_transaction:
            cur = super().execute(sql, parameters)
            self._committed()
            return cur
        if head.startswith("ROLLBACK"):
            cur = super().execute(sql, parameters)
            self.probe.last_changes = self.total_changes
            return cur
        plain: sqlite3.Cursor = self.cursor().execute(sql, parameters)
        return plain

    def commit(self) -> None:
        was_open = self.in_transaction
        super().commit()
        if was_open:
            self._committed()


@contextmanager
def probed_sqlite() -> Iterator[None]:
    """Make every ``sqlite3.connect`` in this process return a ``ProbedConnection``."""
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", ProbedConnection)
        conn: sqlite3.Connection = real(*args, **kwargs)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = real


# ------------------------------------------------------------------- tool and model


def make_script(n_calls: int) -> dict[str, Any]:
    """A script of ``n_calls`` turns, each asking for one ``record`` call, then a final answer."""
    turns = [
        {
            "say": f"Recording value {k}.",
            "tool_calls": [{"name": TOOL, "args": {"key": f"k{k}", "value": k}}],
        }
        for k in range(n_calls)
    ]
    return {"name": f"bench{n_calls}", "turns": turns, "final": "All values recorded."}


def record_tools(sink: list[str], result_bytes: int = 0) -> tuple[Any, Any]:
    """The same no-op side effect as an IDEMPOTENT ``ToolSpec`` and as a LangChain tool.

    Both append the key to ``sink`` (so a benchmark can check that each approval
    ran exactly one effect) and return a small JSON object, padded with a
    ``blob`` of ``result_bytes`` characters when asked (a large tool result).
    """
    pad = {"blob": "x" * result_bytes} if result_bytes else {}
    from langchain_core.tools import StructuredTool
    from pydantic import BaseModel

    from effectgate.tools import EffectKind, ToolResult, ToolSpec

    class RecordArgs(BaseModel):
        key: str
        value: int

    def effect(args: RecordArgs, ctx: Any) -> ToolResult:
        sink.append(args.key)
        return ToolResult(value={"ok": True, "key": args.key, **pad})

    def lc_effect(key: str, value: int) -> dict[str, Any]:
        sink.append(key)
        return {"ok": True, "key": key, **pad}

    spec = ToolSpec(
        name=TOOL,
        description="Record a value.",
        args_schema=RecordArgs,
        func=effect,
        kind=EffectKind.IDEMPOTENT,
    )
    lc_tool = StructuredTool.from_function(
        lc_effect, name=TOOL, description="Record a value.", args_schema=RecordArgs
    )
    return spec, lc_tool


# ----------------------------------------------------------------------- systems


class System:
    """One agent on one state directory: ``start`` a thread, ``step`` = one approved effect."""

    name = "system"
    result_bytes = 0
    """Size of the tool result's padding (``record_tools``)."""

    def __init__(self, root: Path, script: dict[str, Any], sink: list[str] | None = None) -> None:
        self.root = root
        self.script = script
        self.sink: list[str] = [] if sink is None else sink
        self._first_probe = len(PROBES)
        self.probes: list[Probe] = []

    def _claim_probes(self) -> None:
        # Connections opened while this system was built are its own.
        self.probes = PROBES[self._first_probe :]

    def commits(self) -> dict[str, dict[str, int]]:
        """Commit counts so far by file (``checkpoints``, ``ledger``) and kind."""
        out: dict[str, dict[str, int]] = {}
        for p in self.probes:
            key = p.label.split(".")[0]
            acc = out.setdefault(key, {"durable": 0, "normal": 0, "empty": 0})
            for k, v in p.counts().items():
                acc[k] += v
        return out

    def lock_waits_ms(self) -> list[float]:
        """Every write-lock acquisition time seen on this system's connections (ms)."""
        return [w for p in self.probes for w in p.lock_waits_ms]

    def start(self, thread_id: str) -> None:
        """Start a thread and run it to its first review interrupt."""
        raise NotImplementedError

    def step(self, thread_id: str) -> None:
        """Approve the pending call: effect, model, up to the next interrupt (or the end)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every file."""

    def checkpoint_files(self) -> list[Path]:
        """The SQLite files this system writes (checkpoints, ledger)."""
        raise NotImplementedError


class Baseline(System):
    """``create_agent`` + ``HumanInTheLoopMiddleware`` + ``SqliteSaver``, ``durability="sync"``."""

    name = "baseline"

    def __init__(self, root: Path, script: dict[str, Any], sink: list[str] | None = None) -> None:
        super().__init__(root, script, sink)
        from langchain.agents import create_agent
        from langchain.agents.middleware import HumanInTheLoopMiddleware
        from langgraph.checkpoint.sqlite import SqliteSaver

        from effectgate.models import ScriptedChatModel

        root.mkdir(parents=True, exist_ok=True)
        _, lc_tool = record_tools(self.sink, self.result_bytes)
        self.conn = sqlite3.connect(
            root / "checkpoints.sqlite3", check_same_thread=False, timeout=30.0
        )
        hitl = HumanInTheLoopMiddleware(
            interrupt_on={TOOL: {"allowed_decisions": ["approve", "edit", "reject"]}}
        )
        self.graph = create_agent(
            ScriptedChatModel.from_script(script),
            [lc_tool],
            middleware=[hitl],
            checkpointer=SqliteSaver(self.conn),
            system_prompt=SYSTEM_PROMPT,
        )
        self._claim_probes()

    def _stream(self, value: Any, thread_id: str) -> None:
        cfg: Any = {"configurable": {"thread_id": thread_id}}
        for _ in self.graph.stream(value, cfg, stream_mode="updates", durability="sync"):
            pass

    def start(self, thread_id: str) -> None:
        self._stream({"messages": [{"role": "user", "content": TASK}]}, thread_id)

    def step(self, thread_id: str) -> None:
        from langgraph.types import Command

        self._stream(Command(resume={"decisions": [{"type": "approve"}]}), thread_id)

    def recover(self, thread_id: str) -> None:
        """Continue a thread whose process died mid-step (LangGraph: ``invoke(None)``)."""
        self._stream(None, thread_id)

    def close(self) -> None:
        self.conn.close()

    def checkpoint_files(self) -> list[Path]:
        return [self.root / "checkpoints.sqlite3"]


class Effectgate(System):
    """effectgate's ``Agent`` (thread lease, ledger, review node, effect nodes)."""

    name = "effectgate"

    def __init__(self, root: Path, script: dict[str, Any], sink: list[str] | None = None) -> None:
        super().__init__(root, script, sink)
        from effectgate import open_agent
        from effectgate.models import ScriptedChatModel

        spec, _ = record_tools(self.sink, self.result_bytes)
        self._cm = open_agent(
            root,
            model=ScriptedChatModel.from_script(script),
            tools=[spec],
            system_prompt=SYSTEM_PROMPT,
        )
        self.agent = self._cm.__enter__()
        self._claim_probes()
        self._waiting: dict[str, Any] = {}

    def start(self, thread_id: str) -> None:
        result = self.agent.start(TASK, thread_id=thread_id)
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate start ended {result.status}: {result.error}")
        self._waiting[thread_id] = result.interrupts

    def step(self, thread_id: str) -> None:
        pending = self._waiting.pop(thread_id, None) or self.agent.status(thread_id).interrupts
        # each answer names the review it answers
        result = self.agent.resume(thread_id, answers={p.id: APPROVE for p in pending})
        self._waiting[thread_id] = result.interrupts
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate step ended {result.status}: {result.error}")

    def recover(self, thread_id: str) -> None:
        """Continue a thread after a crash (``Agent.resume`` with no answers)."""
        self.agent.resume(thread_id)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)

    def checkpoint_files(self) -> list[Path]:
        return [self.root / "checkpoints.sqlite3", self.root / "ledger.sqlite3"]


SYSTEMS: dict[str, type[System]] = {
    "baseline": Baseline,
    "effectgate": Effectgate,
}
"""Systems by name; ``bench_side_effect`` adds ``effectgate_graph``."""


# ------------------------------------------------------------------ environment, output


def work_dir(name: str) -> Path:
    """A fresh scratch directory for one benchmark, under ``$EFFECTGATE_BENCH_WORK`` or /tmp."""
    base = os.environ.get(WORK_ENV)
    if base:
        path = Path(base) / name
        path.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="run-", dir=path))
    return Path(tempfile.mkdtemp(prefix=f"effectgate-bench-{name}-"))


def template_dir() -> Path | None:
    """Where benchmarks hand finished threads to each other (only under ``run_all.py``)."""
    base = os.environ.get(WORK_ENV)
    if not base:
        return None
    path = Path(base) / "templates"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Where and with what the numbers were taken."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dists = "effectgate langgraph langgraph-checkpoint langgraph-checkpoint-sqlite langchain"
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "versions": {d: _version(d) for d in [*dists.split(), "langchain-core"]},
        "commit": _git_head(),
    }


def _git_head() -> str | None:
    cmd = ["git", "rev-parse", "--short", "HEAD"]
    try:
        out = subprocess.run(cmd, cwd=BENCH_DIR, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def write_result(name: str, params: dict[str, Any], results: dict[str, Any]) -> Path:
    """Write ``results/<name>.json`` with the machine, the parameters and the results."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    doc = {"bench": name, "when": when, "quick": quick(), "machine": machine_info()}
    doc |= {"params": params, "results": results}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def log(msg: str) -> None:
    """Progress to stderr (stdout stays free for child-process protocols)."""
    print(msg, file=sys.stderr, flush=True)
