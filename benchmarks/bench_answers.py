"""What the answer protocol's own checks cost per review, reported on their own.

The answer protocol (``effectgate.answers``, docs/answers.md) adds checks that
plain LangGraph does not make when a review is answered:

- **binding**: every answer names what it answers (an interrupt id, or an
  operation id and intent hash) and is checked against the review it was
  given for (``answers.resolve``, ``check_review_answer``), and a review
  already decided in the ledger is not shown again (``is_decided``);
- **idempotency**: the review node reads back a decision already recorded
  (``recorded_decision``), so a replay or a repeated answer never decides twice;
- **refusal records**: an answer that contradicts a recorded decision is
  refused, and the refusal is written to the ledger.

Part A, the checks inside an ordinary approved step: the functions above are
wrapped with a wall-clock timer (outermost call only, so a check calling
another is counted once) while one agent runs ``steps`` approved side effects
(the same scripted model and no-op tool as ``bench_side_effect``). Reported:
their time per review, the whole step's time, and their share of it.

Part B, the two answers that run nothing: after a step, the same answer sent
again for the review just closed (the recorded outcome is returned,
``already_decided``), and a contradicting one (reject after approve: refused
with ``DecisionError``, the refusal written to the ledger). Each is timed as a
whole ``Agent.resume`` call, beside ``Agent.status`` on the same thread (what a
client reads anyway) and the approved step itself.

Usage: ``python benchmarks/bench_answers.py`` (writes results/answers.json).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import _common as c

REJECT: dict[str, Any] = {"decisions": [{"type": "reject", "message": "no"}], "reviewer": "bench"}

_CHECKS: list[tuple[str, str]] = [
    # (module, function): every place the agent and its nodes reach the protocol
    ("effectgate.graph._agent", "answer_protocol.resolve"),
    ("effectgate.graph._agent", "answer_protocol.is_decided"),
    ("effectgate.graph._agent", "check_review_answer"),
    ("effectgate.graph._nodes", "check_review_answer"),
    ("effectgate.graph._review_prepare", "recorded_decision"),
    ("effectgate.graph._review_decide", "check_decision_allowed"),
]


class CheckTimer:
    """Wall time spent in the answer protocol's checks, outermost calls only."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1
                self._depth -= 1

        return timed

    def install(self) -> None:
        import importlib

        for module_name, dotted in _CHECKS:
            owner: Any = importlib.import_module(module_name)
            *path, name = dotted.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = getattr(owner, name)
            setattr(owner, name, self._wrap(original))
            self._undo.append(lambda o=owner, n=name, f=original: setattr(o, n, f))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def part_checks(steps: int, warmup: int) -> dict[str, Any]:
    """Time the checks inside ``steps`` ordinary approved steps (one agent, one thread)."""
    root = c.work_dir("answers") / "checks"
    system = c.SYSTEMS["effectgate"](root, c.make_script(warmup + steps + 2))
    timer = CheckTimer()
    step_ms: list[float] = []
    check_ms: list[float] = []
    try:
        system.start("t")
        for _ in range(warmup):
            system.step("t")
        timer.install()
        for _ in range(steps):
            before = timer.seconds
            step_ms.append(c.timed(lambda: system.step("t")))
            check_ms.append((timer.seconds - before) * 1e3)
    finally:
        timer.uninstall()
        system.close()
    if len(system.sink) != warmup + steps:
        raise RuntimeError(f"{len(system.sink)} effects for {warmup + steps} steps")
    return {
        "step_ms": c.spread(step_ms),
        "checks_ms_per_review": c.spread(check_ms),
        "checks_share_of_step": c.spread([a / b for a, b in zip(check_ms, step_ms, strict=True)]),
        "check_calls_per_review": round(timer.calls / steps, 2),
    }


def part_repeats(rounds: int) -> dict[str, Any]:
    """Time a repeated answer and a refused one, beside ``status`` and the step itself."""
    from effectgate.errors import DecisionError

    root = c.work_dir("answers") / "repeats"
    system = c.SYSTEMS["effectgate"](root, c.make_script(rounds + 3))
    agent: Any = system.agent  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {"step": [], "status": [], "repeat": [], "refusal": []}
    try:
        system.start("t")
        for _ in range(rounds):
            answered = agent.status("t").interrupts[0].id
            times["step"].append(c.timed(lambda: system.step("t")))
            times["status"].append(c.timed(lambda: agent.status("t")))

            def repeat(i: str = answered) -> None:
                if not agent.resume("t", answers={i: c.APPROVE}).already_decided:
                    raise RuntimeError("a repeated answer was not reported as already decided")

            times["repeat"].append(c.timed(repeat))

            def refuse(i: str = answered) -> None:
                try:
                    agent.resume("t", answers={i: REJECT})
                except DecisionError:
                    return
                raise RuntimeError("a contradicting answer was not refused")

            times["refusal"].append(c.timed(refuse))
    finally:
        system.close()
    if len(system.sink) != rounds:
        raise RuntimeError(f"{len(system.sink)} effects for {rounds} approved steps")
    return {name: c.spread(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    q = c.quick()
    parser.add_argument("--steps", type=int, default=6 if q else 60)
    parser.add_argument("--rounds", type=int, default=4 if q else 30)
    args = parser.parse_args()
    params = {"steps": args.steps, "warmup": 5, "rounds": args.rounds}
    c.log(f"answers: the protocol's checks over {args.steps} steps, {args.rounds} repeats/refusals")
    results = {
        "checks": part_checks(args.steps, 5),
        "answers_that_run_nothing": part_repeats(args.rounds),
    }
    c.log(f"wrote {c.write_result('answers', params, results)}")


if __name__ == "__main__":
    main()
