"""Bind a test's review answer to the one review its thread waits at.

Effectgate never guesses which review an answer is for; tests that answer
"whatever is pending now" say so explicitly, as ``--approve all`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectgate.graph import Agent


def bound(agent: Agent, thread_id: str, answer: Any) -> Any:
    """``answer`` pinned to the thread's pending review (unchanged if none or several)."""
    if not isinstance(answer, Mapping) or "interrupt_id" in answer:
        return answer
    reviews = [i for i in agent.status(thread_id).interrupts if i.kind == "review"]
    if len(reviews) != 1:
        return answer
    return {**answer, "interrupt_id": reviews[0].id}
