"""``PostgresLedgerStore``: the ledger on PostgreSQL, for many workers on many machines.

(Over 800 lines, for now: the session below, with its pipelining, replay on a
fresh connection and lookup of a lost commit, and the error mapping it rests
on are one argument, being changed on other branches; they move to a module
of their own once those land. Its SQL is in ``_sql``, its reads and writes in
``_sql_store``.)

The same ``LedgerStore`` seam as ``SqliteLedgerStore`` and the same
conformance suite (``effectgate.testing.ledger_conformance``); the ``Ledger``
facade above it is unchanged. psycopg 3 with a ``psycopg_pool`` pool of
autocommit connections; the store issues ``BEGIN``/``COMMIT`` itself.

Isolation: write transactions run at READ COMMITTED, read snapshots at
REPEATABLE READ READ ONLY. READ COMMITTED is enough for the protocol because
no decision the facade takes rests on a plain snapshot read:

- every state change is a conditional update, ``UPDATE ... WHERE state IN
  (...) AND attempt = n`` (the attempt is the fencing token). When two
  transactions race for one row the second waits for the first's row lock and
  PostgreSQL re-evaluates its ``WHERE`` against the row the first committed
  (the "EvalPlanQual" recheck of the PostgreSQL manual, "Transaction
  Isolation", 13.2.1), so exactly one claim of an attempt matches;
- an operation or lease read inside a write transaction is read ``FOR
  UPDATE``, so a check-then-write on it (budget, intent, lease owner and
  expiry) is made on the newest row, which no one else can change before the
  commit;
- write-once rows (operations, approvals, threads, leases) are inserted with
  ``ON CONFLICT DO NOTHING`` on their key and read back, which waits for a
  concurrent insert of the same key to commit or roll back.
- compaction locks the terminal rows it picks (``FOR UPDATE``, in id order)
  before it writes their tombstones and deletes them, so a concurrent writer
  of one of those rows waits and then finds it gone.

SERIALIZABLE would add nothing to these row-level rules and would make
transactions fail with serialization errors that the ``transaction()`` block
cannot replay. The read snapshot is REPEATABLE READ so that one ``read()``
block (metrics reads three aggregates) sees one consistent state.

Durability: a durable transaction commits with ``synchronous_commit = on``
(set on every pooled connection, whatever the server default); ``durable=False``
adds ``SET LOCAL synchronous_commit = off``. Such a commit is visible to every
session at once and survives the death of the worker; only a crash of the
database server can lose it, and only until the next synchronous commit on
the same server, which flushes the write-ahead log up to its own record and
so every earlier one (the PostgreSQL manual, "Asynchronous Commit", 30.4).
That is the argument ``synchronous=NORMAL`` makes on SQLite.

Leases are judged by the database's clock: ``PostgresLedger`` reads time from
a ``DatabaseClock`` (``clock_timestamp()`` on the server, advanced by the local
monotonic clock between re-reads), so workers on machines whose wall clocks
disagree, or jump, still agree on when a lease expires.

Events get their ``seq`` from an identity column: larger than every ``seq``
handed out before, and, for one operation, in commit order (each event is
appended under that operation's row lock). Across operations two concurrent
commits may become visible out of ``seq`` order.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from effectgate import _failpoints as failpoints
from effectgate._clock import Clock, to_seconds
from effectgate.errors import (
    ConfigError,
    DatabaseUnavailableError,
    LedgerBusyError,
    LedgerCorruptError,
    LedgerError,
    SchemaVersionError,
)
from effectgate.ledger import _codec as codec
from effectgate.ledger._backoff import full_jitter_delay
from effectgate.ledger._ledger import Ledger
from effectgate.ledger._model import (
    Lease,
)
from effectgate.ledger._postgres_login import connection_refusal
from effectgate.ledger._postgres_migrations import PG_LATEST_VERSION, PG_MIGRATIONS, VERSION_TABLE
from effectgate.ledger._sql import (
    PG_BEGIN_READ,
    PG_BEGIN_WRITE,
    PG_CLOCK,
    PG_COUNT_LEDGER_TABLES,
    PG_CREATE_SCHEMA,
    PG_CURRENT_SCHEMA,
    PG_HAS_TABLE,
    PG_MIGRATION_LOCK,
    PG_SCHEMA_LOCK,
    PG_SHOW_SEARCH_PATH,
    PG_TX_ID,
    PG_TX_PATH,
    PG_XACT_STATUS,
    POSTGRES,
)
from effectgate.ledger._sql_store import DecodedRows, SqlReader, SqlTransaction
from effectgate.ledger._store import (
    StoreReader,
    StoreTransaction,
)

__all__ = [
    "DEFAULT_RETRY_S",
    "DatabaseClock",
    "PostgresLedger",
    "PostgresLedgerStore",
    "check_connection",
    "is_postgres_url",
    "is_transient",
    "migrate_postgres_ledger",
    "parse_dsn",
    "redacted",
    "retry_transient",
    "same_database",
    "without_password",
]

# psycopg_pool warns of every failed reconnection, and psycopg of every error
# it ignores while closing a pipeline on a lost connection ("error ignored
# terminating <psycopg.Pipeline [BAD]>"); the store retries and says what
# matters in one error. With no logging configured, Python's last-resort
# handler would print each warning on stderr: a NullHandler on the "psycopg"
# logger (the parent of "psycopg.pool") keeps them for whoever configures
# logging (they still propagate) and off a bare stderr.
logging.getLogger("psycopg").addHandler(logging.NullHandler())

_BUSY_STATES = frozenset(
    {
        "55P03",  # lock_not_available (lock_timeout)
        "57014",  # query_canceled (statement_timeout)
    }
)
_CONFIG_CLASSES = ("08", "28", "3D", "42501")  # connection, authorization, no database, privilege


def is_postgres_url(value: str) -> bool:
    """Tell whether ``value`` names a PostgreSQL server (``postgresql://`` or ``postgres://``)."""
    return value.startswith(("postgresql://", "postgres://"))


def redacted(dsn: str) -> str:
    """Return ``dsn`` as ``host:port/dbname`` for messages: never the password.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.

    Returns:
        A short description such as ``127.0.0.1:5432/test``, or ``(unparsable DSN)``.
    """
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


def parse_dsn(dsn: str) -> dict[str, Any]:
    """Parse a libpq connection string or URL as libpq does (``conninfo_to_dict``).

    Returns:
        The connection parameters by name (``host``, ``port``, ``dbname``...).

    Raises:
        ConfigError: libpq cannot parse it (a bad percent-escape, an unknown
            parameter, a malformed URL); the message is libpq's and never
            repeats the string, which may hold a password.
    """
    try:
        return dict(conninfo_to_dict(dsn))
    except ValueError as exc:  # urllib's, e.g. "Invalid IPv6 URL": its text may echo the URL
        raise ConfigError(f"not a usable PostgreSQL URL: {type(exc).__name__}") from None
    except psycopg.ProgrammingError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"not a usable PostgreSQL URL: {_unquoted_secret(first, dsn)}") from exc


