"""``Recent``: a dict that keeps only the most recently set keys."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Recent"]

K = TypeVar("K")
V = TypeVar("V")


class Recent(dict[K, V]):
    """A dict bounded to the ``limit`` keys set most recently (insertion order).

    Setting a key moves it to the newest end; past ``limit`` the oldest keys
    are dropped, oldest first, at O(1) per key. Safe to share between threads
    under the GIL: eviction tolerates keys another thread already removed.

    Args:
        limit: most keys kept (> 0).
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().pop(key, None)
        super().__setitem__(key, value)
        while len(self) > self.limit:
            try:
                old = next(iter(self))
            except StopIteration:
                break
            except RuntimeError:  # another thread changed the dict between iter() and next()
                continue
            super().pop(old, None)
