"""Prototypes of the proposed fixes, measured against effectgate as it is and the baseline.

Nothing under ``src/`` is changed: each fix is applied here, to one agent
instance, by patching or subclassing, so its gain can be measured before the
change is made for real. The fixes (see benchmarks/README.md for the exact
proposals):

- ``lean_status``: ``Agent._run`` builds the result of a run that stopped at an
  interrupt from the streamed ``__interrupt__`` update instead of ``status()``,
  which re-reads the whole checkpoint (``get_state``) and lists every operation
  of the thread.
- ``lease_normal``: thread-lease writes commit with ``synchronous=NORMAL`` (a
  lease only matters while its holder lives; an OS crash kills every holder),
  and ``recover_in_flight`` reads before it opens a write transaction.
- ``writes_normal``: the saver's ``put_writes`` commits with ``NORMAL``; the
  checkpoint ``put`` that ends the superstep stays FULL and, the WAL being
  append-only, makes those writes durable too. A write lost to an OS crash
  re-runs its task, which the ledger makes harmless.
- ``resume_cache``: ``Agent.resume`` keeps, per thread, the interrupts its last
  run stopped at together with the thread's latest checkpoint id; when that id
  is still the latest (one indexed SQL read), it resumes without ``get_state``
  (which deserializes the whole history). Any mismatch takes the full path.
- ``delta``: the messages channel is a LangGraph ``DeltaChannel`` (beta), so a
  checkpoint stores only new messages, not the whole history.

Since these were measured, ``lease_normal`` and a form of ``lean_status``
(``Agent._run`` builds its result from the stream) have landed in ``src/``;
their prototypes here now apply on top of the real change, so re-running
this script measures the remaining fixes against a faster "effectgate" row.

Part A times each variant per approved side effect, all variants taking turns
step by step (as ``bench_side_effect``), and counts its commits. Part B runs a
long thread with every fix including ``delta`` and reports storage growth,
plus the checks that resume and earlier checkpoints still read back correctly.

Usage: ``python benchmarks/bench_fixes.py`` (writes results/fixes.json).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from types import MethodType
from typing import Annotated, Any, TypedDict

import _common as c
import bench_resume
import bench_side_effect
import bench_storage

_LOCAL = threading.local()


# ------------------------------------------------------------------------- the fixes


def _lean_run(self: Any, thread_id: str, value: Any, *, config: Any = None) -> Any:
    """``Agent._run`` that reads the interrupt from the stream instead of ``status()``."""
    from langgraph.runtime import RunControl

    from effectgate.graph import PendingInterrupt, RunResult, RunStatus

    control = RunControl()
    self._control = control
    pending: list[Any] = []
    try:
        for chunk in self.graph.stream(
            value,
            config or self._config(thread_id),
            stream_mode="updates",
            durability="sync",
            control=control,
        ):
            pending += [
                PendingInterrupt(id=i.id, value=i.value) for i in chunk.get("__interrupt__", ())
            ]
            if self.on_event is not None:
                self.on_event(chunk)
    finally:
        self._control = None
    if not pending:
        return self.status(thread_id)  # done, drained or failed: the rare path keeps the full read
    kinds = {p.kind for p in pending}
    status = (
        RunStatus.WAITING_RECONCILIATION if "reconciliation" in kinds else RunStatus.WAITING_REVIEW
    )
    return RunResult(thread_id=thread_id, status=status, interrupts=pending)


class _LeaseNormalStore:
    """Forwards to the real store; lease transactions commit with ``NORMAL``."""

    def __init__(self, store: Any) -> None:
        self._inner = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def transaction(self, *, durable: bool = True) -> Any:
        return self._inner.transaction(durable=durable and not getattr(_LOCAL, "lease", False))


@contextmanager
def _lease_scope() -> Iterator[None]:
    _LOCAL.lease = True
    try:
        yield
    finally:
        _LOCAL.lease = False


def _apply_lease_normal(ledger: Any) -> None:
    from effectgate.ledger import OpState

    ledger._store = _LeaseNormalStore(ledger._store)
    for name in ("acquire_lease", "renew_lease", "release_lease"):
        real = getattr(ledger, name)

        def wrapped(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            with _lease_scope():
                return _real(*args, **kwargs)

        setattr(ledger, name, wrapped)
    real_recover = ledger.recover_in_flight

    def recover(*, thread_id: str | None = None) -> Any:
        if not ledger.list(thread_id=thread_id, states=[OpState.IN_FLIGHT]):
            return []  # nothing to recover: no write transaction, no write lock
        return real_recover(thread_id=thread_id)

    ledger.recover_in_flight = recover


def _latest_checkpoint_id(saver: Any, thread_id: str) -> str | None:
    with saver.lock:
        row = saver.conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            (thread_id,),
        ).fetchone()
    return None if row is None else str(row[0])


def _apply_resume_cache(agent: Any) -> None:
    """Resume from the interrupts of this process's last run when nothing moved since."""
    from langgraph.types import Command

    full_resume = agent.resume
    saver = agent.graph.checkpointer
    cache: dict[str, tuple[str | None, list[Any]]] = {}

    def fast(thread_id: str, decisions: Any, verdicts: Any) -> Any:
        hit = cache.pop(thread_id, None)
        if hit is None or hit[0] != _latest_checkpoint_id(saver, thread_id):
            return None
        with agent._lease(thread_id):
            agent.ledger.recover_in_flight(thread_id=thread_id)
            answer = agent._resume_map(hit[1], decisions, verdicts)
            return None if answer is None else agent._run(thread_id, Command(resume=answer))

    def resume(thread_id: str, *, decisions: Any = None, verdicts: Any = None) -> Any:
        result = fast(thread_id, decisions, verdicts)
        if result is None:
            result = full_resume(thread_id, decisions=decisions, verdicts=verdicts)
        if result.interrupts:
            cache[thread_id] = (_latest_checkpoint_id(saver, thread_id), list(result.interrupts))
        return result

    agent.resume = resume


