"""Corrupt input: each kind gives its own error and changes nothing on disk."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate.errors import ConfigError, LedgerCorruptError, SchemaVersionError
from effectgate.ledger import OpState, SqliteLedger
from effectgate.ledger._migrations import LATEST_VERSION
from effectgate.testing import FakeClock
from effectgate.testing.ledger_conformance import make_approval, make_receipt, make_request

OP = "t1:c1"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def _tamper(path: Path, *statements: str) -> None:
    # A raw connection, as another tool or a bad disk would leave the file;
    # closing it checkpoints the WAL so the main file holds everything.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("DROP TRIGGER operations_identity_immutable")
    for statement in statements:
        conn.execute(statement)
    conn.close()


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    """A ledger holding one SUCCEEDED operation and one IN_FLIGHT one, closed."""
    path = tmp_path / "ledger.sqlite3"
    clock = FakeClock()
    with SqliteLedger(path, clock=clock) as ledger:
        for op_id in (OP, "t1:c2"):
            req = make_request(op_id)
            ledger.record_review([req], [make_approval(req, clock)])
            op = ledger.claim(op_id, attempt=1, worker="w1")
        first = ledger.get(OP)
        assert first is not None
        ledger.record_result(
            OP, attempt=1, state=OpState.SUCCEEDED, receipt=make_receipt(first, clock)
        )
    assert op.state is OpState.IN_FLIGHT
    return path


CORRUPTIONS = {
    "unknown state": (
        "UPDATE operations SET state = 'EXPLODED' WHERE operation_id = 't1:c1'",
        r"unknown state 'EXPLODED'",
    ),
    "broken args JSON": (
        "UPDATE operations SET args_json = '{\"path\": ' WHERE operation_id = 't1:c1'",
        r"column args_json",
    ),
    "broken receipt JSON": (
        "UPDATE operations SET receipt_json = '[1, 2' WHERE operation_id = 't1:c1'",
        r"column receipt_json",
    ),
    "bad datetime": (
        "UPDATE operations SET updated_at_ms = 99999999999999999 WHERE operation_id = 't1:c1'",
        r"column updated_at_ms",
    ),
    "negative attempt": (
        "UPDATE operations SET attempt = -1 WHERE operation_id = 't1:c1'",
        r"column attempt",
    ),
    "tampered args": (
        'UPDATE operations SET args_json = \'{"path":"/etc/passwd","content":""}\' '
        "WHERE operation_id = 't1:c1'",
        r"does not match the stored tool and arguments",
    ),
    "wrong intent hash": (
        f"UPDATE operations SET intent_hash = '{'0' * 64}' WHERE operation_id = 't1:c1'",
        r"does not match the stored tool and arguments",
    ),
    "foreign receipt": (
        "UPDATE operations SET receipt_json = json_set(receipt_json, '$.operation_id', 'x') "
        "WHERE operation_id = 't1:c1'",
        r"stored receipt belongs to operation 'x'",
    ),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_row_is_refused_and_nothing_changes(ledger_file: Path, kind: str) -> None:
    """Loading a corrupt row raises LedgerCorruptError naming the operation and the fault."""
    statement, message = CORRUPTIONS[kind]
    _tamper(ledger_file, statement)
    before, files = _digest(ledger_file), _files(ledger_file)
    with SqliteLedger(ledger_file) as ledger:
        calls: list[Callable[[], object]] = [
            lambda: ledger.get(OP),
            lambda: ledger.list(),
            lambda: ledger.claim(OP, attempt=2, worker="w2"),
            lambda: ledger.transition(OP, src=OpState.UNKNOWN, dst=OpState.FAILED),
        ]
        for call in calls:
            with pytest.raises(LedgerCorruptError, match=message) as info:
                call()
            assert info.value.operation_id == OP
        assert ledger.get("t1:c2") is not None  # other rows stay readable
    assert _digest(ledger_file) == before
    assert _files(ledger_file) == files


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corruption_after_a_listing_is_still_caught(ledger_file: Path, kind: str) -> None:
    """A row listed (and remembered) before it was corrupted is decoded and checked again."""
    statement, message = CORRUPTIONS[kind]
    with SqliteLedger(ledger_file) as ledger:
        first = ledger.list()
        assert ledger.list() == first
        assert [a is b for a, b in zip(ledger.list(), first, strict=True)] == [True, True]
        assert ledger.list(thread_id="t1") == first  # the thread's listing, kept incrementally
        conn = sqlite3.connect(ledger_file, isolation_level=None, timeout=10)
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("DROP TRIGGER operations_identity_immutable")
        conn.execute(statement)
        conn.close()
        with pytest.raises(LedgerCorruptError, match=message) as info:
            ledger.list()
        assert info.value.operation_id == OP
        with pytest.raises(LedgerCorruptError, match=message):
            ledger.list(thread_id="t1")
        (other,) = ledger.list(thread_id="t1", states=[OpState.IN_FLIGHT])
        assert other is first[1]  # the untouched row is still the remembered one


def test_a_row_changed_by_another_connection_is_read_afresh(ledger_file: Path) -> None:
    """Listing reuses nothing once another process changed the row."""
    with SqliteLedger(ledger_file) as reader, SqliteLedger(ledger_file) as writer:
        before = {op.operation_id: op for op in reader.list()}
        assert before["t1:c2"].state is OpState.IN_FLIGHT
        writer.recover_in_flight()
        after = {op.operation_id: op for op in reader.list()}
    assert after["t1:c2"].state is OpState.UNKNOWN
    assert after["t1:c1"] is before["t1:c1"]


def test_corrupt_in_flight_row_blocks_recovery_atomically(ledger_file: Path) -> None:
    """A corrupt IN_FLIGHT row makes recover_in_flight fail without recovering anything."""
    _tamper(ledger_file, "UPDATE operations SET args_json = '{}' WHERE operation_id = 't1:c2'")
    before = _digest(ledger_file)
    with SqliteLedger(ledger_file) as ledger, pytest.raises(LedgerCorruptError) as info:
        ledger.recover_in_flight()
    assert info.value.operation_id == "t1:c2"
    assert _digest(ledger_file) == before


def test_not_a_database_file(tmp_path: Path) -> None:
    """A file that is not SQLite is refused with its path, byte for byte untouched."""
    path = tmp_path / "ledger.sqlite3"
    path.write_bytes(b"this is a ledger? no, it is a shopping list\n" * 200)
    before = _digest(path)
    with pytest.raises(LedgerCorruptError, match="not a usable ledger database") as info:
        SqliteLedger(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert _digest(path) == before
    assert _files(path) == ["ledger.sqlite3"]


def test_someone_elses_sqlite_database(tmp_path: Path) -> None:
    """An SQLite database that is not a ledger is refused and left as it was."""
    path = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(LedgerCorruptError, match="not an effectgate ledger"):
        SqliteLedger(path)
    assert _digest(path) == before
    assert _files(path) == ["other.sqlite3"]


def test_schema_from_the_future(ledger_file: Path) -> None:
    """A schema version above this build's is refused with both versions, untouched."""
    conn = sqlite3.connect(ledger_file)
    conn.execute("INSERT INTO schema_version VALUES (?, 0)", (LATEST_VERSION + 1,))
    conn.commit()
    conn.close()
    before = _digest(ledger_file)
    with pytest.raises(SchemaVersionError) as info:
        SqliteLedger(ledger_file)
    assert (info.value.found, info.value.expected) == (LATEST_VERSION + 1, LATEST_VERSION)
    assert "newer effectgate" in str(info.value) and str(ledger_file) in str(info.value)
    assert _digest(ledger_file) == before


