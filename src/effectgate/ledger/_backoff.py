"""Full-jitter backoff. Pure; the ledger applies budgets and deadlines around it."""

from __future__ import annotations

import math
import random

__all__ = ["full_jitter_delay"]

_MAX_DOUBLINGS = 64
"""Past this many doublings any sane cap has won; it also keeps ``2.0**n`` finite."""


def full_jitter_delay(attempt: int, *, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Return how long to wait before the attempt after ``attempt``, in seconds.

    The AWS "full jitter" formula: ``uniform(0, min(cap, base * 2**(attempt-1)))``.
    Spreading waits over the whole interval keeps many clients that failed
    together from retrying together.

    Args:
        attempt: attempts used so far, 1-based (1 after the first failure).
        base_s: the first interval's upper bound, in seconds, >= 0.
        cap_s: the largest upper bound, in seconds, >= 0.
        rng: the random source (inject a seeded one in tests).

    Returns:
        A delay in float seconds, ``0 <= delay <= min(cap_s, base_s * 2**(attempt-1))``.

    Raises:
        ValueError: ``attempt < 1``, or a negative or non-finite bound.

    Note:
        Marc Brooker, *Exponential Backoff And Jitter*, AWS Architecture Blog, 2015.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    for name, value in (("base_s", base_s), ("cap_s", cap_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    doublings = min(attempt - 1, _MAX_DOUBLINGS)
    # float multiplication saturates to inf instead of raising, so min() stays safe
    ceiling = min(cap_s, base_s * 2.0**doublings)
    return rng.uniform(0.0, ceiling)
