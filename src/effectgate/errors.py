"""Every exception effectgate raises, in one tree.

```
EffectgateError
├── ConfigError                 bad flags/env/state directory; raised before any I/O
│   ├── FollowUpError           a follow-up message cannot close what waits
│   └── MissingHookError        a middleware lacks the sync/async twin this run needs
├── OrphanedOperationError      a run ended with an operation waiting for nobody
├── LedgerError                 the ledger refused or failed; nothing new was committed
│   ├── LedgerBusyError         lock wait exceeded busy_timeout; retryable
│   │   └── DatabaseUnavailableError  connection lost or server down past the retry budget
│   ├── LedgerCorruptError      row fails validation (unknown state, bad hash, bad JSON)
│   ├── SchemaVersionError      database ahead of this build, or behind with migrations off
│   ├── IllegalTransitionError  (operation_id, src, dst); a programming error
│   └── ClaimLostError          compare-and-set lost; another worker holds attempt n
├── CheckpointCorruptError      a stored checkpoint cannot be read back (damaged bytes)
├── ThreadBusyError             another live runner holds the thread's lease
├── IntentConflictError         same operation_id, different intent_hash
├── ApprovalError               no usable approval for this exact call
│   ├── ApprovalExpiredError    the approval's expires_at has passed
│   └── ApprovalMismatchError   args (intent hash) differ from the approved ones
├── DecisionError               a review/reconciliation resume has the wrong shape
│   └── UnknownInterruptError   a resume map names no interrupt the thread waits on
├── ToolCallError               model produced an unknown tool or invalid arguments
├── WorkspaceError              path escapes the workspace
└── ToolError                   raised by tools, consumed by dispatch
    ├── Rejected                permanent; known not applied
    ├── NotAccepted             transient; known not applied; retry_after: timedelta | None
    └── OutcomeUnknown          may have applied (timeout, connection lost after send)
```

The errors a served run can end in while nothing is wrong with the request
(a busy thread or operation, the ledger failing) are also ``RuntimeError``s,
as a refused answer is a ``ValueError``: the LangGraph server shows the
message of a builtin exception type to the client and masks any other as
"An internal error occurred" (``langgraph_api.serde.default``).

Structured fields are keyword-only constructor arguments and the message is
built from them, so callers branch on attributes and classes, never on text
(httpx's exception tree). Errors that may cross a process boundary define
``__reduce__`` (DBOS ``DBOSMaxStepRetriesExceeded``). Retry hints are data on
the error (Temporal ``next_retry_delay``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = [
    "ApprovalError",
    "ApprovalExpiredError",
    "ApprovalMismatchError",
    "CheckpointCorruptError",
    "ClaimLostError",
    "ConfigError",
    "DatabaseUnavailableError",
    "DecisionError",
    "EffectgateError",
    "FollowUpError",
    "IllegalTransitionError",
    "IntentConflictError",
    "LedgerBusyError",
    "LedgerCorruptError",
    "LedgerError",
    "MissingHookError",
    "NotAccepted",
    "OperationBusyError",
    "OrphanedOperationError",
    "OutcomeUnknown",
    "Rejected",
    "SchemaVersionError",
    "ServiceStartError",
    "ThreadBusyError",
    "ToolCallError",
    "ToolError",
    "UnknownInterruptError",
    "WorkspaceError",
]


class EffectgateError(Exception):
    """Base class of every error effectgate raises on purpose."""


class ConfigError(EffectgateError):
    """Bad flags, environment or state directory; raised before any I/O."""


class FollowUpError(ConfigError, ValueError):
    """A follow-up message refused: something waits that the message cannot close.

    Raised by ``answers.follow_up_plan`` on every follow-up path
    (``Agent.send``, the agent node, ``EffectGateMiddleware.before_model``);
    the text names each waiting call (tool and operation id, state and
    attempt) or interrupt, and how to answer it.

    Attributes:
        started: ``(tool_call_id, operation_id)`` of each call refused
            because its operation may have started (empty when the refusal
            is for an interrupt or for calls ``supersede`` would close). The
            agent node sends these calls back to their effect nodes, which
            ask their verdicts again.
    """

    def __init__(self, message: str, *, started: tuple[tuple[str, str], ...] = ()) -> None:
        self.started = started
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_kw, (type(self), {"message": str(self), "started": self.started}))


class MissingHookError(ConfigError, NotImplementedError):
    """A middleware of the agent has a hook only in the other flavour (sync or async).

    LangChain's ``create_agent`` calls ``awrap_tool_call`` on every middleware
    that wraps tool calls when the run is async (``ainvoke``, ``astream``, and
    every run of ``langgraph dev``), and ``wrap_tool_call`` when it is sync;
    its default raises ``NotImplementedError`` without naming the middleware.
    ``EffectGateMiddleware.guard`` words it in one line naming the class and
    the method to add. Nothing ran for the call the hook was to wrap. A
    ``NotImplementedError`` (a ``RuntimeError``), so the LangGraph server
    passes its text to the client.

    Attributes:
        middleware: the class name of the middleware lacking the hook.
        missing: the method to add (``awrap_tool_call``, ``wrap_tool_call``, ...).
    """

    def __init__(self, message: str, *, middleware: str, missing: str) -> None:
        self.middleware = middleware
        self.missing = missing
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (type(self), self.args, {"middleware": self.middleware, "missing": self.missing}),
        )


class OrphanedOperationError(EffectgateError, RuntimeError):
    """A run ended while operations of its calls still wait for a person, with nothing pending.

    The review or reconciliation interrupt that should hold them was
    swallowed (a tool wrapper that catches ``Exception`` catches LangGraph's
    ``GraphInterrupt``). Nothing more runs for them; the text names each
    operation, its tool, state and attempt, and what to fix. A
    ``RuntimeError`` too: the LangGraph server (``langgraph dev``) passes the
    message of a ``RuntimeError`` to its client and replaces that of any
    class outside its list with "An internal error occurred"
    (``langgraph_api.serde.default``).

    Attributes:
        operation_ids: the operations left waiting, in ledger order.
    """

    def __init__(self, message: str, *, operation_ids: list[str]) -> None:
        self.operation_ids = operation_ids
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"operation_ids": self.operation_ids}))


class LedgerError(EffectgateError, RuntimeError):
    """The ledger refused or failed; nothing new was committed."""


class CheckpointCorruptError(EffectgateError):
    """A stored checkpoint of a thread could not be read back: its bytes are damaged.

    Raised by ``StepDurableSaver`` when LangGraph's deserializer fails on a
    row the file holds (bytes replaced, a wrong type tag), instead of the
    deserializer's own ``TypeError`` or ``KeyError``. The ledger is a separate
    file and still answers which effects happened.
    """

    def __init__(self, message: str, *, thread_id: str | None = None) -> None:
        self.thread_id = thread_id
        prefix = f"thread {thread_id!r}: " if thread_id else ""
        super().__init__(prefix + message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"thread_id": self.thread_id}))


class LedgerBusyError(LedgerError):
    """A lock wait exceeded the store's busy timeout; retrying later may succeed."""


