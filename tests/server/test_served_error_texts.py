"""What a LangGraph server's client is told when a served run ends in effectgate's errors.

The server (``langgraph_api.serde.default``) passes on the message of an
exception of a builtin type and replaces any other with "An internal error
occurred". A break test saw a second server's client get only that for an
operation in flight under the first server ("wait for it, then resume").
"""

from __future__ import annotations

import pytest
from langgraph_api.serde import default

from effectgate.errors import (
    DatabaseUnavailableError,
    FollowUpError,
    OperationBusyError,
    ThreadBusyError,
    UnknownInterruptError,
)


@pytest.mark.parametrize(
    "error",
    [
        OperationBusyError("operation 'op' is in flight: wait for it", operation_id="op"),
        ThreadBusyError(thread_id="t1", owner="w1", expires_in_s=12.0),
        DatabaseUnavailableError("no connection could be had"),
        FollowUpError("thread 't1' is waiting"),
        UnknownInterruptError("interrupt 'x' is not pending"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_client_gets_the_message(error: Exception) -> None:
    shown = default(error)
    assert shown == {"error": type(error).__name__, "message": str(error)}
