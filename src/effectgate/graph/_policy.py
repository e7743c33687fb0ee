"""Review policy: how long approvals last, what runs without asking, default budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from effectgate.ledger import Budget

__all__ = ["Policy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Rules the review node and effect nodes follow.

    Unsafe tools, possible duplicates of an earlier succeeded operation, and
    calls whose operation id is bound to other arguments are never approved
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

    @property
    def approval_ttl_s(self) -> float | None:
        """``approval_ttl`` in seconds, or ``None``."""
        return None if self.approval_ttl is None else self.approval_ttl.total_seconds()
