"""The CLI driving a library-built agent with a custom tool, through ``--agent``."""

from __future__ import annotations

import json
from pathlib import Path

from effectgate import StateDir, open_agent
from effectgate.graph import RunStatus
from tests.cli.conftest import eg
from tests.conversations import _custom_agent

AGENT = "tests.conversations._custom_agent:build"
ROOT = Path(__file__).resolve().parents[2]


def _bells(sd: StateDir) -> list[str]:
    return sorted(p.read_text() for p in (sd.workspace / "bells").glob("*.txt"))


def test_a_library_thread_with_a_custom_tool_from_pending_to_done(state_dir: StateDir) -> None:
    recipe = _custom_agent.build(state_dir)
    with open_agent(
        state_dir, model=recipe.model or "", tools=recipe.tools, policy=recipe.policy
    ) as agent:
        waiting = agent.start(_custom_agent.TASK, thread_id="b")
    assert waiting.status is RunStatus.WAITING_REVIEW
    sd = ["--state-dir", str(state_dir.root)]

    # Without --agent the CLI cannot run ring_bell: it says so, and how to provide it.
    pending = eg("pending", *sd, cwd=ROOT)
    assert pending.code == 0, pending.stderr
    assert "nothing is waiting" not in pending.stdout
    assert "tool ring_bell" in pending.stdout and "--agent" in pending.stdout
    listed = json.loads(eg("threads", *sd, "--json", cwd=ROOT).stdout)["threads"]
    assert [(t["thread_id"], t["status"]) for t in listed] == [("b", "incomplete")]
    assert "tool ring_bell" in listed[0]["why"]
    refused = eg("resume", "--thread", "b", "--approve", "all", *sd, cwd=ROOT)
    assert refused.code == 2 and "ring_bell" in refused.stderr, refused.stderr
    assert "--agent MODULE:FACTORY" in refused.stderr
    assert not (state_dir.workspace / "bells").exists()

    # With --agent (no answer on a closed stdin): it waits at the review, and remembers.
    loaded = eg("resume", "--thread", "b", "--agent", AGENT, *sd, cwd=ROOT)
    assert loaded.code == 4, (loaded.stdout, loaded.stderr)
    shown = json.loads(eg("pending", *sd, "--json", cwd=ROOT).stdout)
    (entry,) = shown["threads"]
    assert entry["status"] == "waiting_review"
    assert [a["name"] for a in entry["interrupts"][0]["value"]["action_requests"]] == ["ring_bell"]

    # No --agent needed any more: resume approves and finishes.
    done = eg("resume", "--thread", "b", "--approve", "all", *sd, "--json", cwd=ROOT)
    assert done.code == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["status"] == "done"
    assert _bells(state_dir) == ["release"]
    assert "nothing is waiting" in eg("pending", *sd, cwd=ROOT).stdout
    listed = json.loads(eg("threads", *sd, "--json", cwd=ROOT).stdout)["threads"]
    assert [(t["thread_id"], t["status"]) for t in listed] == [("b", "done")]
    again = eg("resume", "--thread", "b", *sd, cwd=ROOT)  # done: nothing runs again
    assert again.code == 0 and _bells(state_dir) == ["release"]


def test_a_follow_up_from_the_cli_and_a_bad_agent_spec(state_dir: StateDir) -> None:
    """A follow-up re-proposing turn 1's effect is flagged; --supersede answers it unrun."""
    sd = ["--state-dir", str(state_dir.root)]
    start = eg("run", _custom_agent.TASK, "--thread", "b", "--agent", AGENT, "--approve", "all",
               *sd, cwd=ROOT)  # fmt: skip
    assert start.code == 0, (start.stdout, start.stderr)
    again = eg("run", "Ring it again.", "--thread", "b", "--approve", "all", *sd, cwd=ROOT)
    assert again.code == 4, (again.stdout, again.stderr)  # left for a person: not auto-approved
    assert "possible duplicate" in again.stderr
    refused = eg("run", "Never mind.", "--thread", "b", *sd, cwd=ROOT)
    assert refused.code == 2 and "--supersede" in refused.stderr, refused.stderr
    dropped = eg("run", "Never mind.", "--thread", "b", "--supersede", *sd, "--json", cwd=ROOT)
    assert dropped.code == 0, (dropped.stdout, dropped.stderr)
    assert json.loads(dropped.stdout)["final_message"] == "Not ringing."
    assert _bells(state_dir) == ["release"]
    bad = eg("run", "x", "--agent", "no_such_module:build", *sd, cwd=ROOT)
    assert bad.code == 2 and "cannot import 'no_such_module'" in bad.stderr


