"""Time as a seam: a ``Clock`` protocol, the system clock, and a fake for tests."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock", "to_seconds"]


@runtime_checkable
class Clock(Protocol):
    """Where effectgate reads the time and waits (stamina's test affordances)."""

    def now(self) -> datetime:
        """Return the current time as an aware UTC ``datetime``."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (float seconds, >= 0)."""
        ...


class SystemClock:
    """The real clock: ``datetime.now(UTC)`` and ``time.sleep``."""

    def now(self) -> datetime:
        """Return the current time as an aware UTC ``datetime``."""
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (float seconds); negative values return at once."""
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to, or when something sleeps on it.

    Args:
        start: the initial time, aware; defaults to 2026-01-01T00:00:00Z.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()
        self.slept: list[float] = []
        """Every ``sleep`` call's argument, in seconds, in order."""

    def now(self) -> datetime:
        """Return the fake current time."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Record the wait and advance the fake time by it, without blocking."""
        with self._lock:
            self.slept.append(seconds)
            self._now += timedelta(seconds=max(0.0, seconds))

    def advance(self, delta: timedelta | float) -> None:
        """Move the fake time forward by ``delta`` (``timedelta`` or float seconds)."""
        with self._lock:
            self._now += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)


def to_seconds(value: timedelta | float) -> float:
    """Normalise a public duration argument (``timedelta`` or float seconds) to seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