def _normal_writes_saver(conn: sqlite3.Connection) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    class NormalWritesSaver(SqliteSaver):
        """``put_writes`` commits with ``NORMAL``; ``put`` stays FULL (and flushes them)."""

        @contextmanager
        def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
            normal = getattr(_LOCAL, "writes", False)
            with self.lock:
                self.setup()
                if normal:
                    self.conn.execute("PRAGMA synchronous = NORMAL")
                cur = self.conn.cursor()
                try:
                    yield cur
                finally:
                    if transaction:
                        self.conn.commit()
                    cur.close()
                    if normal:
                        self.conn.execute("PRAGMA synchronous = FULL")

        def put_writes(self, *args: Any, **kwargs: Any) -> None:
            _LOCAL.writes = True
            try:
                super().put_writes(*args, **kwargs)
            finally:
                _LOCAL.writes = False

    return NormalWritesSaver(conn)


def _delta_state() -> type:
    from langchain_core.messages import AnyMessage
    from langgraph.channels.delta import DeltaChannel
    from langgraph.graph.message import _messages_delta_reducer

    # Functional syntax: with postponed annotations a class body's hints would be
    # strings naming locals that get_type_hints cannot resolve.
    messages = Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]
    DeltaAgentState: type = TypedDict("DeltaAgentState", {"messages": messages})
    return DeltaAgentState


@contextmanager
def _delta_patch() -> Iterator[None]:
    """Build-time only: every graph module's ``AgentState`` becomes the delta variant.

    Nodes are typed ``state: AgentState``; LangGraph reads those hints as the
    node's input schema, so they must name the same state type as the graph.
    """
    from effectgate.graph import _build, _nodes, _review

    state = _delta_state()
    with (
        _patched(_build, "AgentState", state),
        _patched(_nodes, "AgentState", state),
        _patched(_review, "AgentState", state),
    ):
        yield


@contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


# ---------------------------------------------------------------------- the variants


@dataclass(frozen=True)
class Fixes:
    """Which prototype fixes a variant applies."""

    lean_status: bool = False
    lease_normal: bool = False
    writes_normal: bool = False
    resume_cache: bool = False
    delta: bool = False


class Prototype(c.Effectgate):
    """effectgate's ``Agent`` built like ``open_agent``, with some fixes applied."""

    fixes = Fixes()

    def __init__(self, root: Path, script: dict[str, Any], sink: list[str] | None = None) -> None:
        c.System.__init__(self, root, script, sink)
        from langgraph.checkpoint.sqlite import SqliteSaver

        from effectgate._app import StateDir
        from effectgate.graph import Agent
        from effectgate.ledger import SqliteLedger
        from effectgate.models import ScriptedChatModel

        sd = StateDir.open(root)
        spec, _ = c.record_tools(self.sink)
        self.ledger = SqliteLedger(sd.ledger)
        self.conn = sqlite3.connect(sd.checkpoints, check_same_thread=False, timeout=30.0)
        saver = (_normal_writes_saver if self.fixes.writes_normal else SqliteSaver)(self.conn)
        with _delta_patch() if self.fixes.delta else nullcontext():
            self.agent = Agent(
                ScriptedChatModel.from_script(script),
                [spec],
                ledger=self.ledger,
                checkpointer=saver,
                system_prompt=c.SYSTEM_PROMPT,
            )
        if self.fixes.lean_status:
            self.agent._run = MethodType(_lean_run, self.agent)  # type: ignore[method-assign]
        if self.fixes.lease_normal:
            _apply_lease_normal(self.ledger)
        if self.fixes.resume_cache:
            _apply_resume_cache(self.agent)
        self._claim_probes()

    def close(self) -> None:
        self.conn.close()
        self.ledger.close()


