"""``bench_postgres.py --count``'s wire counter: a request after an answer is one round trip."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_postgres

        yield bench_postgres
    finally:
        sys.path.remove(str(BENCH))


def test_the_wire_counter_counts_each_request_answered(bench: Any, postgres_url: str) -> None:
    """Two statements are two round trips; a transaction around one is three; a pipeline one."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(postgres_url)
    wire = bench._WireCounter((str(parts.get("host")), int(parts.get("port") or 5432)))
    try:
        with psycopg.connect(wire.url(postgres_url), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            wire.on = True
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("SELECT x FROM t").fetchall()
            two = wire.round_trips
            with conn.transaction():
                conn.execute("INSERT INTO t VALUES (2)")
            three = wire.round_trips - two
            before = wire.round_trips
            with conn.pipeline():
                conn.execute("INSERT INTO t VALUES (3)")
                conn.execute("INSERT INTO t VALUES (4)")
            piped = wire.round_trips - before
            wire.on = False
            rows = conn.execute("SELECT x FROM t ORDER BY x").fetchall()
    finally:
        wire.close()
    assert rows == [(1,), (2,), (3,), (4,)]
    assert (two, three) == (2, 3)
    assert piped >= 1  # one sync; psycopg may flush a pipeline early, never less than one
    assert sum(wire.by_request.values()) == wire.round_trips
    assert any("BEGIN" in k for k in wire.by_request)
