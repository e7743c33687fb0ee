"""``effectgate demo`` and ``run``: build the model, plan the run, hand it to the runner.

Bad input is refused before anything is written: the decisions file and the
failpoint name are checked first, then the model spec, then the state
directory (``StateDir.open`` refuses a directory that is not ours). Each run
records its model spec and whether it used the demo services in the thread's
metadata, so ``resume`` in a new process rebuilds the same agent. What every
run and resume shares (opening the agent, driving it, the report) is
``cli/_runner.py``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate.cli._output import Output, command_hint
from effectgate.cli._runner import (
    Plan,
    RunFlags,
    check_crash_tools,
    decision_source,
    execute,
    nowhere,
)
from effectgate.cli._session import check_failpoint
from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from effectgate._app import StateDir
    from effectgate.demo import DemoServices
    from effectgate.graph import Agent

__all__ = [
    "DEMO_MODEL",
    "DEMO_TASK",
    "inspection_agent",
    "new_thread_id",
    "run_demo",
    "run_task",
    "services_skip",
    "stored_model_spec",
]

DEMO_MODEL = "scripted:incident"
DEMO_TASK = (
    "An alert says the order service may be failing. Check its error rate over the last "
    "5 minutes; if it is above 5%, open a ticket, mail the on-call engineer with the ticket "
    "number, and write an incident note into the workspace."
)


def new_thread_id(kind: str) -> str:
    """Return a fresh thread id: ``demo-<8 hex>`` for the demo, 32 hex otherwise."""
    return f"demo-{uuid.uuid4().hex[:8]}" if kind == "demo" else uuid.uuid4().hex


def services_skip(state_dir: Path | None, thread_id: str, why: str, worker: str) -> str:
    """The one line a worker says of a demo-services thread it leaves: why, and who takes it.

    ``effectgate resume`` takes such a thread to its end (it starts the demo
    services itself, with the thread's recorded model and tools); so does
    ``worker`` (e.g. "a worker without --agent") while ``effectgate
    services`` runs for the state directory (``services/endpoints.json``).

    Args:
        state_dir: the worker's ``--state-dir`` as given (spelled in the commands).
        thread_id: the thread left.
        why: what this worker lacks, e.g. "it runs with the demo ticket and mail services".
        worker: the worker that takes it while the services run.
    """
    resume = command_hint(state_dir, "resume", "--thread", thread_id)
    services = command_hint(state_dir, "services")
    return f"{why}: {resume} takes it (it starts them), or {worker} while {services} runs"


def stored_model_spec(spec: str) -> str:
    """Return the spec to store for ``resume``: a scripted model's file path made absolute.

    ``resume`` may run from another directory, where a relative path names
    nothing (or another file). Packaged names and ``openai:`` specs are kept.
    """
    provider, sep, rest = spec.partition(":")
    text = rest.strip()
    if provider != "scripted" or not sep:
        return spec
    if os.sep in text or "/" in text or text.endswith((".yaml", ".yml", ".json")):
        return f"scripted:{os.path.abspath(Path(text).expanduser())}"
    return spec


def _model(spec: str, options: Mapping[str, Any]) -> BaseChatModel:
    from effectgate.models import make_model

    return make_model(spec, **{k: v for k, v in options.items() if v is not None})


def _script_tool_names(script: Mapping[str, Any]) -> list[str]:
    """Every tool name a validated script's turns (and follow-ups' turns) call, in order."""
    names: list[str] = []
    for part in [script, *script.get("followups", [])]:
        for turn in part.get("turns", []):
            for call in turn.get("tool_calls", []):
                if call["name"] not in names:
                    names.append(call["name"])
    return names


def _check_script_tools(model: BaseChatModel, state_dir: Path, *, services: bool) -> None:
    """Refuse a scripted model that calls demo service tools when the run has none.

    Without the check, ``run --model scripted:incident`` (no ``--with-services``)
    ends ``done`` after its first call failed as an unknown tool. A tool that
    the services would not bring either is left to the run (a script may test
    exactly that).

    Raises:
        ConfigError: the script names a tool only ``--with-services`` brings.
    """
    from effectgate._app import default_tools
    from effectgate.models import ScriptedChatModel

    if services or not isinstance(model, ScriptedChatModel):
        return
    workspace = state_dir / "workspace"
    plain = {t.name for t in default_tools(workspace, None)}
    served = {t.name for t in default_tools(workspace, nowhere())}
    needed = [n for n in _script_tool_names(model.script) if n not in plain and n in served]
    if needed:
        name = model.script.get("name", "scripted")
        raise ConfigError(
            f"the scripted model {name!r} calls {', '.join(needed)}, which come with the "
            "demo services: add --with-services (or run effectgate demo)"
        )


@contextlib.contextmanager
def inspection_agent(sd: StateDir) -> Iterator[Agent]:
    """Open an agent that can read any thread's state and never calls anything.

    It carries every built-in tool (against an address nobody listens on) so
    the graph has the same nodes as the agent that wrote the checkpoints.
    """
    from effectgate._app import default_tools, open_agent

    tools = default_tools(sd.workspace, nowhere())
    with open_agent(sd, model=DEMO_MODEL, tools=tools) as agent:
        yield agent


def _prepare_demo(error_rate: float | None, output: Output) -> Callable[[DemoServices], None]:
    def prepare(services: DemoServices) -> None:
        from effectgate.demo.services import read_error_rate

        # "Fresh" means no rate was ever stored, not "no service files yet": a
        # first demo killed between starting the services and storing the
        # rate, or an earlier `effectgate services`, must still get 0.12.
        if error_rate is not None or read_error_rate(services.data_dir, "orders") is None:
            from effectgate.demo.services import DEMO_ERROR_RATE

            rate = DEMO_ERROR_RATE if error_rate is None else error_rate
            services.set_error_rate("orders", rate)
            output.progress(f"ticket service: orders error rate set to {rate}")

    return prepare


def run_demo(
    flags: RunFlags, output: Output, *, thread_id: str | None, error_rate: float | None
) -> int:
    """Run the incident demo on the local ticket service and mail sink.

    Returns:
        The exit code.

    Raises:
        ConfigError, DecisionError: bad flags or decisions; nothing written.
        ThreadBusyError: another process runs the thread.
    """
    from effectgate._app import StateDir

    source = decision_source(flags, output)
    check_crash_tools(check_failpoint(flags.crash_at), flags.state_dir, services=True)
    model = _model(DEMO_MODEL, {})
    if error_rate is not None and not 0.0 <= error_rate <= 1.0:
        raise ConfigError(f"--error-rate must be a fraction in [0, 1], got {error_rate}")
    sd = StateDir.open(flags.state_dir, store=flags.store)
    thread = thread_id or new_thread_id("demo")
    metadata = {"kind": "demo", "model": DEMO_MODEL, "services": True}
    plan = Plan(
        thread_id=thread,
        model=model,
        services=True,
        begin=lambda agent: agent.start(DEMO_TASK, thread_id=thread, metadata=metadata),
        prepare=_prepare_demo(error_rate, output),
    )
    return execute(sd, flags, plan, source, output)


def run_task(
    flags: RunFlags,
    output: Output,
    *,
    task: str,
    model_spec: str,
    model_options: Mapping[str, Any],
    with_services: bool,
    thread_id: str | None,
) -> int:
    """Start a new thread on ``task`` with any model.

    ``model_options`` (``base_url``, ``api_key``, ``max_retries``) build the
    model; all but ``api_key`` are stored in the thread's metadata.

    Returns:
        The exit code.
    """
    from effectgate._app import StateDir

    source = decision_source(flags, output)
    crash = check_failpoint(flags.crash_at)
    check_crash_tools(crash, flags.state_dir, services=with_services)
    model = _model(model_spec, model_options)
    _check_script_tools(model, flags.state_dir, services=with_services)
    sd = StateDir.open(flags.state_dir, store=flags.store)
    thread = thread_id or new_thread_id("run")
    stored = {k: v for k, v in model_options.items() if k != "api_key" and v is not None}
    metadata = {
        "kind": "run",
        "model": stored_model_spec(model_spec),
        "services": with_services,
        **stored,
    }
    plan = Plan(
        thread_id=thread,
        model=model,
        services=with_services,
        begin=lambda agent: agent.start(task, thread_id=thread, metadata=metadata),
    )
    return execute(sd, flags, plan, source, output)
