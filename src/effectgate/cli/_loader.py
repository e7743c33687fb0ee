"""``--agent module:factory``: the CLI driving an agent built by the user's own code.

A factory is any callable reachable as ``package.module:name`` that returns an
``AgentRecipe`` (or a mapping with the same keys): the tools, and optionally
the model, policy and system prompt. It is called with the ``StateDir`` when
it takes one argument (tools that work in the workspace need its path), with
none otherwise. The import-path form is the one ``uvicorn app:app`` and
``gunicorn`` use for an application factory.

The spec is remembered per thread in ``agents.json`` in the state directory
(one small JSON object, replaced atomically), so ``pending``, ``threads``,
``resume``, ``reconcile`` and ``ledger`` find a thread's tools without the
flag being repeated. The thread record in the ledger is write-once, and a
thread started through the library has no CLI metadata at all, hence the file.

This module also holds the runs that need such an agent or a stored
thread: a new thread with ``--agent`` and a follow-up message (``run --thread
T MESSAGE`` on an existing thread); ``cli._resume`` holds the one resume path.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

    from effectgate._app import StateDir
    from effectgate.cli._output import Output
    from effectgate.cli._runner import RunFlags
    from effectgate.graph import Agent, Policy
    from effectgate.tools import ToolSpec

__all__ = [
    "AGENTS_FILE",
    "AgentRecipe",
    "check_builtin_tools",
    "check_recorded",
    "join_store",
    "inspection_agent_for",
    "load_recipe",
    "never_recorded",
    "recipe_options",
    "recorded_task",
    "remember_agent",
    "agent_at",
    "agent_of",
    "remembered_agent",
    "resolve_model",
    "run_followup",
    "run_start_with_agent",
    "thread_agent",
]

AGENTS_FILE = "agents.json"
"""In the state directory: ``{thread_id: "module:factory"}``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentRecipe:
    """What a ``--agent`` factory returns: the parts the CLI builds the agent from.

    The CLI supplies the rest (the state directory's ledger and checkpoints,
    leases, progress display), as ``effectgate.open_agent`` does.
    """

    tools: Sequence[ToolSpec | BaseTool]
    """Every tool the agent has (built-in ones too, if it uses them)."""
    model: BaseChatModel | str | None = None
    """A chat model or a spec such as ``"scripted:path.yaml"``; ``None``: ``--model``."""
    policy: Policy | None = None
    system_prompt: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Unused by the CLI; room for the factory's own notes."""