def test_migrations_off_refuses_an_unmigrated_file(tmp_path: Path) -> None:
    """With migrate=False an empty (version 0) file is refused instead of migrated."""
    path = tmp_path / "new.sqlite3"
    with pytest.raises(SchemaVersionError) as info:
        SqliteLedger(path, migrate=False)
    assert (info.value.found, info.value.expected) == (0, LATEST_VERSION)
    assert path.read_bytes() == b""
    with SqliteLedger(path) as ledger:
        assert ledger.list() == []
    with SqliteLedger(path, migrate=False) as ledger:
        assert ledger.list() == []


@pytest.mark.parametrize("where", ["dir", "missing-parent"])
def test_unusable_paths_are_config_errors(tmp_path: Path, where: str) -> None:
    """A directory or a path under a missing directory raises ConfigError with the path."""
    path = tmp_path if where == "dir" else tmp_path / "nope" / "ledger.sqlite3"
    with pytest.raises(ConfigError, match=str(path)):
        SqliteLedger(path)


def _stored_rows(path: Path) -> list[tuple[object, ...]]:
    from effectgate.ledger._sql import SQLITE

    conn = sqlite3.connect(path)
    try:
        return conn.execute(SQLITE.select_operations).fetchall()
    finally:
        conn.close()


def _decoded(decode: Callable[[], object]) -> tuple[str, object]:
    try:
        return "ok", decode()
    except Exception as exc:  # noqa: BLE001 - the outcome compared, whatever it is
        return type(exc).__name__, str(exc)


