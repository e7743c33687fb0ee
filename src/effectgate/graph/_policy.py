"""Review policy: how long approvals last, what runs without asking, default budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from effectgate.ledger import Budget

__all__ = ["Policy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Rules the review node and effect nodes follow.

    Unsafe tools, possible duplicates of an earlier succeeded operation,
    calls whose operation id is bound to other arguments, repeats of a
    rejected call and calls a reviewer's edit replaced are never approved
    without a human, whatever this policy says.
    """

    approval_ttl: timedelta | None = timedelta(hours=1)
    """How long an approval authorises a first attempt; ``None``: no expiry."""
    budget: Budget = field(default_factory=Budget)
    """Stored with each new operation; never changed afterwards, not even by a restart."""
    auto_approve: frozenset[str] = frozenset()
    """Tool names approved without asking (never unsafe ones)."""
    reviewer: str = "reviewer"
    """Name recorded on approvals when the answer does not name one."""
    description_prefix: str = "Tool execution requires approval"
    max_repeats_after_reject: int = 2
    """How many times a call identical to one a reviewer rejected in the thread is
    shown again (flagged ``repeat_of_rejected``); after that the model is told
    not to propose it again and the run stops."""

    @property
    def approval_ttl_s(self) -> float | None:
        """``approval_ttl`` in seconds, or ``None``."""
        return None if self.approval_ttl is None else self.approval_ttl.total_seconds()
