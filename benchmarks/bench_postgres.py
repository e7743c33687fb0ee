"""Side effects per second with 1, 2, 4 and 8 worker processes on PostgreSQL and SQLite.

Three systems, distinct threads per worker:

- ``langgraph_pg``: plain LangGraph, ``create_agent`` + ``HumanInTheLoopMiddleware``
  + ``PostgresSaver`` on a ``psycopg_pool`` pool, ``durability="sync"``;
- ``effectgate_pg``: ``open_agent(..., store=<url>)``: ``PostgresLedger`` and
  ``StepDurablePostgresSaver`` (thread lease, review node, ledger claim and result);
- ``effectgate_sqlite``: ``open_agent`` on one shared state directory (the
  embedded default: one ledger file and one checkpoint file for every worker).

The PostgreSQL systems each get a fresh schema of one scratch database.

Same scripted model, same no-op ``record`` tool, same step as the other
benchmarks (``_common``): one step is one approved side effect. Each worker
process opens its system, says ready, and per round waits for a common go,
then runs a fresh thread: start plus ``M`` approved effects. Per round the
rate is all effects over the time from the go to the last worker's end; the
systems alternate round by round. Reported: median and min-max over rounds.

What limits scaling is measured too: per round, each worker's own CPU time
(``time.process_time``), the whole machine's busy CPU from ``/proc/stat``
(every process: workers, PostgreSQL backends, other users) and the 1-minute
load average. ``cpu_ms_per_effect`` is the workers' CPU time per effect;
``machine_busy`` the fraction of all cores busy during the round.

The server is ``EFFECTGATE_TEST_POSTGRES`` (default the local one); a scratch
database is created and dropped.

Usage: ``python benchmarks/bench_postgres.py [--workers 1 2 4 8]`` (writes results/postgres.json).

``--count`` instead runs each PostgreSQL system in this process, one worker,
and counts per side effect the statements psycopg sends, the round trips
(a pipeline's statements share one), the ``COMMIT``s, and where the time
goes (``cProfile`` of the steps, main thread, and the client's CPU time);
it writes ``results/postgres_roundtrips.json``.

``--paired`` runs plain LangGraph and effectgate on PostgreSQL in this
process, one thread each, and times their effects alternately (the order
rotates every round): wall time and this process's CPU time
(``time.process_time``) per effect, median and min-max over the pairs, and
the median of the per-pair ratios; it writes ``results/postgres_paired.json``.
Paired, a load spike hits both systems alike. A third system takes turns
with them: ``protocol_floor`` (``ProtocolFloor``), the least any ledger that
keeps effectgate's guarantees must add per effect on PostgreSQL, by raw
psycopg: three transactions of one round trip each.
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

SYSTEMS = ["langgraph_pg", "effectgate_pg", "effectgate_sqlite"]


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
    """effectgate's ``Agent`` with ``store=<url>`` (PostgreSQL), or ``None`` (SQLite files)."""

    name = "effectgate_pg"

    def __init__(self, url: str | None, root: Path, script: dict[str, Any]) -> None:
        super().__init__(root, script)
        from effectgate import open_agent
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
        self.pending: dict[str, Any] = {}

    def start(self, thread_id: str) -> None:
        result = self.agent.start(c.TASK, thread_id=thread_id)
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate start ended {result.status}: {result.error}")
        self.pending[thread_id] = result.interrupts

    def step(self, thread_id: str) -> None:
        # Each answer names the review it answers. The pending reviews come
        # with the previous run's result, as in a worker's loop; no extra
        # status read (the LangGraph client reads nothing before resuming).
        pending = self.pending.pop(thread_id, None)
        if pending is None:
            pending = self.agent.status(thread_id).interrupts
        result = self.agent.resume(thread_id, answers={p.id: c.APPROVE for p in pending})
        if result.status.value not in ("waiting_review", "done"):
            raise RuntimeError(f"effectgate step ended {result.status}: {result.error}")
        self.pending[thread_id] = result.interrupts

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


