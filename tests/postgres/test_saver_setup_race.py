"""Workers that open one new PostgreSQL checkpoint store at the same moment all get it."""

from __future__ import annotations

import threading

import psycopg
import pytest

from effectgate.graph._pg_saver import open_postgres_saver

pytestmark = pytest.mark.slow


def test_concurrent_setup_of_a_new_store_neither_deadlocks_nor_fails(postgres_url: str) -> None:
    """Four openers race on empty tables; every opener must get a working saver.

    Upstream's ``CREATE INDEX CONCURRENTLY`` waited for every open transaction,
    including an opener blocked on a lock behind it (a deadlock the server
    broke by failing one opener); the setup now builds its indexes inside its
    one transaction (``setup_checkpoint_tables``).
    """
    go = threading.Barrier(4)
    errors: list[BaseException] = []
    opened: list[bool] = []

    def open_one() -> None:
        try:
            go.wait()
            with open_postgres_saver(postgres_url) as saver:
                opened.append(saver.get_tuple({"configurable": {"thread_id": "x"}}) is None)
        except (psycopg.Error, threading.BrokenBarrierError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert opened == [True] * 4
