"""Test helpers shared by several test packages."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def damage_sqlite_arguments(ledger_file: Path | str, operation_id: str) -> None:
    """Change a stored operation's arguments behind the ledger's back (write-once triggers off).

    The row then fails the ledger's validation (its intent hash no longer
    matches its arguments), as a row changed outside effectgate or damaged
    storage would.
    """
    db = sqlite3.connect(str(ledger_file))
    try:
        with db:
            triggers = db.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"
            ).fetchall()
            for name, _ in triggers:
                db.execute(f'DROP TRIGGER "{name}"')
            db.execute(
                'UPDATE operations SET args_json = \'{"path": "elsewhere"}\' '
                "WHERE operation_id = ?",
                (operation_id,),
            )
            for _, sql in triggers:
                db.execute(sql)
    finally:
        db.close()


GARBAGE_JSON = "{not json"
"""What a damaged thread record's ``input_json`` holds."""


def damage_thread_record(store: Path | str, thread_id: str) -> None:
    """Replace a thread record's ``input_json`` with non-JSON text, behind the ledger's back.

    Args:
        store: a SQLite ledger file, or a ``postgresql://`` DSN of the ledger's schema.
        thread_id: the thread whose record is damaged.
    """
    if str(store).startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(str(store), autocommit=True) as conn:
            conn.execute(
                "UPDATE ledger_threads SET input_json = %s WHERE thread_id = %s",
                (GARBAGE_JSON, thread_id),
            )
        return
    db = sqlite3.connect(str(store))
    try:
        with db:
            db.execute(
                "UPDATE threads SET input_json = ? WHERE thread_id = ?", (GARBAGE_JSON, thread_id)
            )
    finally:
        db.close()


def damage_checkpoint(store: Path | str, thread_id: str) -> None:
    """Cut every stored checkpoint of a thread to its first bytes, as damaged storage would.

    LangGraph's deserializer then fails on them (``unexpected end of file`` on
    SQLite's msgpack blobs; ``invalid type Reserved`` on PostgreSQL's
    ``checkpoint_blobs`` and ``checkpoint_writes``, whose bytes become one
    byte msgpack reserves).

    Args:
        store: a SQLite checkpoint file, or a ``postgresql://`` DSN of the checkpoints' schema.
        thread_id: the thread whose checkpoints are damaged.
    """
    if str(store).startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(str(store), autocommit=True) as conn:
            changed = sum(
                conn.execute(
                    f"UPDATE {table} SET blob = '\\xc1'::bytea "
                    "WHERE thread_id = %s AND type = 'msgpack'",
                    (thread_id,),
                ).rowcount
                for table in ("checkpoint_blobs", "checkpoint_writes")
            )
        assert changed, f"thread {thread_id} has no msgpack checkpoint blob to damage"
        return
    db = sqlite3.connect(str(store))
    try:
        with db:
            changed = db.execute(
                "UPDATE checkpoints SET checkpoint = substr(checkpoint, 1, 10) WHERE thread_id = ?",
                (thread_id,),
            ).rowcount
        assert changed, f"thread {thread_id} has no checkpoint to damage"
    finally:
        db.close()