class DatabaseUnavailableError(LedgerBusyError):
    """The database stayed out of reach for the whole retry budget; try again later.

    Raised when a connection was lost, the server shut down or restarted, or
    no connection could be had, and retrying on fresh connections for the
    store's retry budget did not get through. Nothing new was committed,
    unless the message says the outcome of a commit is unknown: then the
    next call reads what the ledger holds (the commit is never repeated
    blindly). The CLI ends with exit 75 (BUSY), as for any ``LedgerBusyError``.
    """


class LedgerCorruptError(LedgerError):
    """A stored row failed validation when loaded.

    Raised for an unknown state string, broken JSON, an intent hash that does
    not match the stored arguments, a receipt whose identity does not match its
    operation, or a file that is not a ledger database at all.
    """

    def __init__(self, message: str, *, operation_id: str | None = None) -> None:
        self.operation_id = operation_id
        prefix = f"operation {operation_id!r}: " if operation_id else ""
        super().__init__(prefix + message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"operation_id": self.operation_id}))


class SchemaVersionError(LedgerError):
    """The database schema is newer than this build, or older with migrations off."""

    def __init__(self, *, found: int, expected: int, path: str = "") -> None:
        self.found = found
        self.expected = expected
        self.path = path
        where = f" at {path}" if path else ""
        if found > expected:
            why = "it was written by a newer effectgate; upgrade effectgate to read it"
        else:
            why = "migrations are disabled; open it with migrate=True"
        super().__init__(
            f"ledger schema version {found}{where} does not match this build's {expected}: {why}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"found": self.found, "expected": self.expected, "path": self.path}
        return (_rebuild_kw, (type(self), kw))


class IllegalTransitionError(LedgerError):
    """A state change the transition table does not allow; a programming error."""

    def __init__(self, *, operation_id: str, src: str, dst: str) -> None:
        self.operation_id = operation_id
        self.src = src
        self.dst = dst
        super().__init__(f"operation {operation_id!r}: illegal transition {src} -> {dst}")

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"operation_id": self.operation_id, "src": self.src, "dst": self.dst}
        return (_rebuild_kw, (type(self), kw))


class ClaimLostError(LedgerError):
    """A compare-and-set lost: another worker holds the attempt, or this one is stale.

    ``attempt`` is the fencing token the caller presented; ``current_attempt``
    and ``current_state`` are what the ledger holds now.
    """

    def __init__(
        self,
        *,
        operation_id: str,
        attempt: int,
        current_attempt: int,
        current_state: str,
    ) -> None:
        self.operation_id = operation_id
        self.attempt = attempt
        self.current_attempt = current_attempt
        self.current_state = current_state
        super().__init__(
            f"operation {operation_id!r}: claim for attempt {attempt} lost; "
            f"ledger holds attempt {current_attempt} in state {current_state}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {
            "operation_id": self.operation_id,
            "attempt": self.attempt,
            "current_attempt": self.current_attempt,
            "current_state": self.current_state,
        }
        return (_rebuild_kw, (type(self), kw))