def test_a_worker_runs_the_threads_of_its_own_agent_only(state_dir: StateDir) -> None:
    """`effectgate worker --agent M:F` takes the threads started with M:F; others skip them.

    Before, a worker always ran the built-in tools: a thread started with
    --agent was skipped by every worker (a tool it lacked), or, had its
    tools shared names with the built-in ones, run with the wrong ones.
    """
    sd = ["--state-dir", str(state_dir.root)]
    start = eg("run", _custom_agent.TASK, "--thread", "b", "--agent", AGENT, *sd, cwd=ROOT)
    assert start.code == 4, (start.stdout, start.stderr)  # waits at its review
    plain = eg("worker", "--approve", "all", "--until-idle", "--json", *sd, cwd=ROOT)
    assert plain.code == 0, plain.stderr
    lines = [json.loads(line) for line in plain.stdout.splitlines()]
    assert {"thread_id": "b", "skipped": f"it runs with --agent {AGENT}: a worker with "
            f"--agent {AGENT} takes it"} in lines  # fmt: skip
    assert lines[-1]["runs"] == 0 and not (state_dir.workspace / "bells").exists()
    own = eg("worker", "--agent", AGENT, "--processes", "2", "--approve", "all", "--until-idle",
             "--json", *sd, cwd=ROOT)  # fmt: skip
    assert own.code == 0, own.stderr
    runs = [json.loads(line) for line in own.stdout.splitlines()]
    assert {"thread_id": "b", "was": "review", "status": "done"} in runs
    assert sum(r.get("runs", 0) for r in runs) == 1  # one of the two processes ran it
    assert _bells(state_dir) == ["release"]
    listed = json.loads(eg("threads", *sd, "--json", cwd=ROOT).stdout)["threads"]
    assert [(t["thread_id"], t["status"]) for t in listed] == [("b", "done")]


def test_a_worker_error_is_one_line_on_stderr_and_json_only_with_json(state_dir: StateDir) -> None:
    """A bad --agent: exit 2, one stderr line; stdout stays empty unless --json asks for JSON."""
    sd = ["--state-dir", str(state_dir.root)]
    plain = eg("worker", "--agent", "no_such_module:build", "--until-idle", *sd, cwd=ROOT)
    assert plain.code == 2 and "cannot import 'no_such_module'" in plain.stderr
    assert plain.stdout == "" and "Traceback" not in plain.stderr
    as_json = eg("worker", "--agent", "no_such_module:build", "--until-idle", "--json", *sd,
                 cwd=ROOT)  # fmt: skip
    assert as_json.code == 2 and json.loads(as_json.stdout)["exit_code"] == 2


