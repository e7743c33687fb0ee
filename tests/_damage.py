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
