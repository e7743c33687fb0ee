"""The retention tests run on both stores: the state directory's SQLite files, and PostgreSQL."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str | None:
    """``None`` (the SQLite files of the state directory) or a ``postgresql://`` URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgres_url"))