class ThreadBusyError(EffectgateError, RuntimeError):
    """Another live runner holds this thread's lease; two runs would fork it."""

    def __init__(self, *, thread_id: str, owner: str, expires_in_s: float) -> None:
        self.thread_id = thread_id
        self.owner = owner
        self.expires_in_s = expires_in_s
        hint = (
            f"; if that holder will not come back, 'effectgate lease break --thread "
            f"{thread_id} --reason TEXT' frees the thread"
            if expires_in_s > 3600
            else ""
        )
        super().__init__(
            f"thread {thread_id!r} is busy: held by {owner} "
            f"(lease expires in {expires_in_s:.1f} s unless renewed){hint}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"thread_id": self.thread_id, "owner": self.owner, "expires_in_s": self.expires_in_s}
        return (_rebuild_kw, (type(self), kw))


class OperationBusyError(EffectgateError, RuntimeError):
    """An operation this thread needs is in flight under a live worker of another thread.

    Raised by dispatch for a business-keyed operation (shared across threads)
    whose attempt another thread's worker started and may still be running:
    its outcome cannot be known yet. The run stops; resuming later continues.
    """

    def __init__(self, message: str, *, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_kw,
            (type(self), {"message": str(self), "operation_id": self.operation_id}),
        )


class ServiceStartError(EffectgateError, RuntimeError):
    """A demo service (ticket service, mail sink) did not start: it exited or never got ready."""


class IntentConflictError(EffectgateError):
    """The operation id is already bound to a different intent hash.

    Never reuse the old result for new arguments and never execute silently
    (docs/architecture.md, "Identities"). To perform a genuinely new action, use a new operation id.
    """

    def __init__(self, *, operation_id: str, stored_hash: str, new_hash: str) -> None:
        self.operation_id = operation_id
        self.stored_hash = stored_hash
        self.new_hash = new_hash
        super().__init__(
            f"operation {operation_id!r} is bound to intent {stored_hash[:12]}…, "
            f"refusing intent {new_hash[:12]}…: same operation, different arguments"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {
            "operation_id": self.operation_id,
            "stored_hash": self.stored_hash,
            "new_hash": self.new_hash,
        }
        return (_rebuild_kw, (type(self), kw))


class ApprovalError(EffectgateError):
    """There is no usable approval for this exact call; it goes back to review."""

    def __init__(self, message: str, *, operation_id: str) -> None:
        self.operation_id = operation_id
        super().__init__(f"operation {operation_id!r}: {message}")


class ApprovalExpiredError(ApprovalError):
    """The approval's ``expires_at`` has passed before the first attempt started."""


class ApprovalMismatchError(ApprovalError):
    """The approval was given for other arguments (a different intent hash)."""


class DecisionError(EffectgateError):
    """A resume value (review decisions or a reconciliation verdict) is malformed.

    Nothing is dispatched; the thread stays resumable with the same interrupt.
    """


class UnknownInterruptError(DecisionError, ValueError):
    """A resume map (``Command(resume={id: ...})``) names no interrupt the thread waits on.

    Raised by ``answers.check_resume_ids`` before anything is applied: the
    thread keeps waiting under the same interrupt ids, which the message
    names. A ``ValueError`` too, so that LangGraph's server reports its
    message to the client (it hides the text of other exception types).
    """


class ToolCallError(EffectgateError):
    """The model asked for an unknown tool or gave arguments its schema refuses."""

    def __init__(self, message: str, *, tool: str, tool_call_id: str | None = None) -> None:
        self.tool = tool
        self.tool_call_id = tool_call_id
        super().__init__(message)


class WorkspaceError(EffectgateError):
    """A path escapes the workspace (``..``, absolute, or a symlink pointing out)."""

    def __init__(self, message: str, *, path: str) -> None:
        self.path = path
        super().__init__(message)


class ToolError(EffectgateError):
    """Raised by a tool to tell dispatch what happened to the side effect."""


class Rejected(ToolError):
    """The external system refused for good; known not applied. Never retried."""


class NotAccepted(ToolError):
    """The external system did not accept the request; known not applied.

    ``retry_after`` is the server's hint (HTTP ``Retry-After``), or ``None``.
    """

    def __init__(self, message: str = "not accepted", *, retry_after: timedelta | None = None):
        self.retry_after = retry_after
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"retry_after": self.retry_after}))


class OutcomeUnknown(ToolError):
    """The request may have taken effect: a timeout or a connection lost after sending."""


def _rebuild(cls: type[Exception], args: tuple[Any, ...], kw: dict[str, Any]) -> Exception:
    return cls(*args, **kw)


def _rebuild_kw(cls: type[Exception], kw: dict[str, Any]) -> Exception:
    return cls(**kw)
