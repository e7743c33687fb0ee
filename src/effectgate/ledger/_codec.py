"""Rows <-> records for the SQL stores, validating every column when loading.

Decoding is where corruption is caught (``from_row`` validates when
loading, not when a field is first read): an unknown state string, broken
JSON, an impossible time or a negative attempt raises ``LedgerCorruptError``
naming the operation and the column. Times are stored as integer
milliseconds since the Unix epoch; aware datetimes are floored to the
millisecond on the way in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from effectgate._intent import intent_hash_of_text
from effectgate.errors import LedgerCorruptError
from effectgate.ledger._model import (
    Approval,
    Budget,
    Event,
    EventKind,
    Lease,
    Operation,
    OpState,
    Receipt,
    ThreadEvent,
    ThreadRecord,
)
from effectgate.ledger._store import NewEvent

__all__ = [
    "APPROVAL_COLUMNS",
    "OPERATION_COLUMNS",
    "approval_from_row",
    "approval_to_row",
    "dumps",
    "event_from_row",
    "event_to_row",
    "from_ms",
    "lease_expiry_range",
    "lease_from_row",
    "ms_or_none",
    "operation_from_row",
    "operation_from_tuple",
    "operation_to_row",
    "receipt_from_json",
    "receipt_json",
    "state_or_corrupt",
    "thread_event_from_row",
    "thread_event_to_row",
    "thread_from_row",
    "thread_to_row",
    "to_ms",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_RECEIPT_SOURCES = frozenset({"dispatch", "reconcile", "human"})
_DECISIONS = frozenset({"approve", "edit", "reject"})

OPERATION_COLUMNS = (
    "operation_id",
    "thread_id",
    "tool_call_id",
    "tool",
    "tool_version",
    "args_json",
    "intent_hash",
    "state",
    "prev_state",
    "attempt",
    "max_attempts",
    "deadline_at_ms",
    "backoff_base_s",
    "backoff_cap_s",
    "next_attempt_at_ms",
    "claimed_by",
    "receipt_json",
    "error",
    "created_at_ms",
    "updated_at_ms",
    "recoveries",
)
APPROVAL_COLUMNS = (
    "operation_id",
    "thread_id",
    "tool_call_id",
    "decision",
    "intent_hash",
    "reviewer",
    "edited_args_json",
    "message",
    "decided_at_ms",
    "expires_at_ms",
)

T = TypeVar("T")
Row = Any
"""``sqlite3.Row`` (or any mapping by column name, for other backends)."""


def to_ms(value: datetime) -> int:
    """Encode an aware datetime as integer ms since the epoch (floored).

    Raises:
        ValueError: ``value`` is naive (its time zone would be a guess).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} given; the ledger needs aware times")
    return (value - _EPOCH) // _ONE_MS


def ms_or_none(value: datetime | None) -> int | None:
    """``to_ms`` that passes ``None`` through."""
    return None if value is None else to_ms(value)


def from_ms(value: int) -> datetime:
    """Decode integer ms since the epoch into an aware UTC datetime."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected integer milliseconds, got {type(value).__name__}")
    return _EPOCH + timedelta(milliseconds=value)


def dumps(value: Any) -> str:
    """Serialise JSON deterministically (sorted keys, no NaN, UTF-8 text)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _column(operation_id: str | None, column: str, decode: Callable[[Any], T], value: Any) -> T:
    try:
        return decode(value)
    except (ValueError, TypeError, OverflowError, KeyError) as exc:
        raise LedgerCorruptError(
            f"column {column} holds an invalid value ({exc})", operation_id=operation_id
        ) from exc


def state_or_corrupt(value: Any, operation_id: str) -> OpState:
    """Decode a state column; an unknown string is corruption, not a new state."""
    try:
        return OpState(value)
    except ValueError:
        raise LedgerCorruptError(
            f"unknown state {value!r} (this build knows {', '.join(OpState)})",
            operation_id=operation_id,
        ) from None


