"""``open_agent(store="postgresql://...")``: the ledger and the checkpoints on one PostgreSQL.

Kept apart from ``_app`` so that the SQLite default never imports psycopg.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from effectgate.errors import ConfigError

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from effectgate._clock import Clock
    from effectgate.ledger import Ledger

__all__ = ["open_postgres_stores"]


def open_postgres_stores(
    stack: ExitStack, store: str, clock: Clock | None
) -> tuple[Ledger, BaseCheckpointSaver[Any]]:
    """Open a ``PostgresLedger`` and a ``StepDurablePostgresSaver`` on ``store``.

    Both use the database the URL names (and its ``search_path``, e.g.
    ``?options=-c%20search_path%3Dteam_a``); ``stack`` closes them.

    Args:
        stack: receives the close of both.
        store: a ``postgresql://`` (or ``postgres://``) URL.
        clock: the ledger's clock; ``None``: the database's (``DatabaseClock``).

    Returns:
        ``(ledger, checkpointer)``.

    Raises:
        ConfigError: ``store`` is not a PostgreSQL URL, the ``postgres`` extra
            is not installed, or the server cannot be used.
    """
    if not store.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"store {store.partition('://')[0]!r}: expected a postgresql:// URL "
            "(or no --store for the SQLite files of the state directory)"
        )
    try:
        import psycopg

        from effectgate.graph._pg_saver import open_postgres_saver
        from effectgate.ledger._postgres import PostgresLedger, redacted
    except ImportError as exc:
        raise ConfigError(
            f"a PostgreSQL store needs the postgres extra (pip install 'effectgate[postgres]'): "
            f"{exc}"
        ) from exc
    ledger = stack.enter_context(PostgresLedger(store, clock=clock))
    try:
        saver = stack.enter_context(open_postgres_saver(store))
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot use checkpoint database {redacted(store)}: {first}") from exc
    return ledger, saver
