"""Canonical JSON and the intent hash (docs/architecture.md, "Identities"): examples, laws."""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from effectgate._intent import default_operation_id, intent_hash_of_text
from effectgate.tools import canonical_json, intent_hash

CI = settings(max_examples=100, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": 1, "a": 2}, b'{"a":2,"b":1}'),
        ({"n": 10.0}, b'{"n":10}'),
        ({"n": -0.0}, b'{"n":0}'),
        ({"n": 0.1}, b'{"n":0.1}'),
        ({"n": 1e300}, b'{"n":1e+300}'),
        ({"s": "zürich ✓"}, '{"s":"zürich ✓"}'.encode()),
        ({"t": (1, 2)}, b'{"t":[1,2]}'),
        ({"z": {"y": [None, True, False]}}, b'{"z":{"y":[null,true,false]}}'),
        ([], b"[]"),
    ],
)
def test_canonical_examples(value: Any, expected: bytes) -> None:
    """Sorted keys, no whitespace, integral floats as integers, raw UTF-8."""
    assert canonical_json(value) == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(bad: float) -> None:
    """NaN and infinities have no canonical form and raise ValueError naming the path."""
    with pytest.raises(ValueError, match=r"args\.x\[1\]"):
        canonical_json({"args": {"x": [1, bad]}})
    with pytest.raises(ValueError):
        intent_hash("t", "1", {"x": bad})


@pytest.mark.parametrize("bad", [{1: "a"}, {"x": {1, 2}}, {"x": b"bytes"}, {"x": object()}])
def test_non_json_values_are_refused(bad: Any) -> None:
    """Non-string keys and non-JSON values raise TypeError instead of being coerced."""
    with pytest.raises(TypeError):
        canonical_json(bad)


def test_intent_hash_is_sha256_of_the_canonical_envelope() -> None:
    """The hash covers tool, tool_version and args, as 64 lowercase hex digits."""
    args = {"path": "a.txt", "content": "hi"}
    envelope = b'{"args":{"content":"hi","path":"a.txt"},"tool":"write_file","tool_version":"1"}'
    assert canonical_json({"tool": "write_file", "tool_version": "1", "args": args}) == envelope
    assert intent_hash("write_file", "1", args) == hashlib.sha256(envelope).hexdigest()


@pytest.mark.parametrize(
    ("tool", "version", "args"),
    [("write_file2", "1", {"x": 1}), ("write_file", "2", {"x": 1}), ("write_file", "1", {"x": 2})],
)
def test_any_part_of_the_intent_changes_the_hash(tool: str, version: str, args: Any) -> None:
    """A new tool name, tool version or argument value is a new intent."""
    assert intent_hash(tool, version, args) != intent_hash("write_file", "1", {"x": 1})


def test_default_operation_id() -> None:
    """The default idempotency key is "{thread_id}:{tool_call_id}"."""
    assert default_operation_id("thread-7", "call_abc") == "thread-7:call_abc"


@CI
@given(json_objects, st.integers(min_value=0, max_value=2**32))
def test_key_order_is_irrelevant(args: dict[str, Any], seed: int) -> None:
    """Reordering keys at every depth changes neither the bytes nor the hash."""
    shuffled = _shuffled(args, random.Random(seed))
    assert canonical_json(shuffled) == canonical_json(args)
    assert intent_hash("t", "1", shuffled) == intent_hash("t", "1", args)


@CI
@given(st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1))
def test_integral_float_equals_int(n: int) -> None:
    """10 and 10.0 are the same intent (JSON has one number type)."""
    assert intent_hash("t", "1", {"n": float(n)}) == intent_hash("t", "1", {"n": n})


@CI
@given(json_objects)
@example({"": ": "})
def test_canonical_bytes_round_trip(args: dict[str, Any]) -> None:
    """Canonical bytes parse back to an equal value and re-encode identically."""
    encoded = canonical_json(args)
    decoded = json.loads(encoded)
    assert decoded == args
    assert canonical_json(decoded) == encoded
    # No raw newline anywhere (JSON escapes them inside strings). The compact
    # separators are checked on fixed values: ": " may occur inside a string
    # value, as hypothesis found ({"": ": "}).
    assert b"\n" not in encoded


@CI
@given(json_objects, json_objects)
def test_different_values_hash_differently(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal canonical bytes if and only if equal hashes."""
    same_bytes = canonical_json(a) == canonical_json(b)
    assert same_bytes == (intent_hash("t", "1", a) == intent_hash("t", "1", b))


class _Text(str):
    pass


class _Number(int):
    pass


_unusual_leaves = (
    json_scalars
    | st.floats()  # NaN and infinities: refused
    | st.builds(_Text, st.text(max_size=4))
    | st.builds(_Number, st.integers(-5, 5))
    | st.just(object())
)
_any_values = st.recursive(
    _unusual_leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.integers(0, 3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _reference(value: Any) -> bytes:
    """The canonical form through the path-keeping normalisation alone."""
    from effectgate._intent import _normalize

    normalized = _normalize(value, "")
    text = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def _outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(value)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@CI
@given(_any_values)
def test_the_fast_path_gives_the_same_bytes_and_errors(value: Any) -> None:
    """Plain JSON skips the path-keeping walk; anything else takes it: same answer either way."""
    assert _outcome(canonical_json, value) == _outcome(_reference, value)


def test_plain_arguments_are_not_walked_with_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk that names an error's path runs only when there is something unusual."""
    from effectgate import _intent

    walked: list[str] = []
    real = _intent._normalize

    def counted(value: Any, path: str) -> Any:
        walked.append(path)
        return real(value, path)

    monkeypatch.setattr(_intent, "_normalize", counted)
    args = {"path": "a/b.txt", "content": "x", "n": 2.0, "tags": ["a", {"k": None}]}
    intent_hash("write_file", "1", args)
    assert walked == []
    with pytest.raises(ValueError, match=r"\.n\[0\]"):
        canonical_json({"n": [math.nan]})
    assert walked


@CI
@given(st.text(max_size=8), st.text(max_size=8), json_objects)
def test_the_hash_of_canonical_text_is_the_intent_hash(
    tool: str, version: str, args: dict[str, Any]
) -> None:
    """Stored canonical text hashes as its arguments do; a non-canonical layout does not."""
    text = canonical_json(args).decode()
    assert intent_hash_of_text(tool, version, text) == intent_hash(tool, version, args)
    if args:
        spaced = json.dumps(args, sort_keys=True, ensure_ascii=False, indent=1)
        assert intent_hash_of_text(tool, version, spaced) != intent_hash(tool, version, args)


def test_a_non_canonical_number_text_is_not_taken_for_its_value() -> None:
    """``1.0`` is the intent of ``1``, but its text is not canonical: no match from the text."""
    assert intent_hash_of_text("t", "1", '{"n":1.0}') != intent_hash("t", "1", {"n": 1.0})
    assert intent_hash_of_text("t", "1", '{"n":1}') == intent_hash("t", "1", {"n": 1.0})