def _json_object(text: Any) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _readable_object(text: Any) -> dict[str, Any]:
    """A JSON object column that is audit text only (an event's detail, an edit's args).

    A value of another shape (a list, a string, invalid JSON: written by hand
    or by an older version) is kept readable as ``{"unreadable": why}``
    instead of making every read of the ledger fail: nothing decides on it,
    and ``effectgate ledger show`` must still show the rest.
    """
    try:
        return _json_object(text)
    except (ValueError, TypeError) as exc:
        shown = text if isinstance(text, str) else repr(text)
        clip = shown if len(shown) <= 80 else shown[:79] + "…"
        return {"unreadable": f"{exc}: {clip}"}


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value


def _optional(decode: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda value: None if value is None else decode(value)


def receipt_json(receipt: Receipt) -> str:
    """Encode a receipt as JSON text."""
    return dumps(
        {
            "operation_id": receipt.operation_id,
            "intent_hash": receipt.intent_hash,
            "attempt": receipt.attempt,
            "result": receipt.result,
            "reference": receipt.reference,
            "source": receipt.source,
            "recorded_at_ms": to_ms(receipt.recorded_at),
        }
    )


def _receipt(text: Any) -> Receipt:
    data = _json_object(text)
    if data["source"] not in _RECEIPT_SOURCES:
        raise ValueError(f"unknown receipt source {data['source']!r}")
    for key in ("operation_id", "intent_hash"):
        if not isinstance(data[key], str):
            raise TypeError(f"receipt {key} is not a string")
    return Receipt(
        operation_id=data["operation_id"],
        intent_hash=data["intent_hash"],
        attempt=_count(data["attempt"]),
        result=data["result"],
        reference=data["reference"],
        source=data["source"],
        recorded_at=from_ms(data["recorded_at_ms"]),
    )


def receipt_from_json(text: str) -> Receipt:
    """Decode a receipt written by ``receipt_json``.

    Raises:
        LedgerCorruptError: the text is not a valid receipt.
    """
    try:
        return _receipt(text)
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerCorruptError(f"undecodable receipt: {exc}") from exc


def operation_to_row(op: Operation) -> tuple[Any, ...]:
    """Encode an operation in ``OPERATION_COLUMNS`` order."""
    b = op.budget
    return (
        op.operation_id,
        op.thread_id,
        op.tool_call_id,
        op.tool,
        op.tool_version,
        dumps(dict(op.args)),
        op.intent_hash,
        op.state.value,
        None,
        op.attempt,
        b.max_attempts,
        ms_or_none(b.deadline_at),
        float(b.backoff_base_s),
        float(b.backoff_cap_s),
        ms_or_none(op.next_attempt_at),
        op.claimed_by,
        None if op.receipt is None else receipt_json(op.receipt),
        op.error,
        to_ms(op.created_at),
        to_ms(op.updated_at),
        op.recoveries,
    )


def operation_from_row(row: Row) -> Operation:
    """Decode and validate one operation row.

    Raises:
        LedgerCorruptError: a column holds a value this build cannot interpret.
    """
    oid = str(row["operation_id"])

    def col(name: str, decode: Callable[[Any], T]) -> T:
        return _column(oid, name, decode, row[name])

    time_or_none = _optional(from_ms)
    return Operation(
        operation_id=oid,
        thread_id=row["thread_id"],
        tool_call_id=row["tool_call_id"],
        tool=row["tool"],
        tool_version=row["tool_version"],
        args=col("args_json", _json_object),
        intent_hash=row["intent_hash"],
        state=state_or_corrupt(row["state"], oid),
        attempt=col("attempt", _count),
        budget=Budget(
            max_attempts=col("max_attempts", _count),
            deadline_at=col("deadline_at_ms", time_or_none),
            backoff_base_s=float(row["backoff_base_s"]),
            backoff_cap_s=float(row["backoff_cap_s"]),
        ),
        next_attempt_at=col("next_attempt_at_ms", time_or_none),
        claimed_by=row["claimed_by"],
        receipt=col("receipt_json", _optional(_receipt)),
        error=row["error"],
        created_at=col("created_at_ms", from_ms),
        updated_at=col("updated_at_ms", from_ms),
        recoveries=col("recoveries", _count),
    )


def operation_from_tuple(raw: Sequence[Any]) -> Operation:
    """``operation_from_row`` for a row given as a tuple in ``OPERATION_COLUMNS`` order.

    The same checks in one pass, without a mapping or a wrapper per column:
    a process's first listing of a long thread decodes every row. Any
    failure (or anything the fast pass does not expect) goes to
    ``operation_from_row``, which decodes the row again column by column and
    raises the error naming the column, exactly as before.

    Raises:
        LedgerCorruptError: as ``operation_from_row``.
    """
    try:
        return _operation_fast(raw)
    except Exception:  # noqa: BLE001 - the careful decoder below says what is wrong
        return operation_from_row(dict(zip(OPERATION_COLUMNS, raw, strict=True)))


def _operation_fast(raw: Sequence[Any]) -> Operation:
    (
        oid,
        thread_id,
        tool_call_id,
        tool,
        tool_version,
        args_json,
        intent_hash,
        state,
        _prev_state,
        attempt,
        max_attempts,
        deadline_at_ms,
        backoff_base_s,
        backoff_cap_s,
        next_attempt_at_ms,
        claimed_by,
        receipt_text,
        error,
        created_at_ms,
        updated_at_ms,
        recoveries,
    ) = raw
    oid = str(oid)
    op = Operation(
        operation_id=oid,
        thread_id=thread_id,
        tool_call_id=tool_call_id,
        tool=tool,
        tool_version=tool_version,
        args=_json_object(args_json),
        intent_hash=intent_hash,
        state=OpState(state),
        attempt=_count(attempt),
        budget=Budget(
            max_attempts=_count(max_attempts),
            deadline_at=None if deadline_at_ms is None else from_ms(deadline_at_ms),
            backoff_base_s=float(backoff_base_s),
            backoff_cap_s=float(backoff_cap_s),
        ),
        next_attempt_at=None if next_attempt_at_ms is None else from_ms(next_attempt_at_ms),
        claimed_by=claimed_by,
        receipt=None if receipt_text is None else _receipt(receipt_text),
        error=error,
        created_at=from_ms(created_at_ms),
        updated_at=from_ms(updated_at_ms),
        recoveries=_count(recoveries),
    )
    if intent_hash_of_text(tool, tool_version, args_json) == intent_hash:
        # The stored text is the arguments' canonical form and hashes to the
        # stored intent: the load check need not hash the decoded arguments.
        object.__setattr__(op, "intent_checked", True)
    return op


def approval_to_row(a: Approval) -> tuple[Any, ...]:
    """Encode an approval in ``APPROVAL_COLUMNS`` order."""
    edited = None if a.edited_args is None else dumps(dict(a.edited_args))
    return (
        a.operation_id,
        a.thread_id,
        a.tool_call_id,
        a.decision,
        a.intent_hash,
        a.reviewer,
        edited,
        a.message,
        to_ms(a.decided_at),
        ms_or_none(a.expires_at),
    )


def _decision(value: Any) -> Any:
    if value not in _DECISIONS:
        raise ValueError(f"unknown decision {value!r}")
    return value


def approval_from_row(row: Row) -> Approval:
    """Decode and validate one approval row."""
    oid = str(row["operation_id"])
    return Approval(
        operation_id=oid,
        thread_id=row["thread_id"],
        tool_call_id=row["tool_call_id"],
        decision=_column(oid, "decision", _decision, row["decision"]),
        intent_hash=row["intent_hash"],
        reviewer=row["reviewer"],
        edited_args=_optional(_readable_object)(row["edited_args_json"]),
        message=row["message"],
        decided_at=_column(oid, "decided_at_ms", from_ms, row["decided_at_ms"]),
        expires_at=_column(oid, "expires_at_ms", _optional(from_ms), row["expires_at_ms"]),
    )


def event_to_row(e: NewEvent) -> tuple[Any, ...]:
    """Encode an event to append (``seq`` is assigned by the database)."""
    return (
        e.operation_id,
        e.kind.value,
        None if e.src is None else e.src.value,
        None if e.dst is None else e.dst.value,
        e.attempt,
        to_ms(e.at),
        dumps(e.detail),
    )


def event_from_row(row: Row) -> Event:
    """Decode and validate one event row."""
    oid = str(row["operation_id"])
    state = _optional(lambda v: state_or_corrupt(v, oid))
    return Event(
        seq=row["seq"],
        operation_id=oid,
        kind=_column(oid, "kind", EventKind, row["kind"]),
        src=state(row["src"]),
        dst=state(row["dst"]),
        attempt=_column(oid, "attempt", _count, row["attempt"]),
        at=_column(oid, "at_ms", from_ms, row["at_ms"]),
        detail=_readable_object(row["detail_json"]),
    )


def thread_to_row(t: ThreadRecord) -> tuple[Any, ...]:
    """Encode a thread record."""
    return (t.thread_id, dumps(dict(t.input)), dumps(dict(t.metadata)), to_ms(t.created_at))


def thread_from_row(row: Row) -> ThreadRecord:
    """Decode and validate one thread record."""

    def col(name: str, decode: Callable[[Any], T]) -> T:
        try:
            return decode(row[name])
        except (ValueError, TypeError, OverflowError) as exc:
            raise LedgerCorruptError(f"thread {row['thread_id']!r}: column {name}: {exc}") from exc

    return ThreadRecord(
        thread_id=row["thread_id"],
        input=col("input_json", _json_object),
        metadata=col("metadata_json", _json_object),
        created_at=col("created_at_ms", from_ms),
    )


_MAX_TIME = datetime.max.replace(tzinfo=UTC)
_MIN_TIME = datetime.min.replace(tzinfo=UTC)
_MAX_MS = to_ms(_MAX_TIME)
_MIN_MS = to_ms(_MIN_TIME)
_INT64 = (-(2**63), 2**63 - 1)


def _lease_expiry(value: Any) -> datetime:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected integer milliseconds, got {type(value).__name__}")
    if value > _MAX_MS:
        return _MAX_TIME  # "never expires": held, and breakable by hand
    if value < _MIN_MS:
        return _MIN_TIME
    return from_ms(value)


def lease_expiry_range(expires_at: datetime) -> tuple[int, int]:
    """The stored ``expires_at_ms`` values that read back as ``expires_at`` (inclusive).

    One value, except at the ends of ``datetime``'s range, where every
    larger (smaller) stored value reads as ``datetime.max`` (``min``). A
    compare-and-set on a lease compares with this range.
    """
    ms = to_ms(expires_at)
    if ms >= _MAX_MS:
        return ms, _INT64[1]
    if ms <= _MIN_MS:
        return _INT64[0], ms
    return ms, ms


_MAX_TOKEN = 2**63 - 1
"""SQLite's and PostgreSQL's largest integer: a lease token there can never be raised."""


def lease_from_row(row: Row) -> Lease:
    """Decode one lease row; an expiry out of ``datetime``'s range is clamped to it.

    Raises:
        LedgerCorruptError: a column holds a value of the wrong type, or a
            token below 1 or at the largest integer (none could follow it).
    """
    thread = row["thread_id"]

    def col(name: str, decode: Callable[[Any], T]) -> T:
        try:
            return decode(row[name])
        except (ValueError, TypeError, OverflowError) as exc:
            raise LedgerCorruptError(f"lease of thread {thread!r}: column {name}: {exc}") from exc

    def token(value: Any) -> int:
        if _count(value) < 1:
            raise ValueError(f"expected a token >= 1, got {value!r}")
        if int(value) >= _MAX_TOKEN:  # no next token could be stored: a damaged row
            raise ValueError(f"token {value!r} leaves no room for the next holder's")
        return int(value)

    return Lease(
        thread_id=thread,
        owner=col("owner", _text),
        token=col("token", token),
        expires_at=col("expires_at_ms", _lease_expiry),
    )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def thread_event_to_row(e: ThreadEvent) -> tuple[Any, ...]:
    """Encode a thread event to append (``seq`` is assigned by the database)."""
    return (e.thread_id, e.kind, e.actor, to_ms(e.at), dumps(dict(e.detail)))


def thread_event_from_row(row: Row) -> ThreadEvent:
    """Decode and validate one thread event row."""
    thread = row["thread_id"]

    def col(name: str, decode: Callable[[Any], T]) -> T:
        try:
            return decode(row[name])
        except (ValueError, TypeError, OverflowError) as exc:
            raise LedgerCorruptError(f"thread {thread!r}: event column {name}: {exc}") from exc

    return ThreadEvent(
        seq=row["seq"],
        thread_id=thread,
        kind=col("kind", _text),
        actor=col("actor", _text),
        at=col("at_ms", from_ms),
        detail=col("detail_json", _json_object),
    )