def variant(name: str, fixes: Fixes) -> type[Prototype]:
    """A ``Prototype`` subclass applying ``fixes``."""
    return type(f"Proto_{name}", (Prototype,), {"name": name, "fixes": fixes})


EVERY_FIX = Fixes(lean_status=True, lease_normal=True, writes_normal=True, resume_cache=True)
VARIANTS: dict[str, type[c.System]] = {
    "baseline": c.Baseline,
    "effectgate": c.Effectgate,
    "+lean_status": variant("+lean_status", Fixes(lean_status=True)),
    "+lease_normal": variant("+lease_normal", Fixes(lease_normal=True)),
    "+writes_normal": variant("+writes_normal", Fixes(writes_normal=True)),
    "+resume_cache": variant("+resume_cache", Fixes(resume_cache=True)),
    "all_fixes": variant("all_fixes", EVERY_FIX),
    "all_fixes+delta": variant("all_fixes+delta", replace(EVERY_FIX, delta=True)),
}
c.SYSTEMS.update(VARIANTS)
ALL = "all_fixes"
DELTA = "all_fixes+delta"


# ------------------------------------------------------------------------- part B


def check_delta_thread(calls: int) -> dict[str, Any]:
    """Read a long delta thread back: earlier checkpoints, history rules, resume after reopen."""
    from effectgate.graph import history_problems

    src = bench_resume.template(DELTA, calls)
    dst = c.work_dir("fixes_check") / "state"
    shutil.copytree(src, dst)
    system = c.SYSTEMS[DELTA](dst, c.make_script(calls + 2))
    try:
        assert isinstance(system, Prototype)
        graph = system.agent.graph
        cfg: Any = {"configurable": {"thread_id": "t"}}
        latest = list(graph.get_state(cfg).values["messages"])
        history = list(graph.get_state_history(cfg))
        sampled = history[:: max(1, len(history) // 8)]
        prefix_ok = all(
            [m.id for m in s.values.get("messages", [])]
            == [m.id for m in latest][: len(s.values.get("messages", []))]
            for s in sampled
        )
        system.step("t")
        after = system.agent.status("t")
        return {
            "messages_latest": len(latest),
            "expected_messages": 1 + 2 * calls + 1,
            "checkpoints": len(history),
            "sampled_checkpoints_are_prefixes": prefix_ok,
            "history_problems": history_problems(latest),
            "resume_after_reopen_effects": len(system.sink),
            "status_after_resume": after.status.value,
        }
    finally:
        system.close()
        shutil.rmtree(dst.parent, ignore_errors=True)


def part_b(calls: int, repeats: int) -> dict[str, Any]:
    """Storage growth and resume scaling with every fix, plus read-back checks."""
    c.log(f"fixes: storage over a {calls}-call thread ({DELTA} vs baseline)")
    storage, times = bench_storage.run(calls, ["baseline", DELTA])
    q = max(1, calls // 4)
    pairs = [a / b for a, b in zip(times[DELTA], times["baseline"], strict=True)]
    storage["over_baseline_time"] = {
        "first_quarter": c.spread(pairs[:q]),
        "last_quarter": c.spread(pairs[-q:]),
    }
    c.log("fixes: resume after 1 vs N calls")
    resume = bench_resume.run([1, calls], repeats, ["baseline", DELTA])
    c.log("fixes: read-back checks")
    return {"storage": storage, "resume": resume, "checks": check_delta_thread(calls)}


def main() -> None:
    q = c.quick()
    params: dict[str, Any] = {
        "repeats": 1 if q else 3,
        "steps": 3 if q else 30,
        "warmup": 1 if q else 5,
        "commit_steps": 3 if q else 8,
        "long_thread_calls": 12 if q else 200,
        "resume_repeats": 2 if q else 5,
        "variants": list(VARIANTS),
    }
    names = list(VARIANTS)
    c.log("fixes: time per side effect (interleaved)")
    results: dict[str, Any] = bench_side_effect.part_time(
        params["repeats"], params["steps"], params["warmup"], names
    )
    c.log("fixes: commits (probed)")
    results["commits_per_effect"] = bench_side_effect.part_commits(params["commit_steps"], names)
    results["long_thread"] = part_b(params["long_thread_calls"], params["resume_repeats"])
    c.log(f"wrote {c.write_result('fixes', params, results)}")


if __name__ == "__main__":
    main()