def _unquoted_secret(message: str, dsn: str) -> str:
    """``message`` with any quoted token that overlaps ``dsn``'s password left out.

    The password is read from the raw text between ``://`` and the last
    ``@`` (an unescaped ``/`` or ``@`` in it would end ``urlsplit``'s netloc
    early), and a token that holds any two characters of it in a row at its
    start or end (libpq quotes the rest of the URL from a bad escape on) is
    left out as well as one inside it.
    """
    rest = dsn.partition("://")[2]
    userinfo = rest.rpartition("@")[0]
    secret = userinfo.partition(":")[2]
    if not secret:
        return message

    def overlaps(token: str) -> bool:
        if token in secret or secret in token:
            return True
        for k in range(2, min(len(token), len(secret)) + 1):
            if token.startswith(secret[-k:]) or token.endswith(secret[:k]):
                return True
        return False

    return re.sub(
        r'"([^"]*)"', lambda m: '"(part of the password)"' if overlaps(m[1]) else m[0], message
    )


def _identity(dsn: str) -> dict[str, str]:
    parts = {k: str(v) for k, v in parse_dsn(dsn).items() if v is not None}
    parts.pop("password", None)
    parts.setdefault("port", "5432")
    return parts


def same_database(a: str, b: str) -> bool:
    """Tell whether two DSNs name the same server, database, user and options (password aside)."""
    return _identity(a) == _identity(b)


def without_password(dsn: str) -> str:
    """Return ``dsn`` as a ``postgresql://`` URL without its password (safe to write to a file)."""
    from urllib.parse import quote, urlencode

    parts = _identity(dsn)
    user = parts.pop("user", "")
    host = parts.pop("host", "localhost")
    port = parts.pop("port")
    dbname = parts.pop("dbname", "")
    auth = f"{quote(user, safe='')}@" if user else ""
    query = f"?{urlencode(parts, quote_via=quote)}" if parts else ""
    return f"postgresql://{auth}{host}:{port}/{quote(dbname, safe='')}{query}"


_TRANSIENT_STATES = frozenset(
    {
        "57P01",  # admin_shutdown: pg_terminate_backend, a fast or smart shutdown
        "57P02",  # crash_shutdown: another backend crashed, the server reset
        "57P03",  # cannot_connect_now: the server is starting up or shutting down
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
    }
)
_ROLLED_BACK_STATES = frozenset({"40001", "40P01"})
"""Transient errors of a live connection: the server aborted the transaction, said so."""

DEFAULT_RETRY_S = 5.0
"""How long a store keeps retrying a transient database error, in seconds (``retry_for``)."""
_RETRY_BASE_S = 0.05
_RETRY_CAP_S = 1.0


def is_transient(exc: BaseException) -> bool:
    """Tell whether ``exc`` is a passing database condition a retry on a fresh connection may cure.

    By SQLSTATE, never by message text: class 08 (connection exceptions),
    57P01/57P02/57P03 (the server ended the session: ``pg_terminate_backend``,
    a shutdown, a crash restart, "starting up"), 40001/40P01 (serialization
    failure, deadlock), an ``OperationalError`` without SQLSTATE (libpq lost
    the connection: "server closed the connection unexpectedly", "connection
    refused") and ``PoolTimeout`` (no connection could be had in time).
    ``PipelineAborted`` (a statement skipped after an earlier one failed) is not:
    the earlier error is the one to judge. Nor is a connection attempt the
    server refused for good (``connection_refusal``: a refused login, a
    ``pg_hba.conf`` reject, no such database): a retry would fail the same way.

    Only for a store that was opened once: at the first connection, libpq's
    errors carry no SQLSTATE at all (a wrong database name and a refused
    connection look alike), so ``PostgresLedgerStore`` reports them as
    ``ConfigError``.
    """
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.errors.PipelineAborted):
        return False
    state = exc.sqlstate or ""
    if state.startswith("08") or state in _TRANSIENT_STATES:
        return True
    return (
        isinstance(exc, psycopg.OperationalError) and not state and connection_refusal(exc) is None
    )


def _retry_budget(retry_for: timedelta | float | None) -> float:
    """Seconds of retrying: ``retry_for``, else ``EFFECTGATE_DB_RETRY_S``, else the default.

    Raises:
        ConfigError: the environment variable is not a number of seconds >= 0.
    """
    import os

    if retry_for is not None:
        return max(0.0, to_seconds(retry_for))
    raw = os.environ.get("EFFECTGATE_DB_RETRY_S")
    if raw is None:
        return DEFAULT_RETRY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"EFFECTGATE_DB_RETRY_S={raw!r}: expected seconds (a number >= 0)")
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _translate(exc: BaseException, where: str, *, opened: bool = True) -> Exception:
    """Map a psycopg error to the ledger's taxonomy by SQLSTATE, never by message text.

    Args:
        exc: the psycopg (or pool) error.
        where: ``redacted`` server and schema, for the message (never a password).
        opened: the store was opened once; then a lost connection is
            ``DatabaseUnavailableError`` (exit 75), not a ``ConfigError``.
    """
    refusal = connection_refusal(exc)
    if refusal is not None:  # at the first connection or any later one: a retry cannot cure it
        return ConfigError(f"cannot use ledger database {where}: {refusal}")
    if isinstance(exc, PoolTimeout):
        return DatabaseUnavailableError(
            f"ledger {where}: no database connection could be had in time (the server is "
            "down or restarting, or every pooled connection stayed in use); try again"
        )
    state = getattr(exc, "sqlstate", None) or ""
    if state in _BUSY_STATES or state in _ROLLED_BACK_STATES:
        return LedgerBusyError(f"ledger {where} stayed locked past the busy timeout ({state})")
    if opened and is_transient(exc):
        return DatabaseUnavailableError(
            f"ledger database {where} is unavailable ({_first_line(exc)}); try again"
        )
    if state.startswith(_CONFIG_CLASSES) or (
        isinstance(exc, psycopg.OperationalError) and not state
    ):
        return ConfigError(f"cannot use ledger database {where}: {_first_line(exc)}")
    if state.startswith("22") or state == "42P01":  # data exception, undefined table
        return LedgerCorruptError(f"ledger {where}: {exc}")
    return LedgerError(f"ledger {where}: database error {state or type(exc).__name__}: {exc}")


