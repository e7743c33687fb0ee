"""Bounded readers and parsers for input nobody vouches for.

Everything effectgate reads that a person did not type at its prompt goes
through here: decisions files, scripted-model files, workspace files read by
the tools, previews of files about to be replaced. Each reader has a bound on
size, nesting depth or expansion, so a hostile file ends in one clear error
instead of a hang, a ``RecursionError`` or an exhausted memory:

- **Only regular files, opened without blocking.** ``O_NONBLOCK`` makes the
  ``open`` of a FIFO return at once instead of waiting for a writer; ``fstat``
  on the descriptor then refuses anything that is not a regular file (FIFO,
  character or block device such as ``/dev/zero``, socket, directory). The
  check is on the open descriptor, so a file swapped after the check cannot
  slip through. ``O_NOFOLLOW`` is added where the caller asks (workspace files;
  a reviewer's own ``--decisions`` path may be a symlink).
- **Size**: at most ``max_bytes`` are read; one more byte proves the file is
  larger and it is refused (``st_size`` alone can lie for special files).
- **JSON depth**: nesting is counted in one linear pass before ``json.loads``,
  which would otherwise raise ``RecursionError`` at around 100,000 levels
  (CPython's C scanner) or exhaust the stack.
- **YAML depth and aliases**: the composer is stopped at a depth limit, and the
  composed graph is measured as if every alias were expanded (the "billion
  laughs" pattern, CVE-2003-1564 for XML entities) before any Python object is
  built from it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_YAML_NODES",
    "TooDeepError",
    "check_json_depth",
    "open_regular",
    "parse_json",
    "parse_yaml",
    "read_bounded",
    "read_regular_file",
]

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Default bound on an untrusted file read whole (bytes)."""
MAX_DEPTH = 64
"""Default bound on the nesting depth of an untrusted JSON or YAML document."""
MAX_YAML_NODES = 100_000
"""Bound on the YAML node count with every alias expanded."""


class TooDeepError(json.JSONDecodeError):
    """A JSON document nests deeper than allowed.

    A ``JSONDecodeError`` subclass, so a caller needs one ``except`` for both.
    """


def open_regular(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow_symlinks: bool = True
) -> int:
    """Open a regular file for reading without ever blocking on it.

    Args:
        path: the file (relative to ``dir_fd`` when given).
        dir_fd: directory descriptor ``path`` is relative to, or ``None``.
        follow_symlinks: ``False`` adds ``O_NOFOLLOW``: a symlink at the last
            component is refused (``ELOOP``).

    Returns:
        An open descriptor, in blocking mode again; the caller closes it.

    Raises:
        OSError: the open failed, or the file is not a regular file (``EINVAL``
            with a message naming what it is).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "a special file"


def read_bounded(fd: int, max_bytes: int, shown: str) -> bytes:
    """Read a descriptor to its end, refusing more than ``max_bytes``.

    Args:
        fd: an open descriptor (not closed here).
        max_bytes: the most bytes accepted.
        shown: the name used in the error.

    Returns:
        All the bytes.

    Raises:
        OSError: ``EFBIG`` when there are more than ``max_bytes``.
    """
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        chunk = os.read(fd, min(65536, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise OSError(errno.EFBIG, f"file is over {max_bytes} bytes", shown)


def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """Read a regular file as UTF-8 text, bounded, without blocking on FIFOs or devices.

    Symlinks are followed: the path comes from the trusted reviewer's command
    line; what it points at must still be a regular file.

    Args:
        path: the file.
        max_bytes: the most bytes accepted.

    Returns:
        The text.

    Raises:
        OSError: missing, unreadable, not a regular file, or too large.
        UnicodeDecodeError: not UTF-8.
    """
    fd = open_regular(Path(path).expanduser())
    try:
        return read_bounded(fd, max_bytes, str(path)).decode("utf-8")
    finally:
        os.close(fd)


def check_json_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse JSON text that nests arrays/objects deeper than ``max_depth``.

    One pass over the characters, skipping string contents; it does not
    validate the JSON (``json.loads`` does that next).

    Raises:
        TooDeepError: the nesting exceeds ``max_depth``.
    """
    depth = 0
    in_string = False
    escaped = False
    for pos, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > max_depth:
                raise TooDeepError(f"nested deeper than {max_depth} levels", text, pos)
        elif char in "]}":
            depth -= 1


def parse_json(text: str, *, max_depth: int = MAX_DEPTH, unique_keys: bool = False) -> Any:
    """Parse JSON with a nesting bound.

    Args:
        text: the JSON text.
        max_depth: the deepest nesting accepted.
        unique_keys: refuse an object that names one key twice. JSON allows
            it and Python keeps the last value silently; in a person's
            answers that would let a later answer replace an earlier one
            unseen (RFC 8259, 4: "names within an object SHOULD be unique").

    Raises:
        json.JSONDecodeError: invalid JSON, a repeated key (``unique_keys``),
            a string holding a lone surrogate escape (an escaped U+D800 to U+DFFF alone: no text
            can hold it; it would fail later, wherever it is first encoded),
            or ``TooDeepError`` (a subclass) when nested deeper than ``max_depth``.
    """
    check_json_depth(text, max_depth)
    try:
        if unique_keys:
            data = json.loads(text, object_pairs_hook=_unique_object)
        else:
            data = json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer past Python's digit limit (int_max_str_digits)
        raise json.JSONDecodeError(f"value refused ({exc})", text, 0) from None
    escape = _SURROGATE_ESCAPE.search(text)
    if escape is not None:
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise json.JSONDecodeError(
                "a \\uD800-\\uDFFF escape that is not half of a pair: not Unicode text "
                "(RFC 8259, 8.2)",
                text,
                escape.start(),
            ) from None
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""A ``\\u`` escape of a UTF-16 surrogate; only a lone one (no pair) is refused."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` whose composer stops at a depth limit."""

    max_depth = MAX_DEPTH
    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise yaml.YAMLError(f"nested deeper than {self.max_depth} levels")
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1


def _expanded_size(root: Node, limit: int) -> int:
    """Count nodes as if every alias were expanded; stop past ``limit``."""
    memo: dict[int, int] = {}
    open_nodes: set[int] = set()
    # Post-order without recursion: the composed graph is already depth-bounded,
    # but a loop keeps the stack flat whatever the bound is set to.
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in memo:
            continue
        if not done and id(node) in open_nodes:
            raise yaml.YAMLError("an alias refers to a node that contains it (a cycle)")
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        if not done:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in memo)
            continue
        total = 1 + sum(memo.get(id(child), 1) for child in children)
        if total > limit:
            raise yaml.YAMLError(f"expands to more than {limit} nodes (aliases repeat large parts)")
        memo[id(node)] = total
        open_nodes.discard(id(node))
    return memo[id(root)]


def parse_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse one YAML document safely and with bounds (``yaml.safe_load`` semantics).

    Raises:
        yaml.YAMLError: invalid YAML, nested deeper than ``max_depth``, or more
            than ``max_nodes`` nodes once aliases are expanded.
    """
    loader = _BoundedLoader(text)
    loader.max_depth = max_depth
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _expanded_size(root, max_nodes)
        try:
            return loader.construct_document(root)
        except (ValueError, OverflowError) as exc:  # e.g. an integer past the digit limit
            raise yaml.YAMLError(f"value refused ({exc})") from None
    finally:
        loader.dispose()
