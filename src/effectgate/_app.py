"""The app layer: a state directory and an agent wired to it (used by the CLI and notebooks)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate._untrusted import read_regular_file
from effectgate.errors import ConfigError, EffectgateError

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from effectgate._clock import Clock
    from effectgate.demo.services import ServiceEndpoints
    from effectgate.graph import Agent, Policy
    from effectgate.ledger import Ledger, Operation
    from effectgate.tools import ToolSpec

__all__ = ["DEFAULT_SYSTEM_PROMPT", "StateDir", "default_tools", "open_agent"]

_MARKER = "effectgate.json"
_FORMAT = 1
_FILES_KEY = "files"
"""The marker's list of SQLite state files that exist and must not be recreated empty."""
_FORMAT_STORE = 2
"""The marker's format when the ledger and checkpoints live in PostgreSQL: a build
that knows only format 1 refuses the directory instead of opening an empty
SQLite ledger beside the real one."""

DEFAULT_SYSTEM_PROMPT = (
    "You are an operations agent. Use the tools to act. Every side-effecting call is "
    "reviewed by a human and recorded in a durable ledger; if a call is rejected, do not "
    "retry it unless asked."
)


@dataclass(frozen=True, slots=True)
class StateDir:
    """Where a deployment keeps its state: checkpoints, ledger, workspace, demo services.

    Layout: ``checkpoints.sqlite3`` (LangGraph), ``ledger.sqlite3`` (operations,
    approvals, events, threads, leases), ``workspace/`` (the file tools' root),
    ``services/`` (the demo systems' own data), ``effectgate.json`` (marker).
    With ``store`` set (a ``postgresql://`` URL, recorded in the marker without
    its password) the ledger and checkpoints live there instead of the two files.
    """

    root: Path
    store: str | None = None

    @property
    def checkpoints(self) -> Path:
        """The LangGraph SQLite checkpoint file."""
        return self.root / "checkpoints.sqlite3"

    @property
    def ledger(self) -> Path:
        """The operation ledger file."""
        return self.root / "ledger.sqlite3"

    @property
    def workspace(self) -> Path:
        """The directory the file tools may touch, and nothing outside it."""
        return self.root / "workspace"

    @property
    def services(self) -> Path:
        """The demo ticket service's and mail sink's own data."""
        return self.root / "services"

    def open_ledger(self, *, clock: Clock | None = None) -> Ledger:
        """Open this state's ledger: the SQLite file, or ``PostgresLedger`` on ``store``.

        Raises:
            LedgerCorruptError: the directory has run threads on its SQLite
                ledger, and that file is now missing, empty (0 bytes) or
                without its tables (``refuse_lost``): a new ledger would not
                know the effects the old one recorded.
        """
        if self.store is not None:
            from effectgate.ledger import PostgresLedger

            return PostgresLedger(self.store, clock=clock, bound=True)
        from effectgate.ledger import SqliteLedger

        self.refuse_lost(self.ledger)
        return SqliteLedger(self.ledger, clock=clock)

    def refuse_lost(self, *paths: Path) -> None:
        """Refuse to recreate a SQLite state file this directory has already used.

        The marker lists the two files once a thread store was opened on both
        (``_record_files``). SQLite takes a missing or 0-byte file for a new,
        empty database, and a file whose ``-wal`` was lost for one without
        tables (a killed process leaves its writes in the ``-wal``), so
        without this a lost ledger would be recreated empty and every effect
        it recorded dispatched again (the checkpoints still lead there), and a
        lost checkpoint file would start each thread over.

        Raises:
            LedgerCorruptError: ``ledger.sqlite3`` is listed and lost.
            CheckpointCorruptError: ``checkpoints.sqlite3`` is listed and lost.
        """
        from effectgate.errors import CheckpointCorruptError, LedgerCorruptError

        listed = _read_marker(self.root / _MARKER).get(_FILES_KEY) or []
        for path in paths:
            if path.name not in listed:
                continue
            size = path.stat().st_size if path.is_file() else None
            if size is None:
                what = "is missing"
            elif size == 0:
                what = "is empty (0 bytes)"
            elif not _has_table(path, _SCHEMA_TABLE[path.name]):
                # its data lived in the -wal file, which is gone (or a stranger's file)
                what = (
                    f"holds no {_SCHEMA_TABLE[path.name]} table (its -wal file, where the "
                    "latest writes were, may have been lost)"
                )
            else:
                continue
            if path == self.ledger:
                raise LedgerCorruptError(
                    f"{path} {what}, but this state directory has run threads on it: a new "
                    "ledger would not know which effects already happened, and would dispatch "
                    "them again. Restore the file from a backup; or, to start over, use a new "
                    "--state-dir (the external systems keep what was done)"
                )
            raise CheckpointCorruptError(
                f"{path} {what}, but this state directory has run threads on it: their "
                "progress is lost (the ledger still lists every operation and its outcome: "
                "`effectgate ledger list`). Restore the file from a backup; or, to start "
                "over, use a new --state-dir"
            )

    def _record_files(self) -> None:
        """List both SQLite state files in the marker, once both exist with their schema.

        From then on ``refuse_lost`` refuses to recreate either. Written by
        replacing the marker (atomic on POSIX); concurrent writers write the
        same content.
        """
        marker = self.root / _MARKER
        data = _read_marker(marker)
        names = sorted({self.checkpoints.name, self.ledger.name})
        if data.get(_FILES_KEY) == names:
            return
        data[_FILES_KEY] = names
        tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, marker)

    def has_ledger(self) -> bool:
        """Tell whether a ledger may hold anything yet.

        True with a store, when the SQLite file exists, or when the marker
        lists it (it was lost: ``open_ledger`` then says so, rather than a
        command reporting "unknown thread").
        """
        if self.store is not None or self.ledger.is_file():
            return True
        return self.ledger.name in (_read_marker(self.root / _MARKER).get(_FILES_KEY) or [])

    @classmethod
    def open(cls, path: str | Path, *, create: bool = True, store: str | None = None) -> StateDir:
        """Open (and by default create) a state directory.

        Args:
            path: the directory.
            create: create it if missing, and make an empty directory one.
                ``False`` (commands that only read) writes nothing: an empty
                directory is refused as a missing one is.
            store: a ``postgresql://`` URL for the ledger and checkpoints; a new
                directory records it, an existing one must already use it.
                ``None``: whatever the directory records (SQLite by default).

        Raises:
            ConfigError: the path is a file, or a non-empty directory that is not
                an effectgate state directory, or it does not exist (or is
                empty) and ``create`` is false, or ``store`` is not the one the directory
                uses (nothing is written in these cases); or the directory
                cannot be created or written (under a file, no permission, disk
                full), or one of its entries has the wrong type (``workspace`` a
                file, ``checkpoints.sqlite3`` a directory). The message names
                the path and the OS's reason.
        """
        try:
            root = Path(path).expanduser().resolve()
            return cls._open(root, create=create, store=store)
        except OSError as exc:
            where = exc.filename if exc.filename is not None else path
            raise ConfigError(
                f"state directory {path}: cannot use {where}: {exc.strerror or exc}"
            ) from None
        except RuntimeError as exc:  # a symlink loop in the path (Path.resolve)
            if isinstance(exc, EffectgateError):
                raise  # the store's own error (busy, unavailable), not the path's
            raise ConfigError(f"state directory {path}: {exc}") from None

    @classmethod
    def _open(cls, root: Path, *, create: bool, store: str | None) -> StateDir:
        marker = root / _MARKER
        if root.exists() and not root.is_dir():
            raise ConfigError(f"state directory {root} is a file")
        if root.is_dir() and any(root.iterdir()) and not marker.is_file():
            raise ConfigError(
                f"{root} is not an effectgate state directory (no {_MARKER}); "
                "refusing to write into it. Choose an empty or new directory."
            )
        if not create and not marker.is_file():
            _refuse_unmarked(root)
        found: Any = _FORMAT
        if not marker.is_file():
            _mark_new(root, marker, store)
        else:
            try:
                found = json.loads(read_regular_file(marker, max_bytes=4096) or "{}").get("format")
            except (ValueError, AttributeError) as exc:
                raise ConfigError(f"{marker} is not an effectgate marker file: {exc}") from exc
            if found not in (_FORMAT, _FORMAT_STORE):
                raise ConfigError(f"{marker}: state format {found!r}, expected {_FORMAT}")
        bound = None
        if store is not None or found == _FORMAT_STORE:
            from effectgate._postgres_app import bind_store

            bound = bind_store(root, marker, store, _FORMAT_STORE)
        sd = cls(root, bound)
        for entry in (sd.checkpoints, sd.ledger):
            if entry.exists() and not entry.is_file():
                raise ConfigError(f"{entry} is not a regular file; move it away to continue")
        if sd.workspace.exists() and not sd.workspace.is_dir():
            raise ConfigError(f"{sd.workspace} is not a directory; move it away to continue")
        sd.workspace.mkdir(exist_ok=True)
        if create and not os.access(root, os.W_OK | os.X_OK):  # reading needs no write
            raise ConfigError(f"state directory {root} is not writable by this user")
        return sd