@contextmanager
def _translated(where: str, *, opened: bool = True) -> Iterator[None]:
    try:
        yield
    except (psycopg.Error, PoolTimeout) as exc:
        raise _translate(exc, where, opened=opened) from exc


def _gave_up(exc: BaseException, where: str, budget_s: float) -> Exception:
    """The error a caller gets when transient errors outlasted the retry budget."""
    state = getattr(exc, "sqlstate", None) or ""
    if state in _ROLLED_BACK_STATES:
        return _translate(exc, where)
    why = "no connection could be had" if isinstance(exc, PoolTimeout) else _first_line(exc)
    return DatabaseUnavailableError(
        f"PostgreSQL {where} stayed unavailable for {budget_s:g} s of retrying ({why}); "
        "nothing new was committed; try again"
    )


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """A pool's ``check``: never hand out a connection the server has already closed.

    ``ConnectionPool.check_connection`` (an empty query) costs a round trip
    on every checkout; this does it only when the socket is readable while
    the connection sits idle in the pool, which is what a server that ended
    the session leaves (its FATAL message and the end of the stream:
    ``pg_terminate_backend``, a shutdown or restart). A connection dropped
    without a word (a network cut) is found at its first statement instead,
    and the store retries that on a fresh connection.

    Raises:
        psycopg.Error: the connection is dead (the pool discards it and takes another).
    """
    import select

    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)


def retry_transient(
    call: Callable[[], Any],
    *,
    where: str,
    budget_s: float = DEFAULT_RETRY_S,
    rng: random.Random | None = None,
) -> Any:
    """Run ``call``; on a transient error (``is_transient``) run it again, with backoff.

    For calls that are safe to run again whatever the last one did (reads,
    idempotent upserts such as LangGraph's checkpoint writes). Full-jitter
    exponential backoff (``full_jitter_delay``), 50 ms base, 1 s cap, for at
    most ``budget_s`` seconds in all.

    Args:
        call: the work; it takes a connection of its own each time.
        where: ``redacted`` server, for the message.
        budget_s: seconds of retrying before giving up.
        rng: the jitter's random source.

    Returns:
        What ``call`` returns.

    Raises:
        DatabaseUnavailableError: still failing when the budget ran out.
        psycopg.Error: a non-transient error, as raised.
    """
    rng = rng or random.Random()
    deadline: float | None = None
    failures = 0
    while True:
        try:
            return call()
        except (psycopg.Error, PoolTimeout) as exc:
            if not is_transient(exc):
                raise
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + budget_s
            failures += 1
            if now >= deadline:
                raise _gave_up(exc, where, budget_s) from exc
            delay = full_jitter_delay(failures, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S, rng=rng)
            time.sleep(min(delay, max(0.0, deadline - now)))


class _Step(NamedTuple):
    """One statement of a session, as sent (and sent again on a fresh connection)."""

    query: Any
    params: Sequence[Any] | dict[str, Any] | None = None
    compare: bool = True
    """Its result must be the same when the block is replayed (not for the transaction id)."""


