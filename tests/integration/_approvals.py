"""Record a review's approval straight into the ledger, as the review node would.

For tests that need an operation APPROVED whose effect has not run yet: the
state a crash right after the review was recorded leaves behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectgate.ledger import Approval, Ledger, OpenRequest


def record_approval(
    ledger: Ledger, action: Mapping[str, Any], *, thread_id: str, tool: str, reviewer: str = "t"
) -> None:
    """Open the operation of one ``action_requests`` entry and approve it (one transaction)."""
    ledger.record_review(
        [
            OpenRequest(
                operation_id=action["operation_id"],
                thread_id=thread_id,
                tool_call_id=action["tool_call_id"],
                tool=tool,
                tool_version="1",
                args=action["args"],
                intent_hash=action["intent_hash"],
            )
        ],
        [
            Approval(
                operation_id=action["operation_id"],
                thread_id=thread_id,
                tool_call_id=action["tool_call_id"],
                decision="approve",
                intent_hash=action["intent_hash"],
                reviewer=reviewer,
                decided_at=ledger.clock.now(),
            )
        ],
    )