def default_tools(workspace: Path, endpoints: ServiceEndpoints | None = None) -> list[ToolSpec]:
    """Return the built-in tools: files and shell in ``workspace``, tickets and mail if given."""
    from effectgate.tools import file_tools, mail_tools, shell_tool, ticket_tools

    tools = [*file_tools(workspace), shell_tool(workspace)]
    if endpoints is not None:
        tools += ticket_tools(endpoints.ticket_url)
        tools += mail_tools(endpoints.smtp_host, endpoints.smtp_port, endpoints.mail_url)
    return tools


def _open_checkpoints(path: Path) -> sqlite3.Connection:
    """Open the checkpoint file, refusing one that is not an SQLite database.

    Raises:
        ConfigError: the file cannot be opened at all (a directory, no permission).
        sqlite3.DatabaseError: the file is damaged (``SQLITE_NOTADB``), raised
            unchanged like any other damage SQLite reports later; the CLI ends
            with exit 1 and says which file to check.
    """
    try:
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30.0)
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: cannot open the checkpoint database: {exc}") from None
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


@contextmanager
def open_agent(
    state_dir: StateDir | str | Path,
    *,
    model: str | BaseChatModel = "scripted:incident",
    tools: Sequence[ToolSpec | BaseTool] | None = None,
    endpoints: ServiceEndpoints | None = None,
    policy: Policy | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    model_options: Mapping[str, Any] | None = None,
    on_event: Callable[[Mapping[str, Any]], None] | None = None,
    on_wait: Callable[[Operation, float], None] | None = None,
    lease_ttl_s: float = 30.0,
    lease_wait_s: float = 0.0,
    clock: Clock | None = None,
    store: str | None = None,
) -> Iterator[Agent]:
    """Open an ``Agent`` on a state directory, and close its files afterwards.

    Args:
        state_dir: a ``StateDir`` or a path (created if new).
        model: ``"scripted:<name|path>"``, ``"openai:<model>"`` or a chat model.
        tools: tools to use; default: ``default_tools(workspace, endpoints)``.
        endpoints: the demo services' addresses, for the ticket and mail tools.
        policy: review policy.
        system_prompt: prepended to model calls.
        model_options: keyword arguments for ``make_model``.
        on_event: progress hook for streamed updates.
        on_wait: progress hook for backoff waits.
        lease_ttl_s: thread lease lifetime in seconds.
        lease_wait_s: seconds to wait for a thread another live runner holds
            before ``ThreadBusyError`` (default 0: fail at once).
        clock: time source for approvals, backoff and the ledger (a
            ``effectgate.testing.FakeClock`` in tests and notebooks).
        store: where the ledger and checkpoints live: ``None`` for the SQLite
            files of the state directory, or a ``postgresql://`` URL (the
            ``postgres`` extra; see docs/postgres.md). The workspace and the
            demo services stay in the state directory either way.

    Yields:
        The agent; its ledger and checkpointer close when the block exits.

    Raises:
        ConfigError: bad state directory, model specification or store.
    """
    from effectgate.graph import Agent
    from effectgate.models import make_model

    sd = state_dir if isinstance(state_dir, StateDir) else StateDir.open(state_dir, store=store)
    chat = make_model(model, **dict(model_options or {})) if isinstance(model, str) else model
    with ExitStack() as stack:
        ledger, saver = _open_stores(stack, sd, store or sd.store, clock)
        agent = Agent(
            chat,
            list(tools) if tools is not None else default_tools(sd.workspace, endpoints),
            ledger=ledger,
            checkpointer=saver,
            policy=policy,
            system_prompt=system_prompt,
            on_event=on_event,
            on_wait=on_wait,
            lease_ttl_s=lease_ttl_s,
            lease_wait_s=lease_wait_s,
            clock=clock,
        )
        yield agent