class _Result:
    """What a statement returned, read at once (a replay compares it with the first one)."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self.rowcount = cur.rowcount
        self.rows: list[Any] | None = cur.fetchall() if cur.description is not None else None

    def fetchall(self) -> list[Any]:
        """The rows (``[]`` for a statement that returns none)."""
        return self.rows or []

    def same(self, other: _Result) -> bool:
        """Whether ``other`` returned the same rows and row count."""
        return self.rowcount == other.rowcount and self.rows == other.rows


class _Diverged(Exception):
    """A replayed statement returned something else: the block cannot be resumed."""


class _Session:
    """One pooled connection whose ``BEGIN`` travels with the block's first statement.

    ``BEGIN`` (and the transaction's local settings) are queued in a psycopg
    pipeline with the first statement, so opening the transaction costs no
    round trip of its own (psycopg's "Pipeline mode support"; libpq's
    "Pipeline Mode"): the server runs them in order, the first statement
    inside the transaction, exactly as if they had been sent one by one. A
    write whose result nobody reads (an event insert, ``queue``) waits and
    travels the same way with the next statement or with the ``COMMIT``. A
    block that ran no statement sends nothing, not even ``COMMIT``.

    A ``single`` session (``PostgresLedgerStore.read(single=True)``) opens no
    transaction at all: its one statement runs alone on the autocommit
    connection, and a second statement is refused, because only the first
    would have a snapshot of its own.

    Transient errors (``is_transient``) are the session's to cure, in this
    one place every read and write of the store passes:

    - before ``COMMIT`` was sent nothing can have committed: the session
      takes a fresh connection (full-jitter backoff), sends every statement
      the block ran so far again, in order, and goes on only if each returns
      exactly what it returned the first time (the block's decisions rest on
      those answers); otherwise ``LedgerBusyError``, nothing committed;
    - a ``COMMIT`` whose answer was lost is never sent blindly again: the
      transaction's id, read with its first statement, is looked up
      (``pg_xact_status``): committed, the block is done; aborted, it is
      replayed and committed anew; still unknown when the budget ends,
      ``DatabaseUnavailableError`` says so. The id is looked up only if the
      server has not restarted since (``pg_postmaster_start_time``, read
      with it): after a crash the server hands out again the ids whose WAL
      it lost, so the status could be another transaction's; across a
      restart the outcome is unknown (``DatabaseUnavailableError``). A
      one-pipeline transaction whose id never came back is judged by its
      ``probe`` (the compare-and-set's row read again: is the new value
      there?) when it has one;
    - past the store's retry budget, ``DatabaseUnavailableError``.
    """

    __slots__ = (
        "_begin",
        "_committed",
        "_conn",
        "_deadline",
        "_failures",
        "_journal",
        "_queued",
        "_single",
        "_store",
        "_used",
        "_xid",
    )

    def __init__(
        self, store: PostgresLedgerStore, begin: Sequence[_Step], *, single: bool = False
    ) -> None:
        self._store = store
        self._begin: list[_Step] = list(begin)
        self._single = single
        self._used = False
        self._committed = False
        self._queued: list[_Step] = []
        self._journal: list[tuple[_Step, _Result]] = []
        self._conn: psycopg.Connection[Any] | None = None
        self._deadline: float | None = None
        self._failures = 0
        self._xid: tuple[str, str] | None = None

    # -- the block's calls -------------------------------------------------

    def execute(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> _Result:
        """Run one statement; what waits to be sent (``BEGIN``, queued writes) goes first.

        Raises:
            LedgerError: a second statement in a ``single`` session.
        """
        if self._single:
            if self._used:
                raise LedgerError(
                    "a single-statement ledger read ran a second statement; "
                    "reads that must agree need one snapshot (read() without single)"
                )
            self._used = True
        return self._run([*self._take(), _Step(query, params)])[-1]

    def queue(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        """Send this write with the transaction's next statement or its ``COMMIT``.

        For a statement whose result the caller never reads. It runs in the
        same transaction, in the same order relative to every other
        statement; an error it raises surfaces at that next statement or at
        the ``COMMIT``, and the block's transaction is rolled back as for any
        error.
        """
        self._queued.append(_Step(query, params))

    def execute_together(
        self, statements: Sequence[tuple[Any, Sequence[Any] | dict[str, Any]]]
    ) -> list[_Result]:
        """Run independent statements in one pipeline: one round trip for all of them.

        In a ``single`` session this is its one call, and each statement reads
        its own snapshot, as that many ``single`` reads would; inside a
        transaction they run in it, in order.

        Raises:
            LedgerError: a ``single`` session already ran its statement.
        """
        if not self._single:
            return [self.execute(query, params) for query, params in statements]
        if self._used:
            raise LedgerError("a single-statement ledger read ran a second statement")
        self._used = True
        return self._run([_Step(q, p) for q, p in statements], pipeline=True)

    def execute_and_commit(
        self,
        query: Any,
        params: Sequence[Any] | dict[str, Any] | None = None,
        *,
        probe: tuple[Any, Sequence[Any], list[Any]] | None = None,
    ) -> _Result:
        """Run a transaction of this one statement: ``BEGIN``, it and ``COMMIT`` in one pipeline.

        For a write whose outcome the caller reads only after the commit (a
        compare-and-set's row count): one round trip for the whole
        transaction. A failing statement aborts it: the server skips the
        ``COMMIT`` queued after it, the pipeline raises at its sync, and the
        store rolls the aborted transaction back as for any failed block.
        ``finish`` then sends nothing more.

        Args:
            query: the statement.
            params: its parameters.
            probe: ``(query, params, rows)``: a read that returns ``rows``
                exactly when this write took effect (the row holds the new
                value). Used only when the ``COMMIT``'s answer was lost; the
                result then has ``rowcount`` 1 if it did.

        Raises:
            LedgerError: the session already ran a statement (its transaction
                would commit the earlier ones unseen) or is ``single``.
        """
        if self._journal or self._single or self._queued or not self._begin:
            raise LedgerError("execute_and_commit must be a transaction's only statement")
        return self._run([*self._take(), _Step(query, params)], commit=True, probe=probe)[-1]

    def finish(self, statement: str) -> None:
        """``COMMIT`` (with the writes still queued) or ``ROLLBACK``, if a transaction began.

        A ``single`` session opened none (its statement ran in autocommit), so
        it sends nothing: a ``ROLLBACK`` there would cost a round trip and
        only draw the server's "there is no transaction in progress" warning.
        A ``ROLLBACK`` on a connection that was lost meanwhile is not needed
        (the server rolled back when it lost it) and is not retried.
        """
        if self._single or self._committed:
            return
        if statement == "COMMIT":
            if self._queued or self._journal:
                self._run(self._take(), commit=True)
            return
        self._queued.clear()
        if self._journal and self._conn is not None:
            try:
                self._conn.execute(statement)
            except psycopg.Error as exc:
                if not is_transient(exc):
                    raise

    def close(self) -> None:
        """Give the connection back: rolled back if a transaction is still open, kept if alive."""
        self._discard()

    # -- sending, and what a transient error does --------------------------

    def _take(self) -> list[_Step]:
        steps = self._begin + self._queued
        self._begin, self._queued = [], []
        return steps

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            store = self._store
            self._conn = store._live().getconn(timeout=min(store._busy_s, store._retry_s))
        return self._conn

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.info.transaction_status not in (
            psycopg.pq.TransactionStatus.IDLE,
            psycopg.pq.TransactionStatus.UNKNOWN,
        ):
            # a broken connection: the pool discards it; keep the first error
            with suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        self._store._pool.putconn(conn)

    def _send(
        self, conn: psycopg.Connection[Any], steps: Sequence[_Step], *, commit: bool, pipeline: bool
    ) -> list[_Result]:
        if len(steps) == 1 and not commit and not pipeline:
            return [_Result(conn.execute(steps[0].query, steps[0].params))]
        cursors: list[psycopg.Cursor[Any]] = []
        xid_at = next((i for i, s in enumerate(steps) if s.query is PG_TX_ID), None)
        if xid_at is not None:
            self._xid = None
        try:
            with conn.pipeline():
                for step in steps:
                    cursors.append(conn.execute(step.query, step.params))
                if commit:
                    conn.execute("COMMIT")
        finally:
            if xid_at is not None and xid_at < len(cursors):
                # the transaction's id, even if a later statement (the COMMIT) lost its answer
                with suppress(psycopg.Error):
                    row = cursors[xid_at].fetchone()
                    self._xid = None if row is None else (str(row[0]), str(row[-1]))
        return [_Result(cur) for cur in cursors]

    def _run(
        self,
        steps: list[_Step],
        *,
        commit: bool = False,
        pipeline: bool = False,
        probe: tuple[Any, Sequence[Any], list[Any]] | None = None,
    ) -> list[_Result]:
        while True:
            try:
                results = self._send(self._connection(), steps, commit=commit, pipeline=pipeline)
            except (psycopg.Error, PoolTimeout) as exc:
                if not is_transient(exc):
                    raise
                if commit and self._conn is not None and self._committed_anyway(exc, probe):
                    self._committed = True
                    return [_Probed() for _ in steps]
                self._recover(exc)
                continue
            self._journal.extend(zip(steps, results, strict=True))
            self._committed = commit
            return results

    def _pause(self, exc: BaseException) -> None:
        """Sleep the next full-jitter backoff; raise when the retry budget is spent."""
        store = self._store
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + store._retry_s
        self._failures += 1
        if now >= self._deadline:
            raise _gave_up(exc, store._where, store._retry_s) from exc
        delay = full_jitter_delay(
            self._failures, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S, rng=store._rng
        )
        time.sleep(min(delay, self._deadline - now))

    def _recover(self, exc: BaseException) -> None:
        """A fresh connection on which every statement the block ran so far ran again, alike."""
        while True:
            self._discard()
            self._pause(exc)
            try:
                conn = self._connection()
                if not self._journal:
                    return
                steps = [step for step, _ in self._journal]
                again = self._send(conn, steps, commit=False, pipeline=True)
            except (psycopg.Error, PoolTimeout) as retry_exc:
                if not is_transient(retry_exc):
                    raise
                exc = retry_exc
                continue
            for (step, first), second in zip(self._journal, again, strict=True):
                if step.compare and not first.same(second):
                    self._discard()
                    raise LedgerBusyError(
                        f"ledger {self._store._where}: the connection was lost mid-transaction "
                        "and the rows it had read changed before it could go on; nothing "
                        "was committed; try again"
                    ) from exc
            self._journal = list(zip(steps, again, strict=True))
            return

    def _committed_anyway(
        self, exc: BaseException, probe: tuple[Any, Sequence[Any], list[Any]] | None
    ) -> bool:
        """Whether a transaction whose ``COMMIT`` lost its answer committed (see the class).

        Returns ``False`` when it provably did not (the caller replays it).

        Raises:
            DatabaseUnavailableError: the outcome stayed unknown for the retry budget.
        """
        status_of = self._xid
        self._discard()
        if status_of is None and probe is None:
            raise DatabaseUnavailableError(
                f"ledger database {self._store._where}: the connection was lost while a "
                f"commit was sent ({_first_line(exc)}); whether it committed is unknown "
                "and it is not repeated blindly: the next call reads what the ledger holds"
            ) from exc
        while True:
            try:
                self._pause(exc)
            except DatabaseUnavailableError:
                raise DatabaseUnavailableError(
                    f"ledger database {self._store._where} stayed unavailable for "
                    f"{self._store._retry_s:g} s after the connection was lost while a "
                    f"commit was sent ({_first_line(exc)}); whether it committed is unknown "
                    "and it is not repeated blindly: the next call reads what the ledger holds"
                ) from exc
            try:
                status = self._looked_up(self._connection(), status_of, probe)
            except (psycopg.Error, PoolTimeout) as retry_exc:
                if not is_transient(retry_exc):
                    raise
                exc = retry_exc
                continue
            finally:
                self._discard()
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status == "restarted":
                # The server restarted (maybe crashed) since the transaction
                # began: an id whose WAL a crash lost is handed out again, so
                # its status may be another transaction's. Found by the
                # PostgreSQL fault campaign (restart-immediate).
                raise DatabaseUnavailableError(
                    f"ledger database {self._store._where} restarted while a commit was "
                    f"sent ({_first_line(exc)}); whether it committed cannot be told from "
                    "its transaction id and it is not repeated blindly: the next call "
                    "reads what the ledger holds"
                ) from exc
            if status is None:  # too old to be known (wraparound): cannot tell
                raise DatabaseUnavailableError(
                    f"ledger database {self._store._where}: whether a commit whose answer "
                    "was lost took effect cannot be told; the next call reads what the "
                    "ledger holds"
                ) from exc
            # "in progress": the old session has not ended yet; ask again

    def _looked_up(
        self,
        conn: psycopg.Connection[Any],
        status_of: tuple[str, str] | None,
        probe: tuple[Any, Sequence[Any], list[Any]] | None,
    ) -> str | None:
        """The lost commit's status: ``pg_xact_status`` of its id, or its probe's verdict.

        ``"restarted"`` when the server restarted since the transaction began
        (its id may have been handed out again); ``None`` when too old to know.
        """
        if status_of is not None:
            xid, started = status_of
            row = conn.execute(PG_XACT_STATUS, (started, xid)).fetchone()
            return None if row is None else row[0]  # type: ignore[no-any-return]
        assert probe is not None
        with conn.transaction():
            if self._store.schema is not None:
                conn.execute(PG_TX_PATH, (self._store.schema,))
            rows = conn.execute(probe[0], probe[1]).fetchall()
        return "committed" if [tuple(r) for r in rows] == probe[2] else "aborted"


class _Probed(_Result):
    """The result of a statement whose commit was proven by its probe (one row changed)."""

    def __init__(self) -> None:
        self.rowcount = 1
        self.rows = None


class _Reader(SqlReader):
    """Reads on one pooled connection inside a transaction the store opened."""

    sql = POSTGRES

    def __init__(self, conn: _Session, decoded: DecodedRows) -> None:
        super().__init__(decoded)
        self._conn = conn

    def _rows(self, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        return self._conn.execute(query, params).fetchall()

    def _rows_together(
        self, statements: Sequence[tuple[str, Sequence[Any] | dict[str, Any]]]
    ) -> list[list[Any]]:
        # one pipeline, one round trip, in a ``single`` read (``_Session.execute_together``)
        return [result.fetchall() for result in self._conn.execute_together(statements)]


class _Transaction(_Reader, SqlTransaction):
    """Reads and writes inside one READ COMMITTED transaction; rows it reads are locked."""

    def _execute(self, query: str, params: Sequence[Any] | dict[str, Any] = ()) -> int:
        return self._conn.execute(query, params).rowcount

    def _queue(self, query: str, params: Sequence[Any] | dict[str, Any]) -> None:
        # it travels with the next statement or the COMMIT (no round trip of its own)
        self._conn.queue(query, params)


class DatabaseClock:
    """The database server's clock, read locally: ``clock_timestamp()`` plus monotonic time.

    Every ``resync_s`` seconds (and on first use) it reads the server's
    ``clock_timestamp()`` and the local ``time.monotonic()`` around that
    round trip; in between, ``now()`` is the server time read plus the
    monotonic time elapsed since. So the time a lease is judged by is the
    database's, to within half a round trip, on every worker: a worker whose
    wall clock is off, or is stepped by NTP, still agrees with the others.
    (The monotonic clock's drift over ``resync_s`` is parts per million.)

    Args:
        read_server_time: returns the server's current time (aware UTC).
        resync_s: seconds between re-reads of the server time.
    """

    def __init__(self, read_server_time: Callable[[], datetime], *, resync_s: float = 30.0) -> None:
        self._read = read_server_time
        self._resync_s = resync_s
        self._lock = threading.Lock()
        self._anchor: tuple[float, datetime] | None = None

    def now(self) -> datetime:
        """Return the database server's current time as an aware UTC ``datetime``."""
        with self._lock:
            mono = time.monotonic()
            if self._anchor is None or mono - self._anchor[0] >= self._resync_s:
                before = time.monotonic()
                server = self._read()
                after = time.monotonic()
                self._anchor = ((before + after) / 2, server.astimezone(UTC))
                mono = time.monotonic()
            base_mono, base = self._anchor
        return base + timedelta(seconds=mono - base_mono)

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (float seconds); negative values return at once."""
        if seconds > 0:
            time.sleep(seconds)


def _tx_settings(*, durable: bool, busy_s: float, schema: str | None) -> _Step:
    """The first statement of a write transaction: its id and its local settings."""
    params = ("on" if durable else "off", str(int(busy_s * 1000)), schema)
    return _Step(PG_TX_ID, params, compare=False)


class _Schema:
    """The ledger's tables in one PostgreSQL schema: their version, the checks, the migrations.

    The one home of reading the recorded version and running
    ``PG_MIGRATIONS``: ``PostgresLedgerStore`` opens through it (always up
    to ``PG_LATEST_VERSION``), and so does ``migrate_postgres_ledger``, which
    may stop at an older version.
    """

    def __init__(self, where: str, schema: str | None, settings: _Step) -> None:
        self._where = where
        self._schema = schema
        self._settings = settings

    def prepare(
        self, conn: psycopg.Connection[Any], *, migrate: bool, to_version: int = PG_LATEST_VERSION
    ) -> int:
        """Check the schema, then migrate it up to ``to_version``; return the version it is at."""
        conn.execute(PG_BEGIN_READ)
        try:
            if self._schema is not None:
                conn.execute(PG_TX_PATH, (self._schema,))
            version = self.inspect(conn)
        finally:
            conn.execute("ROLLBACK")
        self.check(version, migrate=migrate)
        if version < to_version:
            return self.migrate(conn, to_version=to_version)
        return version

    def inspect(self, conn: psycopg.Connection[Any]) -> int:
        """Return the ledger schema version in the current schema; 0 for no ledger.

        Raises:
            ConfigError: no schema of ``search_path`` exists (PostgreSQL would
                refuse every ``CREATE TABLE`` with "no schema has been selected"),
                or ``ledger_*`` tables are there without a version table (not ours).
        """
        ((current,),) = conn.execute(PG_CURRENT_SCHEMA).fetchall()
        if current is None:
            ((path,),) = conn.execute(PG_SHOW_SEARCH_PATH).fetchall()
            raise ConfigError(
                f"{self._where}: no schema of search_path ({path}) exists: create it "
                "(CREATE SCHEMA) or name an existing one"
            )
        ((has_version,),) = conn.execute(PG_HAS_TABLE, (VERSION_TABLE,)).fetchall()
        if has_version:
            ((version,),) = conn.execute(POSTGRES.schema_version).fetchall()
            return int(version or 0)
        ((tables,),) = conn.execute(PG_COUNT_LEDGER_TABLES, ("ledger\\_%",)).fetchall()
        if tables:
            raise ConfigError(
                f"{self._where}: ledger_* tables without a {VERSION_TABLE} table; "
                "this schema was not made by effectgate: use another schema (search_path)"
            )
        return 0

    def check(self, version: int, *, migrate: bool) -> None:
        """Refuse a version newer than this build, or an older one when not migrating."""
        if version > PG_LATEST_VERSION or (version < PG_LATEST_VERSION and not migrate):
            raise SchemaVersionError(found=version, expected=PG_LATEST_VERSION, path=self._where)

    def migrate(self, conn: psycopg.Connection[Any], *, to_version: int) -> int:
        """Run the pending versions up to ``to_version`` in one transaction; return the version.

        Under the transaction-scoped migration lock, the version is read
        again (a worker starting at the same moment may have migrated
        meanwhile); each version's statements and its ``ledger_schema_version``
        row then commit together with the others, or not at all: a process
        killed at any moment in between (the ``MID_MIGRATION`` seam, passed
        after each version) leaves the schema at the version it had.
        """
        conn.execute(PG_BEGIN_WRITE)
        try:
            conn.execute(self._settings.query, self._settings.params)
            conn.execute(PG_MIGRATION_LOCK)
            # Re-read under the lock: another worker may have migrated meanwhile.
            version = self.inspect(conn)
            self.check(version, migrate=True)
            now_ms = time.time_ns() // 1_000_000
            for target in range(version + 1, to_version + 1):
                for statement in PG_MIGRATIONS[target]:
                    conn.execute(statement)
                conn.execute(POSTGRES.record_version, (target, now_ms))
                failpoints.hit(failpoints.Failpoint.MID_MIGRATION)
            conn.execute("COMMIT")
            return max(version, to_version)
        finally:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")


def migrate_postgres_ledger(dsn: str, *, to_version: int, schema: str | None = None) -> int:
    """Bring the ledger's tables at ``dsn`` up to ``to_version``, and no further.

    ``PostgresLedgerStore`` always migrates to ``PG_LATEST_VERSION`` when it
    opens; this runs the same migrations by the same path (one transaction
    under the migration lock, each version recorded once) but stops at an
    older version: how a test builds the schema an older release left, to
    upgrade it with a live older worker on it (tests/postgres/test_rolling_upgrade.py).
    A schema already at or past ``to_version`` is left as it is.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        to_version: the version to stop at, 1 to ``PG_LATEST_VERSION``.
        schema: the PostgreSQL schema of the tables (it must exist); ``None``:
            the connection's current schema.

    Returns:
        The version the schema is at afterwards.

    Raises:
        ValueError: ``to_version`` is not a version of this build.
        ConfigError, SchemaVersionError: as ``PostgresLedgerStore``.
    """
    if not 1 <= to_version <= PG_LATEST_VERSION:
        raise ValueError(f"to_version must be 1 to {PG_LATEST_VERSION}, not {to_version}")
    where = redacted(dsn) + (f" schema {schema}" if schema else "")
    settings = _tx_settings(durable=True, busy_s=30.0, schema=schema)
    with (
        _translated(where, opened=False),
        psycopg.connect(dsn, autocommit=True, connect_timeout=10, prepare_threshold=None) as conn,
    ):
        return _Schema(where, schema, settings).prepare(conn, migrate=True, to_version=to_version)


class PostgresLedgerStore:
    """The ledger's tables in a PostgreSQL schema, shared by any number of workers.

    Opening checks the schema before writing anything: a schema holding
    ``ledger_*`` tables without a version table, or a ledger whose version is
    newer than this build, is refused and left untouched. Migrations run in
    one transaction under an advisory lock, so workers starting together
    migrate once.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        schema: the PostgreSQL schema for the tables (created if missing);
            ``None`` uses the connection's current schema (``search_path``).
        migrate: bring an older schema up to date; with ``False`` an older
            (or empty) schema is refused instead.
        busy_timeout: how long a statement waits for a row lock, and a caller
            for a pooled connection, before ``LedgerBusyError``; ``timedelta``
            or float seconds.
        pool_size: the most connections this store opens (one per thread
            using it at the same moment).
        retry_for: once opened, how long a read or a transaction keeps
            retrying a transient database error (``is_transient``: a lost
            connection, a terminated backend, a restart) on fresh
            connections before ``DatabaseUnavailableError``; ``timedelta``
            or float seconds (default ``DEFAULT_RETRY_S``; the environment
            variable ``EFFECTGATE_DB_RETRY_S`` overrides the default).
        bound: the store was reached before (a state directory records it):
            its first connection is retried like any later one, for
            ``retry_for``, then ``DatabaseUnavailableError``. A server
            restarting as a worker starts is passing; only an address never
            reached may be a mistake. A connection the server refuses for
            good (``connection_refusal``: a refused login, no such database)
            is not retried, bound or not.

    No state is left on a connection between transactions (each sets its
    ``synchronous_commit``, ``lock_timeout`` and ``search_path`` locally,
    the advisory locks are transaction-scoped, no statement is prepared on
    the server), so the store also runs behind a transaction-mode pooler
    such as PgBouncer (docs/postgres.md).

    Raises:
        ConfigError: the server refuses the login or the database (at once,
            ``bound`` or not), or cannot be reached at this first connection
            (libpq's errors carry no SQLSTATE then: a wrong port and a stopped
            server look alike), unless ``bound``.
        DatabaseUnavailableError: ``bound``, and no connection could be had
            within ``retry_for``.
        ConfigError: the schema holds ledger tables but no version table (not ours).
        SchemaVersionError: the schema is newer than this build, or older with
            ``migrate=False``.
    """

    THREADS_TABLE = POSTGRES.threads
    """The table of thread records (named when one of them is damaged)."""

    durable_leases = True
    """Lease writes commit at ``synchronous_commit = on`` (``_threads.durable_leases``).

    A server crash loses asynchronous commits while the workers that saw them
    live on: a lost takeover or renewal would let two runners onto one thread.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        migrate: bool = True,
        busy_timeout: timedelta | float = 30.0,
        pool_size: int = 4,
        retry_for: timedelta | float | None = None,
        bound: bool = False,
    ) -> None:
        self.dsn = dsn
        """The connection string (it may hold a password: show ``redacted(dsn)``)."""
        self.schema = schema
        """The PostgreSQL schema of the tables, or ``None`` for the current one."""
        self._where = redacted(dsn) + (f" schema {schema}" if schema else "")
        self._busy_s = to_seconds(busy_timeout)
        self._retry_s = _retry_budget(retry_for)
        self._rng = random.Random()
        self._decoded = DecodedRows()
        self._closed = False
        try:
            conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"not a PostgreSQL connection string: {exc}") from exc
        with _translated(self._where, opened=False):
            # One plain connection first: an unreachable server fails at once
            # (the pool would retry until its timeout), and nothing is pooled
            # before the schema is known to be ours. A bound store's is retried
            # (each try in one transaction: a repeat after a cut is harmless).
            if bound:
                retry_transient(
                    lambda: self._first_connection(migrate=migrate),
                    where=self._where,
                    budget_s=self._retry_s,
                    rng=self._rng,
                )
            else:
                self._first_connection(migrate=migrate)
            self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                dsn,
                min_size=1,
                max_size=max(1, pool_size),
                # No server-side prepared statements: behind a transaction
                # pooler the next statement may meet another server session.
                kwargs={"autocommit": True, "prepare_threshold": None},
                check=check_connection,
                timeout=self._busy_s,
                # A pool that gives up reconnecting soon is refilled on demand,
                # at the pace of the callers' own backoff, once the server is back.
                reconnect_timeout=max(1.0, self._retry_s),
                open=False,
                name="effectgate-ledger",
            )
            try:
                self._pool.open(wait=True, timeout=self._busy_s)
            except BaseException:
                self._pool.close()
                raise

    def _first_connection(self, *, migrate: bool) -> None:
        """Check (and migrate) the schema on one plain connection of its own."""
        with psycopg.connect(
            self.dsn, autocommit=True, connect_timeout=10, prepare_threshold=None
        ) as conn:
            if self.schema is not None:
                # a transaction-scoped lock: nothing held across
                # transactions, so it holds behind a transaction pooler
                with conn.transaction():
                    conn.execute(PG_SCHEMA_LOCK)
                    conn.execute(pgsql.SQL(PG_CREATE_SCHEMA).format(pgsql.Identifier(self.schema)))
            self._prepare(conn, migrate=migrate)

    def _settings(self, *, durable: bool = True) -> _Step:
        return _tx_settings(durable=durable, busy_s=self._busy_s, schema=self.schema)

    def _prepare(self, conn: psycopg.Connection[Any], *, migrate: bool) -> None:
        _Schema(self._where, self.schema, self._settings()).prepare(conn, migrate=migrate)

    def _live(self) -> ConnectionPool[psycopg.Connection[Any]]:
        if self._closed:
            raise LedgerError(f"ledger {self._where} is closed")
        return self._pool

    @contextmanager
    def _connection(self, begin: Sequence[_Step], *, single: bool = False) -> Iterator[_Session]:
        session = _Session(self, begin, single=single)
        try:
            yield session
        finally:
            session.close()

    @contextmanager
    def read(self, *, single: bool = False) -> Iterator[StoreReader]:
        """Open a REPEATABLE READ, READ ONLY snapshot on a pooled connection.

        Args:
            single: the block makes one reader call (each is one statement).
                It then runs alone on the autocommit connection, without
                ``BEGIN`` and ``ROLLBACK``: one round trip instead of two.
                That loses no consistency, because every statement reads one
                snapshot taken at its start (the PostgreSQL manual,
                "Transaction Isolation", 13.2.1), and no write or lock is at
                stake (a read block takes no row locks). Several calls that
                must agree (``Ledger.metrics``, the attempt-holder check) keep
                the REPEATABLE READ snapshot; a second statement in a
                ``single`` block raises ``LedgerError`` rather than read a
                second state.
        """
        if self.schema is not None:
            # the schema is set inside a transaction (no session state): a
            # statement of its own cannot be alone
            single = False
        begin = [_Step(PG_BEGIN_READ)]
        if self.schema is not None:
            begin.append(_Step(PG_TX_PATH, (self.schema,)))
        with (
            _translated(self._where),
            self._connection([] if single else begin, single=single) as conn,
        ):
            yield _Reader(conn, self._decoded)
            conn.finish("ROLLBACK")

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[StoreTransaction]:
        """Open a READ COMMITTED transaction, committed when the block exits normally.

        Args:
            durable: ``True`` commits with ``synchronous_commit = on`` (the
                server has flushed the commit to its write-ahead log before
                return). ``False`` commits with ``synchronous_commit = off``:
                visible at once, flushed by the server within a few hundred
                milliseconds or by the next synchronous commit, whichever is first.

        Raises:
            LedgerBusyError: a row lock or a pooled connection was not had in
                time, or the server broke a deadlock by aborting this transaction.
        """
        begin = [_Step(PG_BEGIN_WRITE), self._settings(durable=durable)]
        with _translated(self._where), self._connection(begin) as conn:
            yield _Transaction(conn, self._decoded)
            conn.finish("COMMIT")

    def compare_and_set_lease(self, lease: Lease, *, expected: Lease) -> bool:
        """The lease compare-and-set as one durable transaction in one round trip.

        ``BEGIN``, the local settings (``synchronous_commit = on``: see
        ``durable_leases``), the conditional ``UPDATE`` and ``COMMIT`` travel
        in one pipeline (see ``LedgerStore.compare_and_set_lease``): the same
        statement, the same row lock and the same commit as ``put_lease``
        inside ``transaction()``, without the read before it.

        Raises:
            LedgerBusyError: the row lock or a pooled connection was not had in time.
        """
        low, high = codec.lease_expiry_range(expected.expires_at)
        params = (
            lease.owner,
            lease.token,
            codec.to_ms(lease.expires_at),
            lease.thread_id,
            expected.owner,
            expected.token,
            low,
            high,
        )
        # If the COMMIT's answer is lost: the row holding the new lease proves it committed.
        probe = (POSTGRES.lease_row, (lease.thread_id,), [params[:3]])
        begin = [_Step(PG_BEGIN_WRITE), self._settings(durable=self.durable_leases)]
        with _translated(self._where), self._connection(begin) as conn:
            return conn.execute_and_commit(POSTGRES.update_lease, params, probe=probe).rowcount == 1

    def server_time(self) -> datetime:
        """Return the database server's current time (``clock_timestamp()``), aware UTC."""
        with _translated(self._where), self._connection([], single=True) as conn:
            ((now,),) = conn.execute(PG_CLOCK).fetchall()
        return now.astimezone(UTC)  # type: ignore[no-any-return]

    def database_clock(self, *, resync_s: float = 30.0) -> Clock:
        """Return a ``DatabaseClock`` reading this store's server (see there)."""
        return DatabaseClock(self.server_time, resync_s=resync_s)

    def close(self) -> None:
        """Close the pool; idempotent. Later calls raise ``LedgerError``."""
        if not self._closed:
            self._closed = True
            self._pool.close()