def test_a_recipe_module_that_fails_to_import_is_one_line(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """A SyntaxError (or any error) while importing the recipe: exit 2, one line, no traceback."""
    (tmp_path / "broken_recipe.py").write_text("def build(:\n")
    (tmp_path / "raising_recipe.py").write_text("raise ValueError('no config')\n")
    sd = ["--state-dir", str(state_dir.root)]
    for module, why in (("broken_recipe", "SyntaxError"), ("raising_recipe", "no config")):
        ran = eg("worker", "--agent", f"{module}:build", "--until-idle", *sd, cwd=tmp_path)
        assert ran.code == 2, ran.stderr
        assert why in ran.stderr and "Traceback" not in ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr


def test_another_agents_finished_thread_is_not_reported(state_dir: StateDir) -> None:
    """A worker says nothing of a done thread it would not run (it said "skipped" before)."""
    sd = ["--state-dir", str(state_dir.root)]
    done = eg("run", _custom_agent.TASK, "--thread", "b", "--agent", AGENT, "--approve", "all",
              *sd, cwd=ROOT)  # fmt: skip
    assert done.code == 0, done.stderr
    plain = eg("worker", "--until-idle", "--json", *sd, cwd=ROOT)
    assert plain.code == 0, plain.stderr
    assert [json.loads(line) for line in plain.stdout.splitlines()][:-1] == []


def test_a_worker_leaves_a_thread_started_with_another_model_to_a_worker_with_it(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """A thread `run --model X` waits for a worker with --model X; another model never runs it.

    Before, a worker ran every built-in-tools thread with its own --model (the
    default `scripted:incident`): it answered the review, then the other
    model ended the thread `done` on an answer its own script never planned.
    """
    from tests.cli.conftest import write_script

    script = write_script(
        tmp_path / "two.json",
        [
            {"name": "write_file", "args": {"path": "a.txt", "content": "alpha\n"}},
            {"name": "write_file", "args": {"path": "b.txt", "content": "beta\n"}},
        ],
    )
    sd = ["--state-dir", str(state_dir.root)]
    start = eg("run", "two files", "--model", f"scripted:{script}", "--thread", "m", *sd)
    assert start.code == 4, (start.stdout, start.stderr)
    other = eg("worker", "--approve", "all", "--until-idle", "--json", *sd)
    assert other.code == 0, other.stderr
    lines = [json.loads(line) for line in other.stdout.splitlines()]
    assert {"thread_id": "m", "skipped": f"it runs with --model scripted:{script}: a worker "
            f"with --model scripted:{script} takes it"} in lines  # fmt: skip
    assert not (state_dir.workspace / "a.txt").exists()
    own = eg("worker", "--model", f"scripted:{script}", "--approve", "all", "--until-idle",
             "--json", *sd)  # fmt: skip
    assert own.code == 0, own.stderr
    assert (state_dir.workspace / "a.txt").read_text() == "alpha\n"
    assert (state_dir.workspace / "b.txt").read_text() == "beta\n"


def test_a_finished_agent_thread_is_reported_and_its_answers_judged(
    state_dir: StateDir, tmp_path: Path
) -> None:
    """``resume`` of a done ``--agent`` thread: reported, late answers judged by what was recorded.

    One resume path for every thread (``cli._resume``). Before, a thread run
    with ``--agent`` went through a second path without the "already done"
    check: it was opened with its model and resumed (nothing written) and
    never said it was done. The answers were judged the same on both paths;
    that stays.
    """
    sd = ["--state-dir", str(state_dir.root)]
    start = eg("run", _custom_agent.TASK, "--thread", "b", "--agent", AGENT, *sd, cwd=ROOT)
    assert start.code == 4, (start.stdout, start.stderr)
    (entry,) = json.loads(eg("pending", *sd, "--json", cwd=ROOT).stdout)["threads"]
    review = entry["interrupts"][0]["id"]
    approve, reject = tmp_path / "approve.json", tmp_path / "reject.json"
    approve.write_text(json.dumps({"interrupt_id": review, "decisions": [{"type": "approve"}]}))
    reject.write_text(json.dumps({"interrupt_id": review, "decisions": [{"type": "reject"}]}))
    done = eg("resume", "--thread", "b", "--decisions", str(approve), *sd, cwd=ROOT)
    assert done.code == 0, (done.stdout, done.stderr)
    assert _bells(state_dir) == ["release"]

    same = eg("resume", "--thread", "b", "--decisions", str(approve), *sd, cwd=ROOT)
    assert same.code == 0, (same.stdout, same.stderr)
    assert "already done; nothing to resume" in same.stderr + same.stdout
    late = eg("resume", "--thread", "b", "--decisions", str(reject), *sd, cwd=ROOT)
    assert late.code == 2, (late.stdout, late.stderr)
    assert "already decided: approve" in " ".join(late.stderr.split())
    assert _bells(state_dir) == ["release"]
