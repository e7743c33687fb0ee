"""``effectgate resume``: the one path that continues a stopped thread.

Every resume goes through ``run_resume``, whatever built the thread: the
built-in tools (the model and demo services its record names) or an
``--agent`` recipe (given, or remembered for the thread). The steps, in order:

1. the thread's record is read from the ledger (an unknown thread is refused);
2. its agent is chosen: ``--agent``, else the recipe the record or
   ``agents.json`` names, else the built-in tools (refused when the record
   names tools none of them provides);
3. a thread already done is only reported, read by an inspection agent that
   never calls anything: no model is built, no service started, nothing
   written (answers in a decisions file for its decided reviews, and its
   verdicts, are judged against what was recorded);
4. otherwise the model is built (``--model`` for this resume only, else the
   recipe's, else the one the record names) and ``_runner.execute`` opens the
   agent and resumes it.

Before, ``--agent`` threads went through a second function with its own copy
of steps 1, 2 and 4 and without step 3: a finished ``--agent`` thread was
opened with its model, took the thread's lease and was resumed (to no
effect: nothing was written) instead of being reported as done.

The inspection agent of step 3 and the agent of step 4 are two agents: a
finished thread must be reported without a model (a library-started thread
records none) and without starting the demo services.

Why step 4 runs the graph twice (``Agent.resume`` with no answer, then
``_session.drive`` resumes with the answers), taking the thread's lease twice,
and not once with the answers: one run cannot keep the behaviour, because

- the answers are read for the interrupts the first resume leaves, and that
  resume is not a read. Under the lease it recovers the thread's in-flight
  attempts (``recover_in_flight``), runs a thread killed mid-step on to its
  next stop (``_continue_at_head``), runs on a review whose decisions were
  recorded before a kill (``_open`` leaves it out, ``_go_on`` runs), and runs
  a follow-up turn recorded but never applied (``_next_turn``). The review a
  decisions file or a person answers may exist only after it; ``status``
  read beforehand, without the lease, shows none (or one another process is
  answering at that moment);
- the refusals come in this order: a busy thread (``ThreadBusyError``, exit
  75 after ``LEASE_WAIT_S``), a deleted thread, a node the agent lacks
  (``ConfigError``) are raised by the first resume, before any answer is
  asked for or bound; an answer that does not fit (``DecisionError``, exit 2)
  after. Binding first would turn a busy thread with a bad decisions file
  from exit 75 into exit 2, and prompt a person at a terminal about a thread
  another process holds;
- between the two runs the lease is not held, on purpose: a person at the
  terminal may take minutes, and holding the lease meanwhile would keep every
  other command (exit 75) and worker off the thread. ``Agent`` has no public
  way to hold the lease across a read, an answer and a run, and
  ``graph/_agent.py`` is not this module's to change.

The second run is the cheap one: the agent remembers where its first run
stopped (``Agent._stops``); at the same checkpoint head the answers are bound
to those interrupts without reloading the thread's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from effectgate.cli._loader import (
    check_builtin_tools,
    inspection_agent_for,
    load_recipe,
    recipe_options,
    remember_agent,
    resolve_model,
    thread_agent,
)
from effectgate.cli._output import Output
from effectgate.cli._runner import (
    Plan,
    RunFlags,
    check_crash_tools,
    decision_source,
    execute,
    refuse_unused_reviews,
    report,
    thread_record,
    uses_services,
)
from effectgate.cli._session import check_failpoint, judge_leftover, judge_unused_verdicts

if TYPE_CHECKING:
    from effectgate.cli._loader import AgentRecipe

__all__ = ["run_resume"]


def run_resume(
    flags: RunFlags,
    output: Output,
    *,
    thread_id: str,
    agent_spec: str | None,
    model_spec: str | None,
    model_options: Mapping[str, Any],
    with_services: bool = False,
) -> int:
    """Continue ``thread_id`` from where it stopped, with the agent it was run with.

    Args:
        flags: the command's state directory, store, answers and failpoint.
        output: where progress, notes and the result go.
        thread_id: the thread to continue.
        agent_spec: ``--agent module:factory``, or ``None`` for the recipe
            the thread is known by (else the built-in tools).
        model_spec: ``--model``: replaces the stored model for this resume
            only (the thread record is write-once).
        model_options: ``base_url`` / ``api_key`` given on the command line
            (``None`` values are ignored; the record's ``base_url`` and
            ``max_retries`` apply otherwise).
        with_services: start the demo services even if the record does not
            say so (a thread started through the library).

    Returns:
        The exit code (``cli._exit.ExitCode``).

    Raises:
        ConfigError: no such state directory or thread; a recipe that cannot
            be loaded; built-in tools for a thread started with others; no
            model to resume with (the thread records none and none is given),
            or one that cannot be built (the message names the stored spec).
    """
    from effectgate._app import StateDir

    source = decision_source(flags, output)
    crash = check_failpoint(flags.crash_at)
    sd = StateDir.open(flags.state_dir, create=False, store=flags.store)
    meta = thread_record(sd, thread_id)
    spec = agent_spec or thread_agent(sd, thread_id, meta)
    if spec is None:
        check_builtin_tools(flags.state_dir, thread_id)
    recipe: AgentRecipe | None = load_recipe(spec, sd) if spec is not None else None
    if spec is not None:
        remember_agent(sd, thread_id, spec)
    with inspection_agent_for(sd, thread_id, recipe) as (reader, _):
        status = reader.status(thread_id)
        if status.status.value == "done":
            # answers to reviews this thread already decided: the recorded outcome, or refused
            status = judge_leftover(reader, thread_id, source, output.note) or status
            # verdicts nothing asks for any more: the recorded one, or refused
            judge_unused_verdicts(reader, source, say=output.note, pending=status.interrupts)
    if status.status.value == "done":
        refuse_unused_reviews(source, thread_id)
        output.progress(f"thread {thread_id} is already done; nothing to resume")
        return report(status, sd, output, state_dir=flags.state_dir)
    options = {k: meta.get(k) for k in ("base_url", "max_retries")}
    options.update({k: v for k, v in model_options.items() if v is not None})
    model = resolve_model(recipe, model_spec, meta, options, thread_id, output=output)
    services = recipe is None and (with_services or uses_services(meta))
    check_crash_tools(crash, sd.root, services=services)
    plan = Plan(
        thread_id=thread_id,
        model=model,
        services=services,
        begin=lambda agent: agent.resume(thread_id),
        resuming=True,
        agent_options=recipe_options(recipe),
    )
    return execute(sd, flags, plan, source, output)
