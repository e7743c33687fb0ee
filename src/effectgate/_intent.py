"""Canonical JSON and the intent hash (docs/architecture.md). Pure; imported by ledger and tools.

Canonical form, close to RFC 8785 (JSON Canonicalization Scheme): object keys
sorted by code point, no insignificant whitespace, UTF-8 without escaping
non-ASCII, integral floats written as integers (``10.0`` -> ``10``, as
ECMAScript number formatting does), other floats in Python's shortest
round-trip ``repr``, ``-0.0`` written as ``0``. NaN and infinities are refused:
they have no JSON form and two NaNs never compare equal.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "default_operation_id", "intent_hash", "intent_hash_of_text"]

_MAX_EXACT_INT = 2**53


def _normalize(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{path or '$'}: {value!r} has no canonical JSON form")
        if value.is_integer() and abs(value) < _MAX_EXACT_INT:
            return int(value)
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path or '$'}: object key {key!r} is not a string")
            out[key] = _normalize(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{path or '$'}: {type(value).__name__} is not JSON-compatible")


class _Unusual(Exception):
    """A value ``_plain`` leaves to ``_normalize`` (which names the path of any error)."""


def _plain(value: Any) -> Any:
    """``_normalize`` for the values calls and ledger rows hold: exact JSON types.

    Same result as ``_normalize(value, "")`` whenever it returns; anything
    else (a subclass, a tuple, a non-string key, NaN) raises ``_Unusual`` and
    the caller starts over with ``_normalize``, which keeps the path of an
    error. It does not build a path string for every item, which was most of
    the cost of an intent hash.
    """
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Unusual
            out[key] = _plain(item)
        return out
    if kind is list:
        return [_plain(item) for item in value]
    if kind is float and math.isfinite(value):
        if value.is_integer() and abs(value) < _MAX_EXACT_INT:
            return int(value)
        return value
    raise _Unusual


def canonical_json(value: Any) -> bytes:
    """Serialize a JSON-compatible value to its canonical UTF-8 bytes.

    Args:
        value: ``None``, bool, int, float, str, lists/tuples and string-keyed
            mappings of these, nested to any depth.

    Returns:
        The canonical encoding; equal values give equal bytes.

    Raises:
        ValueError: a float is NaN or infinite.
        TypeError: a value or key is not JSON-compatible.

    Note:
        Number and key-order rules follow RFC 8785 (JCS) in spirit; strings use
        Python's JSON escaping, which is stable across versions.
    """
    try:
        normalized = _plain(value)
    except (_Unusual, RecursionError):
        normalized = _normalize(value, "")
    text = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def intent_hash(tool: str, tool_version: str, args: Mapping[str, Any]) -> str:
    """Hash what a call means: tool, tool version and normalized arguments.

    Args:
        tool: the tool's name.
        tool_version: the tool's declared version; a new version is a new intent.
        args: arguments already normalized by the tool's own schema.

    Returns:
        64 lowercase hex digits: SHA-256 of the canonical JSON of
        ``{"tool": tool, "tool_version": tool_version, "args": args}``.

    Raises:
        ValueError, TypeError: as ``canonical_json``.
    """
    payload = {"tool": tool, "tool_version": tool_version, "args": dict(args)}
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def intent_hash_of_text(tool: str, tool_version: str, args_text: str) -> str:
    """``intent_hash`` of arguments given as their canonical JSON text, without parsing it.

    ``canonical_json`` of the payload is its keys in order (``args``,
    ``tool``, ``tool_version``) around each value's own canonical text, so
    when ``args_text`` *is* ``canonical_json(args)`` the two functions agree.
    For any other text (another layout, ``1.0`` for ``1``) the result is some
    other hash: a caller checking a stored intent hash against stored text
    may take a match as proof and must fall back to ``intent_hash`` on a
    mismatch before concluding anything.

    Args:
        tool: the tool's name.
        tool_version: the tool's declared version.
        args_text: the arguments' JSON text, as stored.

    Returns:
        64 lowercase hex digits.
    """
    text = (
        '{"args":'
        + args_text
        + ',"tool":'
        + json.dumps(tool, ensure_ascii=False)
        + ',"tool_version":'
        + json.dumps(tool_version, ensure_ascii=False)
        + "}"
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def default_operation_id(thread_id: str, tool_call_id: str) -> str:
    """Return the default idempotency key of a call: ``"{thread_id}:{tool_call_id}"``."""
    return f"{thread_id}:{tool_call_id}"
