"""Parse an HTTP ``Retry-After`` header into a wait. Pure; shared by tools and the ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

__all__ = ["parse_retry_after"]

_MAX_WAIT = timedelta(days=1)
"""Longer hints are clamped: a server asking for more than a day is treated as a day."""


def parse_retry_after(value: str | None, now: datetime) -> timedelta | None:
    """Turn a ``Retry-After`` value into how long to wait from ``now``.

    Both forms of RFC 9110 §10.2.3 are accepted: a non-negative integer number
    of seconds (``"120"``) and an HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``).
    A date in the past gives a zero wait. Hints above one day are clamped to one
    day, so a confused server cannot park an operation for years.

    Args:
        value: the raw header value, or ``None`` when the header is absent.
        now: the current time, aware (a naive value is taken as UTC); only
            used for the HTTP-date form.

    Returns:
        The wait as a non-negative ``timedelta``, or ``None`` when the header is
        absent or unparseable (the caller then uses its own backoff).
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isdigit():
        return min(timedelta(seconds=int(text)), _MAX_WAIT)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        # The stdlib parser signals garbage with any of these, by Python version.
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return min(max(when - now, timedelta(0)), _MAX_WAIT)
