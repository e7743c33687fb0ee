"""Resume a thread paused at review after 1 vs N (200) tool calls.

For each system and thread length, a template directory holds thread ``t``
paused at the review of its next call (``bench_storage`` leaves the 200-call
ones under ``run_all.py``; missing templates are built here). Each measurement
copies a template to a fresh directory (not timed), then times, in this
process (imports already loaded):

- ``open``: opening the system on the directory (connections, ledger checks);
- ``resume``: approving the pending call, up to the next review interrupt
  (effectgate: ``Agent.resume``, with its lease, recovery scan and status read;
  baseline: ``stream(Command(resume=...))``).

The four (system, length) cases take turns, the order rotating by repeat; the
ratio long/short is paired within each repeat. Target for effectgate: at most
3x from 1 to 200 calls.

Usage: ``python benchmarks/bench_resume.py`` (writes results/resume.json).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import _common as c

SYSTEMS = ["baseline", "effectgate"]


def template(system: str, calls: int) -> Path:
    """The directory of a thread paused at review after ``calls`` approved calls."""
    keep = c.template_dir() or c.work_dir("resume_templates")
    path = keep / f"{system}-{calls}"
    if (path / "checkpoints.sqlite3").exists():
        return path
    c.log(f"  building template {system}-{calls}")
    sys_ = c.SYSTEMS[system](path, c.make_script(calls + 2))
    try:
        sys_.start("t")
        for _ in range(calls):
            sys_.step("t")
    finally:
        sys_.close()
    return path


def _measure(src: Path, system: str, calls: int) -> tuple[float, float]:
    dst = c.work_dir("resume") / "state"
    shutil.copytree(src, dst)
    holder: dict[str, c.System] = {}
    script = c.make_script(calls + 2)

    def open_() -> None:
        holder["s"] = c.SYSTEMS[system](dst, script)

    t_open = c.timed(open_)
    sys_ = holder["s"]
    try:
        t_resume = c.timed(lambda: sys_.step("t"))
        if len(sys_.sink) != 1:
            raise RuntimeError(f"{system}: resume ran {len(sys_.sink)} effects, expected 1")
    finally:
        sys_.close()
        shutil.rmtree(dst.parent, ignore_errors=True)
    return t_open, t_resume


def run(sizes: list[int], repeats: int, names: list[str] = SYSTEMS) -> dict[str, Any]:
    """Time open and resume for every (system, size), interleaved.

    ``names`` are systems in ``_common.SYSTEMS``; the first is the reference.
    """
    cases = [(s, n) for s in names for n in sizes]
    sources = {case: template(*case) for case in cases}
    opened: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    resumed: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for r in range(repeats):
        for case in c.rotated(cases, r):
            t_open, t_resume = _measure(sources[case], *case)
            opened[case].append(t_open)
            resumed[case].append(t_resume)
    out: dict[str, Any] = {}
    lo, hi = sizes
    ref = names[0]
    for s in names:
        total = {
            n: [a + b for a, b in zip(opened[s, n], resumed[s, n], strict=True)] for n in sizes
        }
        out[s] = {
            "open_ms": {str(n): c.spread(opened[s, n], 2) for n in sizes},
            "resume_ms": {str(n): c.spread(resumed[s, n], 2) for n in sizes},
            "open_plus_resume_ms": {str(n): c.spread(total[n], 2) for n in sizes},
            f"ratio_{hi}_over_{lo}": c.spread(
                [b / a for a, b in zip(total[lo], total[hi], strict=True)], 2
            ),
        }
    for s in names[1:]:
        for n in sizes:
            out[f"{s}_over_{ref}_at_{n}"] = c.spread(
                [
                    (so + sr) / (bo + br)
                    for so, sr, bo, br in zip(
                        opened[s, n], resumed[s, n], opened[ref, n], resumed[ref, n], strict=True
                    )
                ],
                2,
            )
    return out


def main() -> None:
    q = c.quick()
    params: dict[str, Any] = {"sizes": [1, 12 if q else 200], "repeats": 2 if q else 7}
    c.log(f"resume: after {params['sizes']} calls")
    results = run(params["sizes"], params["repeats"])
    c.log(f"wrote {c.write_result('resume', params, results)}")


if __name__ == "__main__":
    main()
