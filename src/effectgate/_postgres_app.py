"""``open_agent(store="postgresql://...")``: the ledger and the checkpoints on one PostgreSQL.

Kept apart from ``_app`` so that the SQLite default never imports psycopg.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from effectgate._clock import Clock
    from effectgate.ledger import Ledger

__all__ = [
    "STORE_ENV",
    "bind_store",
    "check_store_url",
    "give_store",
    "given_for",
    "open_postgres_stores",
    "require_postgres",
]

STORE_ENV = "EFFECTGATE_STORE"
"""The environment variable naming the store: the CLI's ``--store``, the server's store."""

_given: dict[str, None] = {}
"""The stores given to this process (``--store``: ``give_store``; ``open_agent(store=...)``:
``bind_store``), password and all, in the order given: every later open of a state
directory that records the same store connects with the given URL (``given_for``)."""


def give_store(store: str | None) -> str | None:
    """Keep ``store`` as given to this process, for every open of the store it names.

    The CLI's ``--store`` (and ``EFFECTGATE_STORE``) comes here as it is
    parsed, before the command opens anything: a report read before the
    command binds the store (``cli/_recovery``) then connects with it too.
    Nothing is checked here; ``bind_store`` checks it when the directory opens.

    Args:
        store: the URL given, or ``None``.

    Returns:
        ``store``, unchanged (a typer option callback).
    """
    if store:
        _given[store] = None
    return store


def require_postgres(store: str) -> None:
    """Refuse, in one line, a store this installation cannot open: not a URL, or no driver.

    Called before a state directory is first marked, so a refused ``--store``
    leaves nothing behind that a later command would take for a SQLite directory.

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL, libpq cannot parse it
            (a bad percent-escape, an unknown parameter), or the ``postgres``
            extra (psycopg, psycopg_pool, langgraph-checkpoint-postgres) is missing.
    """
    check_store_url(store)
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"a PostgreSQL store needs the postgres extra (pip install 'effectgate[postgres]'): "
            f"{exc}"
        ) from exc
    from effectgate.ledger._postgres import parse_dsn

    parse_dsn(store)


def open_postgres_stores(
    stack: ExitStack, store: str, clock: Clock | None, *, bound: bool = False
) -> tuple[Ledger, BaseCheckpointSaver[Any]]:
    """Open a ``PostgresLedger`` and a ``StepDurablePostgresSaver`` on ``store``.

    Both use the database the URL names (and its ``search_path``, e.g.
    ``?options=-c%20search_path%3Dteam_a``); ``stack`` closes them.

    Args:
        stack: receives the close of both.
        store: a ``postgresql://`` (or ``postgres://``) URL.
        clock: the ledger's clock; ``None``: the database's (``DatabaseClock``).
        bound: a state directory records ``store`` (it was reached before):
            a refused first connection is retried (``PostgresLedgerStore``).

    Returns:
        ``(ledger, checkpointer)``.

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL, the ``postgres`` extra
            is not installed, or the server cannot be used.
        DatabaseUnavailableError: ``bound``, and the server did not answer
            within the retry budget; or it stopped answering between the
            ledger's first connection and the checkpointer's.
    """
    require_postgres(store)
    import psycopg

    from effectgate.graph._pg_saver import check_checkpoint_tables, open_postgres_saver
    from effectgate.ledger._postgres import PostgresLedger, redacted

    try:
        # Before the ledger creates a table: a schema holding someone else's
        # "checkpoints" table is refused with nothing left behind.
        with psycopg.connect(store, autocommit=True, connect_timeout=10) as conn:
            check_checkpoint_tables(conn)
    except psycopg.Error:
        pass  # the ledger's open below says what is wrong with the server, in one line
    ledger = stack.enter_context(PostgresLedger(store, clock=clock, bound=bound))
    try:
        saver = stack.enter_context(open_postgres_saver(store))
    except psycopg.Error as exc:
        raise ConfigError(f"cannot use checkpoint database {redacted(store)}: {_why(exc)}") from exc
    return ledger, saver


def check_store_url(store: str) -> None:
    """Refuse anything but a ``postgresql://`` URL, naming only its scheme.

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL.
    """
    if not store.startswith(("postgresql://", "postgres://")):
        # Name the scheme only: a key=value string may hold a password.
        scheme, sep, _ = store.partition("://")
        named = f"store {scheme!r}" if sep and scheme.isalnum() else "store"
        raise ConfigError(
            f"{named}: expected a postgresql:// URL "
            "(or no --store for the SQLite files of the state directory)"
        )


def probe_store(store: str) -> None:
    """Check that ``store`` can be used, creating nothing: the server answers, a schema is set.

    One connection and one ``SELECT current_schema()``; tables are neither
    read nor created (the first ``open_agent`` does that, under its
    migration lock), so probing a state directory's store never migrates it.

    Raises:
        ConfigError: the server cannot be reached or refuses the login, or no
            schema of ``search_path`` exists (the message names the server and
            database, never the password).
    """
    import psycopg

    from effectgate.ledger._postgres import redacted

    try:
        with psycopg.connect(store, autocommit=True, connect_timeout=10) as conn:
            ((current,),) = conn.execute("SELECT current_schema()").fetchall()
            if current is None:
                ((path,),) = conn.execute("SHOW search_path").fetchall()
                raise ConfigError(
                    f"{redacted(store)}: no schema of search_path ({path}) exists: create it "
                    "(CREATE SCHEMA) or name an existing one"
                )
    except psycopg.Error as exc:
        raise ConfigError(f"cannot use ledger database {redacted(store)}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    """A refused connection's reason (``connection_refusal``), else libpq's first line."""
    from effectgate.ledger._postgres_login import connection_refusal

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return connection_refusal(exc) or first


def bind_store(root: Path, marker: Path, store: str | None, store_format: int) -> str | None:
    """Return the store a state directory uses, recording a new one in its marker.

    A state directory keeps one ledger for life: running its workspace against
    a second, empty ledger would repeat every effect the first one recorded.
    So the first ``--store`` that can be reached (``probe_store``: the server
    answers and ``search_path`` names a schema; nothing is created yet) is
    written to the marker
    (without a password: give it again, or through ``PGPASSWORD`` /
    ``~/.pgpass``), and a later one must name the same server, database and
    options. A store that cannot be opened (a mistyped port, a missing schema)
    records nothing: nothing ran there, so the right URL may follow.

    Args:
        root: the state directory.
        marker: its ``effectgate.json``.
        store: the URL given now, or ``None``.
        store_format: the marker format that records a store.

    The URL given is the one every open of the store in this process uses
    (the recovery report, ``threads``, a reader of the same directory):
    without ``store``, a recorded store is reached with the URL given
    earlier in this process for the same server, database, user and options,
    else with ``EFFECTGATE_STORE`` if it names that store, else as recorded
    (libpq then looks for a password in ``PGPASSWORD`` and ``~/.pgpass``).

    Returns:
        The URL to connect with: ``store`` if given, else the recorded one
        (``given_for``).

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL, the directory already
            keeps its ledger in SQLite, it records a different store (the
            message names it, and says to omit ``--store`` or use a new
            ``--state-dir``), or a new store cannot be opened.
    """
    data = json.loads(marker.read_text() or "{}")
    recorded = data.get("store")
    if store is None:
        return given_for(str(recorded)) if recorded else None
    require_postgres(store)
    from effectgate.ledger._postgres import same_database, without_password

    if not recorded:
        if (root / "ledger.sqlite3").exists() or (root / "checkpoints.sqlite3").exists():
            raise ConfigError(
                f"{root} keeps its ledger in SQLite; --store cannot move it there "
                "(use a new state directory for a PostgreSQL store)"
            )
        probe_store(store)  # bind only a store that can be reached
        marker.write_text(json.dumps({"format": store_format, "store": without_password(store)}))
        _given[store] = None
        return store
    if not same_database(str(recorded), store):
        raise ConfigError(
            f"{root} keeps its ledger and checkpoints in {without_password(str(recorded))}, "
            f"not {without_password(store)}: run it without --store (the directory remembers its "
            "store), or use a new --state-dir for the other store (a state directory keeps "
            "one store for life: its workspace matches that ledger)"
        )
    _given[store] = None
    return store


def given_for(recorded: str) -> str:
    """The URL to reach a state directory's recorded (password-less) store with.

    Args:
        recorded: the store as ``effectgate.json`` records it.

    Returns:
        The URL given to this process for the same server, database, user
        and options (``bind_store`` keeps each one given), else
        ``EFFECTGATE_STORE`` if it names that store, else ``recorded``. An
        ``EFFECTGATE_STORE`` naming another store, or none libpq can parse,
        is left alone here: only a command's ``--store`` is checked against
        the directory's (``bind_store``).
    """
    import os

    from effectgate.ledger._postgres import is_postgres_url, same_database

    env = os.environ.get(STORE_ENV) or ""
    for url in [*reversed(_given), *([env] if is_postgres_url(env) else [])]:
        try:
            if same_database(recorded, url):
                return url
        except ConfigError as exc:
            if url is env and _parses(recorded):
                # the variable itself is malformed: say so, not "needs a password"
                raise ConfigError(f"{STORE_ENV}: {exc}") from None
            continue  # the marker's damage is reported where the store is opened
    return recorded


def _parses(url: str) -> bool:
    from effectgate.ledger._postgres import parse_dsn

    try:
        parse_dsn(url)
    except ConfigError:
        return False
    return True