class ProtocolFloor:
    """The ledger writes one approved side effect cannot do without, by raw psycopg.

    Per effect, three transactions, each ``BEGIN``, its statements and
    ``COMMIT`` in one pipeline (one round trip):

    1. the review: the operation row, its approval and an event, with
       ``synchronous_commit = off`` (as effectgate's review record; a lost
       review is asked again);
    2. the claim: ``UPDATE ... WHERE state = 'approved' AND attempt = 0``
       (the conditional update whose attempt number is the fencing token)
       and an event, durable: it must be on disk before the tool runs;
    3. the result: ``UPDATE ... WHERE attempt = 1 AND state = 'running'``
       with the receipt, and an event, durable.

    No lease, no reads, no checkpoint, no model, no tool: what is left when
    every check a crash-safe dispatch makes is folded into its writes. Its
    time over LangGraph's per effect is the smallest overhead effectgate's
    protocol could have here.
    """

    name = "protocol_floor"

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            "CREATE TABLE floor_ops (id text PRIMARY KEY, thread text, args jsonb, "
            "state text, attempt int, receipt jsonb);"
            "CREATE TABLE floor_approvals (op text, decision text, at timestamptz);"
            "CREATE TABLE floor_events (op text, kind text, at timestamptz, detail jsonb)"
        )
        self.n = 0

    def start(self, thread_id: str) -> None:
        """Nothing to start: the floor has no thread state."""

    def step(self, thread_id: str) -> None:
        """The three transactions of one approved side effect."""
        self.n += 1
        op = f"{thread_id}:{self.n}"
        conn = self.conn
        with conn.pipeline():
            conn.execute("BEGIN")
            conn.execute("SET LOCAL synchronous_commit = off")
            conn.execute(
                "INSERT INTO floor_ops VALUES (%s, %s, %s, 'approved', 0, NULL)",
                (op, thread_id, '{"label": "x"}'),
            )
            conn.execute("INSERT INTO floor_approvals VALUES (%s, 'approve', now())", (op,))
            conn.execute("INSERT INTO floor_events VALUES (%s, 'approved', now(), '{}')", (op,))
            conn.execute("COMMIT")
        for update, kind in (
            ("state = 'running', attempt = 1 WHERE id = %s AND state = 'approved' "
             "AND attempt = 0", "claimed"),
            ("state = 'succeeded', receipt = '{\"ok\": true}' WHERE id = %s "
             "AND attempt = 1 AND state = 'running'", "succeeded"),
        ):  # fmt: skip
            with conn.pipeline():
                conn.execute("BEGIN")
                conn.execute(f"UPDATE floor_ops SET {update}", (op,))
                conn.execute("INSERT INTO floor_events VALUES (%s, %s, now(), '{}')", (op, kind))
                conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def _open(system: str, url: str, root: Path, calls: int) -> Any:
    if system == "protocol_floor":
        return ProtocolFloor(url)
    script = c.make_script(calls + 2)
    if system == "langgraph_pg":
        return LangGraphPg(url, script)
    return EffectgatePg(None if system == "effectgate_sqlite" else url, root, script)