def _refuse_unmarked(root: Path) -> None:
    """Refuse a missing or empty state directory to a command that only reads.

    Such a command must not make it a state directory (a later ``--store``
    would then find it taken by SQLite).

    Raises:
        ConfigError: always, naming which of the two it is.
    """
    if not root.exists():
        raise ConfigError(f"state directory {root} does not exist")
    raise ConfigError(f"{root} is not an effectgate state directory yet (empty)")


def _mark_new(root: Path, marker: Path, store: str | None) -> None:
    """Create ``root`` and its marker; a ``store`` this installation cannot open is refused first.

    Refused before the marker exists, so a failed ``--store`` leaves nothing
    (no marker, no workspace) a later command would take for a SQLite state
    directory: the store is also reached once first (``probe_store``), so a
    refused login or a server that cannot be reached writes nothing.

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL, the ``postgres`` extra
            is missing, or the store cannot be used (``probe_store``).
    """
    if store is not None:
        from effectgate._postgres_app import probe_store, require_postgres

        require_postgres(store)
        probe_store(store)
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"format": _FORMAT}) + "\n")


def _open_stores(
    stack: ExitStack, sd: StateDir, store: str | None, clock: Clock | None
) -> tuple[Ledger, BaseCheckpointSaver[Any]]:
    """Open the ledger and the checkpointer ``store`` names; ``stack`` closes them."""
    from effectgate.graph import StepDurableSaver

    if store is not None:
        from effectgate._postgres_app import open_postgres_stores

        # recorded in the marker only once reached (bind_store probes it first)
        return open_postgres_stores(stack, store, clock, bound=sd.store is not None)
    sd.refuse_lost(sd.checkpoints)  # open_ledger checks the ledger
    conn = _open_checkpoints(sd.checkpoints)
    stack.callback(conn.close)
    ledger = stack.enter_context(sd.open_ledger(clock=clock))
    saver = StepDurableSaver(conn)
    saver.setup()  # the schema exists before the marker lists the file
    sd._record_files()
    return ledger, saver


_SCHEMA_TABLE = {"ledger.sqlite3": "schema_version", "checkpoints.sqlite3": "checkpoints"}
"""The table each SQLite state file has once it was set up (the ledger's, LangGraph's)."""


def _has_table(path: Path, table: str) -> bool:
    """Whether the SQLite file at ``path`` has ``table``; read-only, and True when it cannot tell.

    A file SQLite cannot open read-only (a damaged one, a ``-shm`` it may not
    create) is left to the store that opens it next, which reports it.
    """
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=5.0)
    except sqlite3.Error:
        return True
    try:
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        return row is not None
    except sqlite3.Error:
        return True
    finally:
        conn.close()


def _read_marker(marker: Path) -> dict[str, Any]:
    """Return the marker's JSON object (``{}`` if it holds none); ``StateDir._open`` vetted it."""
    try:
        data = json.loads(read_regular_file(marker, max_bytes=4096) or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