class PostgresLedger(Ledger):
    """A ``Ledger`` over PostgreSQL (``PostgresLedgerStore``), on the database's clock.

    Args:
        dsn: a libpq connection string or ``postgresql://`` URL.
        schema: the PostgreSQL schema for the tables; ``None``: the current one.
        clock: where "now" comes from; by default the store's ``DatabaseClock``,
            so every worker judges leases by the server's time.
        migrate: bring an older schema up to date (else refuse it).
        busy_timeout: row-lock and pool wait before ``LedgerBusyError``;
            ``timedelta`` or float seconds.
        pool_size: the most connections the store opens.
        rng: the random source for backoff jitter.
        retry_for: how long a transient database error is retried (see
            ``PostgresLedgerStore``); ``None``: ``EFFECTGATE_DB_RETRY_S`` or 5 s.
        bound: the store was reached before; its first connection is retried
            too (see ``PostgresLedgerStore``).

    Raises:
        ConfigError, LedgerCorruptError, SchemaVersionError, DatabaseUnavailableError:
            as ``PostgresLedgerStore``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        clock: Clock | None = None,
        migrate: bool = True,
        busy_timeout: timedelta | float = 30.0,
        pool_size: int = 4,
        rng: random.Random | None = None,
        retry_for: timedelta | float | None = None,
        bound: bool = False,
    ) -> None:
        store = PostgresLedgerStore(
            dsn,
            schema=schema,
            migrate=migrate,
            busy_timeout=busy_timeout,
            pool_size=pool_size,
            retry_for=retry_for,
            bound=bound,
        )
        super().__init__(store, clock=clock or store.database_clock(), rng=rng)
