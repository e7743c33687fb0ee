"""``Recent``: the bounded dict behind the ledger memos and the resume shortcut."""

from __future__ import annotations

import threading

from effectgate._recent import Recent


def test_keeps_the_most_recently_set_keys() -> None:
    d: Recent[str, int] = Recent(3)
    for i, key in enumerate("abcd"):
        d[key] = i
    assert list(d) == ["b", "c", "d"]
    d["b"] = 10  # setting again makes it the newest
    d["e"] = 4
    assert list(d.items()) == [("d", 3), ("b", 10), ("e", 4)]


def test_threads_setting_and_popping_never_exceed_the_limit_or_raise() -> None:
    d: Recent[int, int] = Recent(50)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(5000):
                d[offset + i % 200] = i
                d.pop(offset + (i * 7) % 200, None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(d) <= 50