def _machine_busy() -> tuple[int, int]:
    """``(busy, total)`` jiffies of all cores since boot, from ``/proc/stat`` ((0, 0) elsewhere)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


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
        t0, cpu0 = time.monotonic(), time.process_time()
        sys_.start(f"{thread}-r{r}")
        for _ in range(calls):
            sys_.step(f"{thread}-r{r}")
        t1, cpu1 = time.monotonic(), time.process_time()
        tmp = sync / f"partial-{r}-{thread}"
        report = {"t0": t0, "t1": t1, "cpu_s": cpu1 - cpu0, "effects": len(sys_.sink) - before}
        tmp.write_text(json.dumps(report))
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

    def round(self, r: int) -> dict[str, float]:
        """Run round ``r``; return its rate (effects/s) and what it cost in CPU."""
        import os

        busy0, total0 = _machine_busy()
        go_at = time.monotonic()
        (self.sync / f"go-{r}").touch()
        while len(list(self.sync.glob(f"report-{r}-*.json"))) < self.workers:
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a {self.system} worker died: {self.errors()}")
            time.sleep(0.005)
        reports = [json.loads(f.read_text()) for f in self.sync.glob(f"report-{r}-*.json")]
        busy1, total1 = _machine_busy()
        wall = max(rep["t1"] for rep in reports) - go_at
        effects = sum(rep["effects"] for rep in reports)
        return {
            "rate": effects / wall,
            "wall_ms_per_effect": 1000 * wall / effects,
            "cpu_ms_per_effect": 1000 * sum(rep["cpu_s"] for rep in reports) / effects,
            "machine_busy": (busy1 - busy0) / (total1 - total0) if total1 > total0 else -1.0,
            "load_1m": os.getloadavg()[0],
        }

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
    costs: dict[tuple[str, int], list[dict[str, float]]] = {}
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
                        measured = groups[s].round(r)
                        rates.setdefault((s, n), []).append(measured["rate"])
                        costs.setdefault((s, n), []).append(measured)
                    c.log(f"  {n} worker(s), round {r + 1}/{rounds}: " + ", ".join(
                        f"{s} {rates[s, n][-1]:.1f}/s" for s in SYSTEMS))  # fmt: skip
            finally:
                for g in groups.values():
                    g.close()
    out: dict[str, Any] = {
        s: {str(n): c.spread(rates[s, n], 1) for n in worker_counts} for s in SYSTEMS
    }
    out["cost"] = {
        s: {
            str(n): {
                key: c.spread([m[key] for m in costs[s, n]], 2)
                for key in ("wall_ms_per_effect", "cpu_ms_per_effect", "machine_busy", "load_1m")
            }
            for n in worker_counts
        }
        for s in SYSTEMS
    }
    out["scaling_over_one_worker"] = {
        s: {
            str(n): round(
                c.percentile(rates[s, n], 0.5) / c.percentile(rates[s, worker_counts[0]], 0.5),  # type: ignore[operator]
                2,
            )
            for n in worker_counts
        }
        for s in SYSTEMS
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


class _Counter:
    """Counts what psycopg sends while installed: statements by first word, round trips.

    Round trips are counted at two levels. In the client (``round_trips``):
    a statement outside a pipeline (``Cursor.execute``/``executemany``), a
    command psycopg sends itself (``BEGIN``/``COMMIT``/``ROLLBACK`` of
    ``Connection.transaction()``, through ``_exec_command``) and a pipeline's
    sync are one each; a pipelined statement is none. By source
    (``by_source``): the pool the connection came from (``effectgate-ledger``,
    ``effectgate-checkpoints``, or the baseline's unnamed one) and the
    statement's first words. On the wire (``_WireCounter``): every request
    the client sends after the server answered, whatever sent it (flush
    requests inside a pipeline, pool checks, anything the client-side
    wrappers miss).
    """

    def __init__(self) -> None:
        self.statements: dict[str, int] = {}
        self.round_trips = 0
        self.texts: dict[str, int] = {}
        self.by_source: dict[str, int] = {}
        self.on = False

    def reset(self) -> None:
        self.statements, self.texts, self.by_source, self.round_trips = {}, {}, {}, 0

    def see(self, query: Any, in_pipeline: bool, conn: Any = None) -> None:
        if not self.on:
            return
        if isinstance(query, bytes):
            text = query.decode()
        else:
            text = query.as_string(None) if hasattr(query, "as_string") else str(query)
        text = " ".join(text.split())
        word = (text.split(" ", 1)[0] or "(empty)").upper()
        self.statements[word] = self.statements.get(word, 0) + 1
        self.texts[text[:90]] = self.texts.get(text[:90], 0) + 1
        if not in_pipeline:
            self.round_trips += 1
            self._source(conn, " ".join(text.split(" ", 3)[:3])[:60] or "(empty query)")

    def synced(self, conn: Any = None) -> None:
        if self.on:
            self.round_trips += 1
            self._source(conn, "pipeline sync")

    def _source(self, conn: Any, what: str) -> None:
        pool = getattr(getattr(conn, "_pool", None), "name", None) or "?"
        key = f"{pool}: {what}"
        self.by_source[key] = self.by_source.get(key, 0) + 1


class _WireCounter:
    """A TCP forwarder that counts round trips on the wire: client bursts after an answer.

    Each forwarded connection is one thread that waits on both sockets; a
    chunk from the client counts as a new round trip when the last bytes
    that moved went from the server to the client (or nothing moved yet).
    So a pipeline of many statements and its sync is one trip, and every
    request psycopg sends on its own (a statement, ``BEGIN``, ``COMMIT``, a
    pool check's empty query, a pipeline's flush request) is one.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self.target = target
        self.round_trips = 0
        self.by_request: dict[str, int] = {}
        """Round trips by what the request starts with: message types, first statement."""
        self.on = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()

    def _forward(self, client: Any, server: Any) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        last_from_client = False
        try:
            while True:
                for key, _ in sel.select():
                    src, dst = key.fileobj, key.data
                    chunk = src.recv(65536)  # type: ignore[union-attr]
                    if not chunk:
                        return
                    if src is client:
                        if not last_from_client and self.on:
                            what = _request(chunk)
                            with self._lock:
                                self.round_trips += 1
                                self.by_request[what] = self.by_request.get(what, 0) + 1
                        last_from_client = True
                    else:
                        last_from_client = False
                    dst.sendall(chunk)
        except OSError:
            return
        finally:
            sel.close()
            client.close()
            server.close()

    def url(self, dsn: str) -> str:
        """``dsn`` pointed at this forwarder (same user, database, options)."""
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
        parts.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **parts)

    def close(self) -> None:
        self._listener.close()


