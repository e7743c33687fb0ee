"""The offline model's script format: what a script may hold, and where one is loaded from.

A script is ``{"name": str, "turns": [...], "final"?: str, "followups"?: [...]}``
(docs/cli.md, "The scripted model"). :func:`validate_script` checks its shape once, when it is
loaded; :class:`effectgate.models.ScriptedChatModel` plays it;
:func:`load_script` reads it from a packaged name (``"incident"``) or a
``.yaml``/``.yml``/``.json`` file. This module imports neither the model nor
the model factory, so both import it and not each other.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from effectgate._intent import canonical_json
from effectgate._untrusted import parse_json, parse_yaml, read_regular_file
from effectgate.errors import ConfigError

__all__ = ["DEFAULT_FINAL", "load_script", "validate_script"]

DEFAULT_FINAL = "Done."
"""Final answer once the script has no turn left, unless the script sets ``final``."""

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_TEMPLATE_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_REF_RE = re.compile(r"result(\.[^\s.{}]+){1,}")
_SUCCESS = frozenset({"ok", "success", "succeeded", "done"})
_OUTCOMES = "outcomes"
"""``{{ outcomes }}``: what each side effect since the last human message actually did."""
_TOP_KEYS = frozenset({"name", "turns", "final", "followups"})
_FOLLOWUP_KEYS = frozenset({"turns", "final"})
_TURN_KEYS = frozenset({"say", "tool_calls", "when", "otherwise"})
_CALL_KEYS = frozenset({"name", "args", "id"})
_WHEN_KEYS = frozenset({"path", "op", "value"})
_DETAIL_CHARS = 200


# --- validation -------------------------------------------------------------------------


def _fail(source: str, where: str, problem: str) -> ConfigError:
    return ConfigError(f"script {source}: {where}: {problem}")


def _check_keys(obj: Any, allowed: frozenset[str], source: str, where: str) -> None:
    if not isinstance(obj, Mapping):
        raise _fail(source, where, f"must be a mapping, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise _fail(source, where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _check_templates(value: Any, source: str, where: str) -> None:
    if isinstance(value, str):
        for ref in _TEMPLATE_RE.findall(value):
            if ref != _OUTCOMES and not _REF_RE.fullmatch(ref):
                raise _fail(source, where, f"template {{{{ {ref} }}}} is not result.<tool>.<field>")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_templates(item, source, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_templates(item, source, f"{where}[{i}]")


def _check_call(call: Any, source: str, where: str) -> None:
    _check_keys(call, _CALL_KEYS, source, where)
    if not isinstance(call.get("name"), str) or not call["name"]:
        raise _fail(source, where, "'name' must be a non-empty string")
    if not isinstance(call.get("args", {}), Mapping | str):
        raise _fail(source, where, "'args' must be a mapping (or a raw JSON string)")
    if call.get("id") is not None and not isinstance(call["id"], str):
        raise _fail(source, where, "'id' must be a string or null")
    _check_templates(call.get("args", {}), source, f"{where}.args")


def _check_turn(turn: Any, source: str, where: str) -> None:
    _check_keys(turn, _TURN_KEYS, source, where)
    for key in ("say", "otherwise"):
        if not isinstance(turn.get(key, ""), str):
            raise _fail(source, where, f"'{key}' must be a string")
        _check_templates(turn.get(key, ""), source, f"{where}.{key}")
    calls = turn.get("tool_calls", [])
    if not isinstance(calls, list):
        raise _fail(source, where, "'tool_calls' must be a list")
    for i, call in enumerate(calls):
        _check_call(call, source, f"{where}.tool_calls[{i}]")
    if "when" in turn:
        when = turn["when"]
        _check_keys(when, _WHEN_KEYS, source, f"{where}.when")
        if not isinstance(when.get("path"), str) or not _REF_RE.fullmatch(when["path"]):
            raise _fail(source, f"{where}.when", "'path' must look like result.<tool>.<field>")
        if when.get("op") not in _OPS:
            raise _fail(source, f"{where}.when", f"'op' must be one of {sorted(_OPS)}")
        if "value" not in when:
            raise _fail(source, f"{where}.when", "'value' is required")


def validate_script(script: Any, *, source: str = "<mapping>") -> dict[str, Any]:
    """Check a script's shape and return a JSON-clean deep copy of it.

    Args:
        script: the parsed script, ``{"name", "turns": [...], "final"?}``.
        source: where it came from, for error messages (a path or ``<mapping>``).

    Returns:
        A new dict with the same content; ``name`` defaults to ``"scripted"``.

    Raises:
        ConfigError: the script has the wrong shape, an unknown key (a typo), a
            template that is not ``result.<tool>.<field>``, or a value with no
            JSON form (YAML dates, NaN).
    """
    _check_keys(script, _TOP_KEYS, source, "top level")
    if not isinstance(script.get("turns"), list):
        raise _fail(source, "top level", "'turns' must be a list of turns")
    for key in ("name", "final"):
        if key in script and not isinstance(script[key], str):
            raise _fail(source, "top level", f"'{key}' must be a string")
    for k, turn in enumerate(script["turns"]):
        _check_turn(turn, source, f"turns[{k}]")
    followups = script.get("followups", [])
    if not isinstance(followups, list):
        raise _fail(source, "top level", "'followups' must be a list of {turns, final?}")
    for h, part in enumerate(followups):
        where = f"followups[{h}]"
        _check_keys(part, _FOLLOWUP_KEYS, source, where)
        if not isinstance(part.get("turns", []), list):
            raise _fail(source, where, "'turns' must be a list of turns")
        if not isinstance(part.get("final", ""), str):
            raise _fail(source, where, "'final' must be a string")
        for k, turn in enumerate(part.get("turns", [])):
            _check_turn(turn, source, f"{where}.turns[{k}]")
    try:
        clean: dict[str, Any] = json.loads(canonical_json(script))
    except (TypeError, ValueError) as exc:
        raise _fail(source, "value", f"not JSON-compatible: {exc}") from exc
    clean.setdefault("name", "scripted")
    return clean


# --- history and templates --------------------------------------------------------------


_SUFFIXES = (".yaml", ".yml", ".json")
_PACKAGE = "effectgate.demo"
_SPEC_HELP = "use 'scripted:<name or path>' (e.g. scripted:incident) or 'openai:<model>'"


def _packaged_names() -> list[str]:
    root = resources.files(_PACKAGE)
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in root.iterdir()
        if entry.name.endswith(_SUFFIXES) and entry.is_file()
    )


def _load_packaged(name: str) -> dict[str, Any]:
    root = resources.files(_PACKAGE)
    for suffix in _SUFFIXES:
        entry = root / f"{name}{suffix}"
        if entry.is_file():
            return _parse(entry.read_text(encoding="utf-8"), suffix, f"'{name}' (packaged)")
    raise ConfigError(
        f"unknown script {name!r}: packaged scripts are {_packaged_names()}; "
        f"otherwise give a path ending in {', '.join(_SUFFIXES)}"
    )


def _parse(text: str, suffix: str, source: str) -> dict[str, Any]:
    try:
        data = parse_json(text) if suffix == ".json" else parse_yaml(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"script {source}: invalid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"script {source}: invalid YAML: {exc}") from exc
    return validate_script(data, source=source)


def load_script(name_or_path: str) -> dict[str, Any]:
    """Load and validate a script for :class:`ScriptedChatModel`.

    A bare name without a path separator or script suffix names a script
    packaged in ``effectgate.demo`` (``"incident"`` is the demo's default);
    anything else is a file path.

    Args:
        name_or_path: a packaged name, or a ``.yaml``/``.yml``/``.json`` path.

    Returns:
        The validated script, a JSON-clean dict with ``name`` and ``turns``.

    Raises:
        ConfigError: unknown packaged name, missing or unreadable file, wrong
            suffix, unparsable text, or a script with a bad shape.
    """
    text = name_or_path.strip()
    if not text:
        raise ConfigError("empty script name: " + _SPEC_HELP)
    is_path = os.sep in text or "/" in text or text.endswith(_SUFFIXES)
    if not is_path:
        return _load_packaged(text)
    path = Path(text).expanduser()
    if path.suffix not in _SUFFIXES:
        raise ConfigError(f"script {path}: the file must end in {', '.join(_SUFFIXES)}")
    if not path.exists():
        raise ConfigError(f"script file not found: {path}")
    try:
        body = read_regular_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"script {path}: cannot be read: {exc}") from exc
    return _parse(body, path.suffix, str(path))