_JUNK: list[object] = [None, -1, 2**70, 1.5, "", "x", "{", "[]", '{"a": 1}', b"\x00", 10**20]


def test_the_one_pass_decoder_answers_as_the_careful_one(ledger_file: Path) -> None:
    """Every stored row, and every column of it replaced by junk: same operation or same error."""
    from effectgate.ledger import _codec as codec

    rows = _stored_rows(ledger_file)
    assert rows
    cases = list(rows)
    for row in rows:
        for i in range(len(row)):
            cases += [(*row[:i], junk, *row[i + 1 :]) for junk in _JUNK]
    cases += [rows[0][:-1]]  # a column short
    for raw in cases:

        def careful(raw: tuple[object, ...] = raw) -> object:
            return codec.operation_from_row(dict(zip(codec.OPERATION_COLUMNS, raw, strict=True)))

        assert _decoded(lambda raw=raw: codec.operation_from_tuple(raw)) == _decoded(careful)


def test_a_listing_decodes_rows_in_one_pass(
    ledger_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sound row is decoded without the per-column wrappers (a long thread's first listing)."""
    from effectgate.ledger import _codec as codec

    wrapped: list[str] = []
    real = codec._column

    def counted(operation_id: object, column: str, decode: object, value: object) -> object:
        wrapped.append(column)
        return real(operation_id, column, decode, value)  # type: ignore[arg-type]

    monkeypatch.setattr(codec, "_column", counted)
    with SqliteLedger(ledger_file) as ledger:
        ops = ledger.list(thread_id="t1")
    assert [op.operation_id for op in ops] == [OP, "t1:c2"]
    assert wrapped == []


def test_arguments_stored_in_another_layout_are_checked_by_their_value(
    ledger_file: Path,
) -> None:
    """Stored text that is not canonical (spaces, ``1.0``) but means the same passes the check.

    The decoder's shortcut (hash the stored text as it is) misses for such a
    row; the ledger then hashes the decoded arguments, which match.
    """
    _tamper(
        ledger_file,
        'UPDATE operations SET args_json = \'{ "content": "t1:c1", "path": "notes.txt" }\' '
        "WHERE operation_id = 't1:c1'",
    )
    with SqliteLedger(ledger_file) as ledger:
        op = ledger.get(OP)
        assert op is not None and not op.intent_checked
        assert op.args == {"content": "t1:c1", "path": "notes.txt"}
        clean = ledger.get("t1:c2")
        assert clean is not None and clean.intent_checked


def test_a_copy_with_other_arguments_is_checked_afresh(ledger_file: Path) -> None:
    """``dataclasses.replace`` never carries the decoder's mark to other arguments."""
    import dataclasses

    from effectgate.ledger._attempts import verified

    with SqliteLedger(ledger_file) as ledger:
        op = ledger.get(OP)
    assert op is not None and op.intent_checked
    forged = dataclasses.replace(op, args={"path": "/etc/passwd", "content": ""})
    assert not forged.intent_checked
    with pytest.raises(LedgerCorruptError, match="does not match the stored tool and arguments"):
        verified(forged)


@pytest.mark.parametrize(
    ("recoveries", "message"),
    [(2, r"2 attempts given back, but only 1 were ever started"), (11, r"recoveries 11 exceed")],
)
def test_attempts_given_back_beyond_what_happened_are_refused(
    ledger_file: Path, recoveries: int, message: str
) -> None:
    """A count of given-back attempts written by hand (guard trigger dropped) buys no attempts."""
    _tamper(
        ledger_file,
        "DROP TRIGGER operations_recoveries_grow",
        f"UPDATE operations SET recoveries = {recoveries}, attempt = MIN(attempt, "
        f"{1 if recoveries == 2 else 20}) WHERE operation_id = 't1:c1'",
    )
    with SqliteLedger(ledger_file) as ledger:
        with pytest.raises(LedgerCorruptError, match=message) as info:
            ledger.get(OP)
        assert info.value.operation_id == OP