def _request(chunk: bytes) -> str:
    """Name a client request: its message types (``Q`` query, ``P`` parse, ``H`` flush, ...)
    and the first statement's first words."""
    kinds, text, i = [], "", 0
    while i + 5 <= len(chunk) and len(kinds) < 40:
        kind = chr(chunk[i])
        length = int.from_bytes(chunk[i + 1 : i + 5], "big")
        body = chunk[i + 5 : i + 1 + length]
        if not text and kind == "Q":
            text = body.split(b"\0", 1)[0].decode(errors="replace")
        elif not text and kind == "P":
            text = body.split(b"\0", 2)[1].decode(errors="replace") if b"\0" in body else ""
        kinds.append(kind)
        i += 1 + length
    words = " ".join(" ".join(text.split()).split(" ", 3)[:3])[:50]
    return f"{''.join(kinds)[:20]} {words or '(no statement)'}"


def _install(counter: _Counter) -> None:
    """Wrap ``Cursor.execute``/``executemany``, ``_exec_command`` and the pipeline's sync."""
    import psycopg

    def wrap(cls: Any, name: str) -> None:
        original = getattr(cls, name)

        def run(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            counter.see(query, self.connection._pipeline is not None, self.connection)
            return original(self, query, *args, **kwargs)

        setattr(cls, name, run)

    wrap(psycopg.Cursor, "execute")
    wrap(psycopg.Cursor, "executemany")
    original_command = psycopg.Connection._exec_command

    def command(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counter.see(query, self._pipeline is not None, self)
        return (yield from original_command(self, query, *args, **kwargs))

    psycopg.Connection._exec_command = command  # type: ignore[method-assign]
    original_exit = psycopg.Pipeline.__exit__

    def pipeline_exit(self: Any, *exc: Any) -> Any:
        if self._conn._pipeline is self and self.level == 1:
            counter.synced(self._conn)
        return original_exit(self, *exc)

    psycopg.Pipeline.__exit__ = pipeline_exit  # type: ignore[method-assign]


def count(admin_dsn: str, steps: int) -> dict[str, Any]:
    """Statements, round trips and commits per side effect, and a profile, per PG system."""
    import cProfile
    import pstats

    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from effectgate.testing.postgres import scratch_database, with_search_path

    counter = _Counter()
    _install(counter)
    parts = conninfo_to_dict(admin_dsn)
    wire = _WireCounter((str(parts.get("host") or "127.0.0.1"), int(parts.get("port") or 5432)))
    out: dict[str, Any] = {}
    with scratch_database(admin_dsn) as db:
        for s in ("langgraph_pg", "effectgate_pg"):
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "count_{s}"')
            url = with_search_path(wire.url(db), f"count_{s}")
            sys_ = _open(s, url, c.work_dir("pgcount"), steps + 3)
            try:
                sys_.start("warm")
                sys_.step("warm")  # first-call costs (prepared plans, imports) out of the count
                counter.reset()
                wire.round_trips, wire.by_request = 0, {}
                counter.on = wire.on = True
                prof = cProfile.Profile()
                t0, cpu0 = time.perf_counter(), time.process_time()
                prof.enable()
                for _ in range(steps):
                    sys_.step("warm")
                prof.disable()
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                counter.on = wire.on = False
            finally:
                sys_.close()
            stats = pstats.Stats(prof)
            top = sorted(
                stats.stats.items(),  # type: ignore[attr-defined]
                key=lambda kv: kv[1][3],
                reverse=True,
            )[:25]
            out[s] = {
                "steps": steps,
                "wall_ms_per_effect": round(1000 * wall / steps, 2),
                "client_cpu_ms_per_effect_profiled": round(1000 * cpu / steps, 2),
                "statements_per_effect": round(sum(counter.statements.values()) / steps, 2),
                "round_trips_per_effect": round(counter.round_trips / steps, 2),
                "round_trips_per_effect_on_the_wire": round(wire.round_trips / steps, 2),
                "round_trips_on_the_wire_by_request_per_effect": {
                    k: round(v / steps, 2)
                    for k, v in sorted(wire.by_request.items(), key=lambda kv: (-kv[1], kv[0]))
                },
                "round_trips_by_source_per_effect": {
                    k: round(v / steps, 2)
                    for k, v in sorted(counter.by_source.items(), key=lambda kv: (-kv[1], kv[0]))
                },
                "by_kind_per_effect": {
                    k: round(v / steps, 2) for k, v in sorted(counter.statements.items())
                },
                "statements": {
                    k: round(v / steps, 2)
                    for k, v in sorted(counter.texts.items(), key=lambda kv: -kv[1])
                },
                "profile_top_cumulative_ms_per_effect": {
                    f"{Path(file).name}:{line}:{fn}": round(1000 * row[3] / steps, 2)
                    for (file, line, fn), row in top
                },
            }
            c.log(
                f"  {s}: {out[s]['wall_ms_per_effect']} ms, "
                f"{out[s]['statements_per_effect']} statements, "
                f"{out[s]['round_trips_per_effect']} round trips per effect "
                f"({out[s]['round_trips_per_effect_on_the_wire']} on the wire)"
            )
    wire.close()
    return out


def paired(admin_dsn: str, pairs: int) -> dict[str, Any]:
    """Per-effect wall and CPU time of both PG systems, alternating effect by effect."""
    import os

    import psycopg

    from effectgate.testing.postgres import scratch_database, with_search_path

    names = ("langgraph_pg", "effectgate_pg", "protocol_floor")
    wall: dict[str, list[float]] = {s: [] for s in names}
    cpu: dict[str, list[float]] = {s: [] for s in names}
    with scratch_database(admin_dsn) as db:
        systems: dict[str, Any] = {}
        try:
            for s in names:
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute(f'CREATE SCHEMA "paired_{s}"')
                url = with_search_path(db, f"paired_{s}")
                systems[s] = _open(s, url, c.work_dir("pgpaired"), pairs + 3)
                systems[s].start("t")
                systems[s].step("t")  # first-call costs (prepared plans, imports) out
            for i in range(pairs):
                for s in c.rotated(names, i):
                    t0, cpu0 = time.perf_counter(), time.process_time()
                    systems[s].step("t")
                    wall[s].append(1000 * (time.perf_counter() - t0))
                    cpu[s].append(1000 * (time.process_time() - cpu0))
        finally:
            for system in systems.values():
                system.close()
    out: dict[str, Any] = {
        s: {"wall_ms": c.spread(wall[s], 2), "cpu_ms": c.spread(cpu[s], 2)} for s in names
    }
    out["ratio_effectgate_over_langgraph"] = {
        key: c.spread([e / g for e, g in zip(v["effectgate_pg"], v["langgraph_pg"], strict=True)])
        for key, v in (("wall", wall), ("cpu", cpu))
    }
    out["ratio_floor_over_langgraph"] = {
        "wall": c.spread(
            [f / g for f, g in zip(wall["protocol_floor"], wall["langgraph_pg"], strict=True)]
        )
    }
    out["load_1m_after"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--worker", nargs=6, metavar=("SYSTEM", "URL", "DIR", "THREAD", "CALLS", "SYNC")
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--count", action="store_true", help="count round trips, one worker")
    parser.add_argument("--paired", action="store_true", help="time both PG systems, alternating")
    args = parser.parse_args()
    if args.worker:
        s, url, d, t, n, sync = args.worker
        child_worker(s, url, Path(d), t, int(n), Path(sync))
        return
    import os

    from effectgate.testing.postgres import DEFAULT_DSN, ENV_DSN

    q = c.quick()
    if args.count:
        steps = args.calls or (5 if q else 30)
        c.log("postgres: statements and round trips per side effect, one worker")
        counted = count(os.environ.get(ENV_DSN) or DEFAULT_DSN, steps)
        c.log(f"wrote {c.write_result('postgres_roundtrips', {'steps': steps}, counted)}")
        return
    if args.paired:
        pairs = args.calls or (5 if q else 40)
        c.log("postgres: LangGraph and effectgate alternating, one thread each, in this process")
        timed_pairs = paired(os.environ.get(ENV_DSN) or DEFAULT_DSN, pairs)
        c.log(
            "  effectgate/langgraph per effect: wall "
            f"{timed_pairs['ratio_effectgate_over_langgraph']['wall']}, "
            f"cpu {timed_pairs['ratio_effectgate_over_langgraph']['cpu']}; "
            f"protocol floor/langgraph {timed_pairs['ratio_floor_over_langgraph']['wall']}"
        )
        c.log(f"wrote {c.write_result('postgres_paired', {'pairs': pairs}, timed_pairs)}")
        return
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
