"""Whether a failed connection attempt to PostgreSQL will fail the same way again.

One rule, for the ledger (``PostgresLedgerStore``, ``probe_store``) and the
checkpoint pool (``open_postgres_saver``) alike: a refused login, a
``pg_hba.conf`` that lets the role in nowhere, or a database that does not
exist is bad input (``ConfigError``, exit 2, at once); a retry cannot cure
it. Only what a retry can cure (a server down, restarting, "starting up",
too many connections: SQLSTATE 53300) is left to the retry loops, which end
in ``DatabaseUnavailableError`` (exit 75).

libpq reports a failed connection attempt without a SQLSTATE (psycopg's
``OperationalError.sqlstate`` is ``None`` there: libpq keeps the server's
error fields to itself), so this reads, in order:

1. libpq's flag on the failed attempt (``exc.pgconn.needs_password``,
   ``PQconnectionNeedsPassword``): the server asked for a password and none
   was given (not in the URL, ``PGPASSWORD`` or ``~/.pgpass``);
2. the server's own FATAL answer, as libpq passed it on, for the SQLSTATEs
   below. The phrases are the server's (``src/backend/libpq/auth.c``,
   ``postinit.c``) in its default language; a server whose ``lc_messages``
   translates them is judged as before (a retry, then exit 75).
"""

from __future__ import annotations

import contextlib
import re

import psycopg

__all__ = ["connection_refusal"]

_REFUSALS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r'password authentication failed for user "([^"]*)"'),
        "28P01",
        "the server refused the login of role {role}: wrong password (or no such role)",
    ),
    (
        re.compile(r'pg_hba\.conf rejects connection for host "[^"]*", user "([^"]*)"'),
        "28000",
        "the server refused the login of role {role}: pg_hba.conf rejects it",
    ),
    (
        re.compile(r'no pg_hba\.conf entry for host "[^"]*", user "([^"]*)"'),
        "28000",
        "the server refused the login of role {role}: no pg_hba.conf line lets it in",
    ),
    (
        re.compile(r'role "([^"]*)" is not permitted to log in'),
        "28000",
        "the server refused the login of role {role}: the role may not log in (NOLOGIN)",
    ),
    (
        re.compile(r'role "([^"]*)" does not exist'),
        "28000",
        "the server refused the login of role {role}: no such role",
    ),
    (
        re.compile(r'database "([^"]*)" does not exist'),
        "3D000",
        "database {role} does not exist on the server",
    ),
)
_NO_PASSWORD = (
    "the server refused the login of role {role}: it needs a password and none was given "
    "(put it in the postgresql:// URL, e.g. in EFFECTGATE_STORE, or in PGPASSWORD or ~/.pgpass)"
)
_MEMO = "_effectgate_refusal"


def connection_refusal(exc: BaseException) -> str | None:
    """Say why a failed connection attempt will fail again, or ``None`` if a retry may cure it.

    Args:
        exc: any exception; only a psycopg ``OperationalError`` raised by a
            connection attempt (no SQLSTATE, ``exc.pgconn`` set and broken)
            can be a refusal.

    Returns:
        One phrase naming the role (or database) and the SQLSTATE, never the
        password, e.g. ``the server refused the login of role 'app': wrong
        password (or no such role) (SQLSTATE 28P01)``; ``None`` for anything
        else (a lost or refused TCP connection, a server starting up, too
        many connections, an error on a live connection).
    """
    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate:
        return None
    memo: object = getattr(exc, _MEMO, _MEMO)  # judged once: a retry loop asks twice
    if memo is not _MEMO:
        return memo if isinstance(memo, str) else None
    found = _judge(exc)
    with contextlib.suppress(AttributeError):
        setattr(exc, _MEMO, found)
    return found


def _judge(exc: psycopg.OperationalError) -> str | None:
    pgconn = getattr(exc, "pgconn", None)
    if pgconn is None or pgconn.status != psycopg.pq.ConnStatus.BAD:
        return None  # not a failed connection attempt
    if pgconn.needs_password:
        role = _user(pgconn)
        return f"{_NO_PASSWORD.format(role=repr(role) if role else '(default)')} (SQLSTATE 28P01)"
    text = str(exc)
    for pattern, state, reason in _REFUSALS:
        match = pattern.search(text)
        if match is not None:
            return f"{reason.format(role=repr(match[1]))} (SQLSTATE {state})"
    return None


def _user(pgconn: psycopg.pq.abc.PGconn) -> str:
    try:
        return (pgconn.user or b"").decode(errors="replace")
    except psycopg.OperationalError:
        return ""