def load_recipe(spec: str, sd: StateDir) -> AgentRecipe:
    """Import ``module:factory``, call it, and check what it returned.

    The current directory is importable, as it is for ``python -m``.

    Args:
        spec: ``package.module:callable``.
        sd: passed to a factory that takes one argument.

    Returns:
        The recipe.

    Raises:
        ConfigError: a malformed spec, a module or name that does not import,
            a factory that raises or calls ``sys.exit``, or a result of the
            wrong shape (see ``_check_recipe``).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--agent {spec!r}: expected module:factory, e.g. myagent:build")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(spec, module_name)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--agent {spec!r}: {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"--agent {spec!r}: {attr!r} is not callable")
    try:
        takes_dir = len(inspect.signature(target).parameters) >= 1
    except (TypeError, ValueError):
        takes_dir = False
    try:
        made = target(sd) if takes_dir else target()
    except SystemExit as exc:  # its code would pose as one of ours (3 reconciliation, 4 review)
        raise ConfigError(f"--agent {spec!r}: the factory called sys.exit({exc.code!r})") from None
    except KeyboardInterrupt:
        raise  # Ctrl-C (or the CLI's signal handling) while the factory ran: exit 5
    except BaseException as exc:  # noqa: BLE001 - your code may raise any BaseException subclass
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigError(f"--agent {spec!r}: the factory failed: {why}") from None
    if isinstance(made, Mapping):
        try:
            made = AgentRecipe(**made)
        except TypeError as exc:
            raise ConfigError(f"--agent {spec!r}: {exc}") from exc
    if not isinstance(made, AgentRecipe):
        raise ConfigError(
            f"--agent {spec!r}: the factory returned {type(made).__name__}, "
            "expected an AgentRecipe (or a mapping with tools, model, policy, system_prompt)"
        )
    _check_recipe(spec, made)
    return made


def _check_recipe(spec: str, made: AgentRecipe) -> None:
    """Check the types of a recipe's parts, which a factory may get wrong in any way.

    Raises:
        ConfigError: ``tools`` is not a list of ``ToolSpec``/``BaseTool`` with
            distinct names (two tools of one name would make a call's name
            ambiguous), ``model`` is not a chat model, a spec string or
            ``None``, ``policy`` not a ``Policy`` or ``None``, or
            ``system_prompt`` not a string or ``None``.
    """
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

    from effectgate.graph import Policy
    from effectgate.tools import ToolSpec

    def wrong(what: str, value: object) -> ConfigError:
        return ConfigError(f"--agent {spec!r}: {what}, not {type(value).__name__}")

    if isinstance(made.tools, str | bytes) or not isinstance(made.tools, Sequence):
        raise ConfigError(f"--agent {spec!r}: tools must be a list")
    names: set[str] = set()
    for i, tool in enumerate(made.tools):
        if not isinstance(tool, ToolSpec | BaseTool):
            raise wrong(f"tools[{i}] must be a ToolSpec or a LangChain BaseTool", tool)
        if not isinstance(tool.name, str) or not tool.name:
            raise ConfigError(f"--agent {spec!r}: tools[{i}] has no name")
        if tool.name in names:
            raise ConfigError(f"--agent {spec!r}: two tools are named {tool.name!r}")
        names.add(tool.name)
    if made.model is not None and not isinstance(made.model, str | BaseChatModel):
        raise wrong("model must be a chat model, a model spec string or None", made.model)
    if made.policy is not None and not isinstance(made.policy, Policy):
        raise wrong("policy must be an effectgate Policy or None", made.policy)
    if made.system_prompt is not None and not isinstance(made.system_prompt, str):
        raise wrong("system_prompt must be a string or None", made.system_prompt)


def _import(spec: str, module_name: str) -> Any:
    """Import the recipe's module; any failure (a missing module, a syntax error) is one line.

    Raises:
        ConfigError: the module does not import, whatever it raised.
    """
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--agent {spec!r}: cannot import {module_name!r}: {exc}") from exc
    except SystemExit as exc:  # its code would pose as one of ours (3 reconciliation, 4 review)
        raise ConfigError(
            f"--agent {spec!r}: importing {module_name!r} called sys.exit({exc.code!r})"
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a module may raise any BaseException subclass
        raise ConfigError(
            f"--agent {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None


def _agents_path(sd: StateDir) -> Path:
    return sd.root / AGENTS_FILE


def _read_agents(sd: StateDir) -> dict[str, str]:
    path = _agents_path(sd)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of thread id -> module:factory")
    return {str(k): str(v) for k, v in data.items()}


def remember_agent(sd: StateDir, thread_id: str, spec: str) -> None:
    """Remember ``spec`` as the agent of ``thread_id`` (atomic replace of ``agents.json``)."""
    agents = _read_agents(sd)
    if agents.get(thread_id) == spec:
        return
    agents[thread_id] = spec
    fd, tmp = tempfile.mkstemp(dir=sd.root, prefix=".agents-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(agents, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _agents_path(sd))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remembered_agent(sd: StateDir, thread_id: str) -> str | None:
    """Return the ``module:factory`` remembered for a thread, or ``None``."""
    return _read_agents(sd).get(thread_id)


def thread_agent(sd: StateDir, thread_id: str, metadata: Mapping[str, Any]) -> str | None:
    """The ``--agent`` recipe (``module:factory``) a thread runs with; ``None``: the built-in tools.

    The thread record's metadata (``metadata``) says it when the thread was
    started with ``effectgate run --agent`` or submitted with
    ``metadata={"agent": ...}``: the ledger, so the same answer on every
    machine. A thread started through the library and later run with
    ``--agent`` is remembered in the state directory's ``agents.json``.
    """
    recorded = metadata.get("agent")
    if isinstance(recorded, str) and recorded:
        return recorded
    return remembered_agent(sd, thread_id)


def agent_of(sd: StateDir, thread_id: str) -> str | None:
    """``thread_agent`` with the thread's record read from ``sd``'s ledger.

    The answer every command acts on, on every machine sharing the store:
    the recipe recorded in the ledger, else the one this state directory
    remembers (``agents.json``). ``None`` also for a thread the ledger does
    not have (or no ledger yet): the command reports that in its own words.
    """
    from effectgate.cli._runner import thread_record

    try:
        metadata = thread_record(sd, thread_id)
    except ConfigError:
        return remembered_agent(sd, thread_id)
    return thread_agent(sd, thread_id, metadata)


def agent_at(state_dir: Path, thread_id: str) -> str | None:
    """``agent_of`` for a ``--state-dir`` path; ``None`` if it is not a state directory."""
    from effectgate._app import StateDir

    try:
        sd = StateDir.open(state_dir, create=False)
    except ConfigError:
        return None
    return agent_of(sd, thread_id)


@contextlib.contextmanager
def inspection_agent_for(
    sd: StateDir, thread_id: str, recipe: AgentRecipe | None = None
) -> Iterator[tuple[Agent, str | None]]:
    """An agent that reads ``thread_id`` with its own tools when its recipe is known (``agent_of``).

    ``recipe``: the thread's recipe already loaded (the factory is not
    called again), else it is looked up and loaded here.

    Yields:
        ``(agent, note)``: ``note`` says why the recipe could not be
        loaded (the built-in inspection agent is used instead), else ``None``.
    """
    from effectgate._app import open_agent
    from effectgate.cli._runs import DEMO_MODEL, inspection_agent

    if recipe is not None:
        with open_agent(sd, model=DEMO_MODEL, tools=recipe.tools) as agent:
            yield agent, None
        return
    spec = agent_of(sd, thread_id)
    note = None
    if spec is not None:
        try:
            recipe = load_recipe(spec, sd)
        except ConfigError as exc:
            note = str(exc)
        else:
            with open_agent(sd, model=DEMO_MODEL, tools=recipe.tools) as agent:
                yield agent, None
            return
    with inspection_agent(sd) as agent:
        yield agent, note


def resolve_model(
    recipe: AgentRecipe | None,
    model_spec: str | None,
    stored: Mapping[str, Any],
    options: Mapping[str, Any],
    thread_id: str,
    *,
    output: Output | None = None,
) -> BaseChatModel:
    """The model of a run on an existing thread: ``--model``, else the recipe's, else the record's.

    Args:
        recipe: the thread's ``--agent`` recipe, or ``None`` (built-in tools).
        model_spec: ``--model``, for this run only (the record is write-once).
        stored: the thread record's metadata (its ``model`` spec, if any).
        options: ``make_model`` options (``base_url``, ``api_key``,
            ``max_retries``); ``None`` values are ignored.
        thread_id: named in the errors.
        output: told when ``--model`` replaces the recorded model.

    Returns:
        The chat model (a recipe may give one already built).

    Raises:
        ConfigError: no model at all (the thread records none: started
            through the library, and no ``--model`` or recipe model is
            given), or a spec that cannot be built; for the recorded spec
            the message names it and ``--model``.
    """
    from effectgate.models import make_model

    opts = {k: v for k, v in options.items() if v is not None}
    recorded = stored.get("model")
    if model_spec is not None:
        if output is not None and recipe is None:
            if recorded is None:
                output.progress(f"model {model_spec} for this resume (the thread records none)")
            elif model_spec != recorded:
                output.progress(
                    f"model {model_spec} for this resume (the thread's stored one: {recorded})"
                )
        return make_model(model_spec, **opts)
    if recipe is not None and recipe.model is not None:
        given: Any = recipe.model
        if not isinstance(given, str):
            return given  # type: ignore[no-any-return]
        return make_model(given, **opts)
    if recorded is None:
        # Started through the library (or by a build that stored nothing):
        # guessing a model could make it propose effects the thread never
        # planned, and --approve all would approve them.
        raise ConfigError(
            f"thread {thread_id!r} has no recorded model (it was started through the "
            "library, not the CLI): pass --model SPEC, the model it was started with"
            + ("" if recipe is None else ", or an --agent whose factory returns a model")
        )
    try:
        return make_model(str(recorded), **opts)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (the thread's stored model is {recorded!r}; "
            "pass --model to resume it with another)"
        ) from exc


def recipe_options(recipe: AgentRecipe | None) -> dict[str, Any]:
    """What a recipe gives ``open_agent``: its tools, and its policy and prompt when it names them.

    ``{}`` for no recipe; the model is the caller's choice (a recipe's, or ``--model``).
    """
    if recipe is None:
        return {}
    out: dict[str, Any] = {"tools": list(recipe.tools)}
    if recipe.policy is not None:
        out["policy"] = recipe.policy
    if recipe.system_prompt is not None:
        out["system_prompt"] = recipe.system_prompt
    return out


def recorded_task(state_dir: Path, thread_id: str) -> str | None:
    """The task ``thread_id`` was started with, or ``None`` if the state directory lacks it.

    Raises:
        ConfigError: a directory with a ledger file that is not an effectgate
            state directory.
    """
    from effectgate._app import StateDir

    path = state_dir.expanduser()
    if not (path / "effectgate.json").is_file():
        return None
    sd = StateDir.open(path, create=False)
    if not sd.has_ledger():
        return None
    with sd.open_ledger() as ledger:
        record = ledger.get_thread(thread_id)
    return None if record is None else str(record.input.get("task", ""))


def check_builtin_tools(state_dir: Path, thread_id: str) -> None:
    """Refuse to run a thread with the built-in tools when it was started with others.

    Raises:
        ConfigError: the thread's record names tools no built-in tool
            provides: the message names them and the ``--agent`` flag.
    """
    from effectgate._app import StateDir, default_tools
    from effectgate.cli._runner import nowhere, thread_record

    try:
        sd = StateDir.open(state_dir, create=False)
        meta = thread_record(sd, thread_id)
    except ConfigError:
        return  # the command reports it, in its own words
    builtin = {t.name for t in default_tools(sd.workspace, nowhere())}
    missing = sorted(set(map(str, meta.get("tools", []))) - builtin)
    if missing:
        raise ConfigError(
            f"thread {thread_id!r} uses tool(s) {', '.join(missing)} that the CLI does not "
            "have: pass --agent MODULE:FACTORY, a callable in your code that returns "
            "AgentRecipe(tools=[...], model=...) with them (remembered for the thread)"
        )


def join_store(state_dir: Path, store: str) -> None:
    """Bind ``state_dir`` to ``store`` before a command reads threads from it.

    A machine that joins a shared PostgreSQL store has no state directory
    yet: one is created that records ``store`` (as ``worker --store`` does),
    so ``resume --store URL`` there continues a thread another machine
    started. An existing directory must already use ``store``.

    Raises:
        ConfigError: the directory uses another store (or SQLite), or cannot
            be created; ``store`` is not a ``postgresql://`` URL.
    """
    from effectgate._app import StateDir

    StateDir.open(state_dir, create=True, store=store)


def check_recorded(state_dir: Path, thread_id: str) -> None:
    """Refuse to resume a thread the state directory never recorded, saying how to start it.

    A directory that is not a state directory is left for ``resume`` to report.

    Raises:
        ConfigError: the thread was never recorded (the message has the ``run`` command).
    """
    from effectgate._app import StateDir

    try:
        StateDir.open(state_dir, create=False)
    except ConfigError:
        return
    if recorded_task(state_dir, thread_id) is None:
        raise never_recorded(state_dir, thread_id)


def never_recorded(state_dir: Path, thread_id: str) -> ConfigError:
    """The error for resuming a thread the state directory never recorded."""
    from effectgate.cli._output import command_hint

    start = command_hint(state_dir, "run", "--thread", thread_id, "--model", "SPEC", "TASK")
    return ConfigError(
        f"unknown thread {thread_id!r} in {state_dir}: it was never recorded (a run killed "
        f"before it recorded anything leaves nothing to resume); start it with: {start}"
    )


def run_start_with_agent(
    flags: RunFlags,
    output: Output,
    *,
    task: str,
    agent_spec: str,
    model_spec: str | None,
    model_options: Mapping[str, Any],
    thread_id: str,
) -> int:
    """``effectgate run --agent module:factory TASK``: a new thread with the user's agent.

    Returns:
        The exit code.
    """
    from effectgate._app import StateDir
    from effectgate.cli._runner import Plan, decision_source, execute
    from effectgate.cli._runs import stored_model_spec

    source = decision_source(flags, output)
    sd = StateDir.open(flags.state_dir, store=flags.store)
    recipe = load_recipe(agent_spec, sd)
    if model_spec is None and recipe.model is None:
        raise ConfigError(
            f"{agent_spec} returns no model: a new thread needs --model SPEC "
            "(or an --agent whose factory returns a model)"
        )
    model = resolve_model(recipe, model_spec, {}, model_options, thread_id)
    remember_agent(sd, thread_id, agent_spec)
    metadata: dict[str, Any] = {"kind": "run", "agent": agent_spec, "services": False}
    if model_spec is not None:
        metadata["model"] = stored_model_spec(model_spec)
    plan = Plan(
        thread_id=thread_id,
        model=model,
        services=False,
        begin=lambda agent: agent.start(task, thread_id=thread_id, metadata=metadata),
        agent_options=recipe_options(recipe),
    )
    return execute(sd, flags, plan, source, output)


def _continue(
    flags: RunFlags,
    output: Output,
    *,
    thread_id: str,
    agent_spec: str | None,
    model_spec: str | None,
    model_options: Mapping[str, Any],
    with_services: bool,
    begin: Any,
    resuming: bool,
) -> int:
    from effectgate._app import StateDir
    from effectgate.cli._runner import Plan, decision_source, execute, thread_record, uses_services

    source = decision_source(flags, output)
    sd = StateDir.open(flags.state_dir, create=False, store=flags.store)
    meta = thread_record(sd, thread_id)
    spec = agent_spec or thread_agent(sd, thread_id, meta)
    if spec is None:
        check_builtin_tools(flags.state_dir, thread_id)
    recipe = load_recipe(spec, sd) if spec is not None else None
    if spec is not None:
        remember_agent(sd, thread_id, spec)
    options = {k: meta.get(k) for k in ("base_url", "max_retries")}
    options.update({k: v for k, v in model_options.items() if v is not None})
    model = resolve_model(recipe, model_spec, meta, options, thread_id)
    services = recipe is None and (with_services or uses_services(meta))
    plan = Plan(
        thread_id=thread_id,
        model=model,
        services=services,
        begin=begin,
        resuming=resuming,
        agent_options=recipe_options(recipe),
    )
    return execute(sd, flags, plan, source, output)


def run_followup(
    flags: RunFlags,
    output: Output,
    *,
    thread_id: str,
    message: str,
    supersede: bool,
    request_id: str | None,
    agent_spec: str | None,
    model_spec: str | None,
    model_options: Mapping[str, Any],
    with_services: bool,
) -> int:
    """``effectgate run --thread T MESSAGE`` on an existing thread.

    ``MESSAGE`` equal to the thread's task is a repeated start, which resumes
    the thread (``Agent.start``); anything else is a follow-up turn
    (``Agent.send``). The agent is the one the thread was run with:
    ``--agent``, else the remembered one, else the model and services in the
    thread's record.

    Returns:
        The exit code.
    """

    def begin(agent: Agent) -> Any:
        if recorded_task(flags.state_dir, thread_id) == message:
            return agent.start(message, thread_id=thread_id)
        return agent.send(thread_id, message, supersede=supersede, request_id=request_id)

    return _continue(
        flags,
        output,
        thread_id=thread_id,
        agent_spec=agent_spec,
        model_spec=model_spec,
        model_options=model_options,
        with_services=with_services,
        begin=begin,
        resuming=False,
    )
