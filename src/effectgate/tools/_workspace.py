"""Confine file access to a workspace directory, robustly against symlink races.

Two layers of workspace confinement:

1. Lexical, in the argument schema (``normalize_relative``): a path must be
   relative, may not contain ``..``, and is normalized (``a/./b/`` -> ``a/b``)
   so that equal-meaning paths hash equal. This is pure and deterministic.
2. Physical, at execution time (``locate``): the path is walked one component
   at a time from an open file descriptor of the workspace root, every
   directory opened with ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's
   descriptor. A symlink met on the way is read and resolved *inside* the
   workspace (relative targets against the directory holding the link,
   absolute ones only if they lie under the workspace's real path); a target
   that leaves the workspace raises ``WorkspaceError``.

Why descriptors and not ``os.path.realpath`` + ``open``: a check on a path
string and the later open of that string are two lookups, and a symlink
swapped in between (after the reviewer saw the preview, before the write)
would redirect the second one::

    realpath("ws/sub/f") -> inside  ...  attacker: ws/sub -> /etc  ...  open("ws/sub/f")

Walking with ``O_NOFOLLOW`` makes every step its own check: whatever is swapped
in, the descriptor we end up holding is a directory reached from the root
through real directories, and the final ``os.replace`` into it does not follow
a symlink at the last component either (``rename`` replaces the link itself).
This is what ``openat2(RESOLVE_IN_ROOT)`` does in one call on Linux 5.6+,
written with calls Python has on every POSIX system.

Limits: a directory inside the workspace that is *renamed* out of it while a
walk holds its descriptor is not detected (that needs the attacker to own the
workspace already), and absolute symlink targets must spell the workspace's
real path literally.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from effectgate.errors import WorkspaceError

__all__ = [
    "Location",
    "inventory",
    "locate",
    "normalize_relative",
    "resolve_in_workspace",
]

_MAX_SYMLINK_HOPS = 40
"""Same bound as Linux's MAXSYMLINKS; also bounds retries after a lost race."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Missing = Literal["raise", "create", "lexical"]


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def normalize_relative(path: str) -> str:
    """Normalize a workspace-relative POSIX path lexically; refuse escapes.

    Every ``..`` is refused, not only those that climb above the root: ``..``
    after a symlink means something different on disk than on paper, and a
    model never needs it.

    Args:
        path: the path as given, e.g. ``"./docs//a.md"``.

    Returns:
        The normalized path (``"docs/a.md"``); ``"."`` for the workspace root.

    Raises:
        WorkspaceError: the path is absolute, contains ``..`` or a NUL byte.
    """
    if "\x00" in path:
        raise WorkspaceError(f"path {path!r} contains a NUL byte", path=path)
    if path.startswith("/"):
        raise WorkspaceError(
            f"path {path!r} is absolute; give it relative to the workspace", path=path
        )
    parts = _split(path)
    if ".." in parts:
        raise WorkspaceError(
            f"path {path!r} contains '..'; paths may not leave the workspace", path=path
        )
    return "/".join(parts) or "."


@dataclass(slots=True)
class Location:
    """Where a workspace path landed after a confined walk."""

    dir_fd: int
    """Open descriptor of the directory holding ``name`` (or of the path itself)."""
    name: str | None
    """Last component inside ``dir_fd``; ``None`` when ``dir_fd`` is the path itself.

    With ``missing="lexical"`` it may hold several components (``"new/dir/f"``)
    when directories on the way do not exist yet.
    """
    parts: list[str]
    """Real directory names from the workspace root down to ``dir_fd``."""
    lineage: list[int]
    """Descriptors from the root down to ``dir_fd``, to fsync after creating entries."""
    created_dirs: bool
    """Whether the walk created missing directories (``missing="create"``)."""


class _Cursor:
    """Descriptors of the directories walked so far; ``fds[0]`` is the root."""

    def __init__(self, root_fd: int) -> None:
        self.fds = [root_fd]
        self.names: list[str] = []
        self.created_dirs = False
        self.hops = 0

    def hop(self, shown: str) -> None:
        """Count a symlink followed (or a lost race); refuse loops."""
        self.hops += 1
        if self.hops > _MAX_SYMLINK_HOPS:
            raise WorkspaceError(f"path {shown!r}: too many symlinks", path=shown)

    @property
    def fd(self) -> int:
        return self.fds[-1]

    def enter(self, fd: int, name: str) -> None:
        self.fds.append(fd)
        self.names.append(name)

    def up(self, shown: str) -> None:
        if not self.names:
            raise WorkspaceError(
                f"path {shown!r} follows a symlink that leads outside the workspace", path=shown
            )
        self.names.pop()
        os.close(self.fds.pop())

    def to_root(self) -> None:
        while len(self.fds) > 1:
            os.close(self.fds.pop())
        self.names.clear()

    def close(self) -> None:
        self.to_root()


def _symlink_parts(target: str, ws_real: str, shown: str) -> tuple[bool, list[str]]:
    """Return (restart from root?, components) for a symlink target, or refuse it."""
    if not target.startswith("/"):
        return False, target.split("/")
    root = [p for p in ws_real.split("/") if p]
    parts = [p for p in target.split("/") if p]
    if parts[: len(root)] != root:
        raise WorkspaceError(
            f"path {shown!r} goes through a symlink to {target!r}, outside the workspace",
            path=shown,
        )
    return True, parts[len(root) :]


def _walk(
    cur: _Cursor, ws_real: str, relative: str, *, open_final: bool, missing: Missing
) -> str | None:
    """Walk ``relative`` from the cursor; return the unopened last component, if any."""
    pending = deque(_split(relative))
    while pending:
        name = pending.popleft()
        if name in ("", "."):
            continue
        if name == "..":  # only ever comes from a symlink target
            cur.up(relative)
            continue
        last = not pending
        try:
            st = os.stat(name, dir_fd=cur.fd, follow_symlinks=False)
        except FileNotFoundError:
            if last and not open_final:
                return name  # a file about to be created
            rest = _on_missing(cur, name, pending, missing)
            if rest is not None:
                return rest
            continue
        if stat.S_ISLNK(st.st_mode):
            cur.hop(relative)
            restart, parts = _symlink_parts(os.readlink(name, dir_fd=cur.fd), ws_real, relative)
            if restart:
                cur.to_root()
            pending.extendleft(reversed(parts))
        elif last and not open_final:
            return name
        elif not _descend(cur, name, st, relative):
            pending.appendleft(name)
    return None


def _on_missing(cur: _Cursor, name: str, pending: deque[str], missing: Missing) -> str | None:
    """Handle a missing directory on the way: raise, stop lexically, or create it."""
    if missing == "raise" or (missing == "lexical" and ".." in pending):
        raise FileNotFoundError(errno.ENOENT, "no such directory", name)
    if missing == "lexical":
        return "/".join([name, *pending])
    _mkdir(cur, name)
    pending.appendleft(name)  # look again: someone may have raced us to it
    return None


def _descend(cur: _Cursor, name: str, st: os.stat_result, relative: str) -> bool:
    """Open directory ``name`` and enter it; ``False`` when it changed since the stat."""
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=cur.fd)
    except OSError as exc:
        # ELOOP/ENOTDIR here means the entry was swapped since the stat:
        # the caller looks at it again rather than trust the stale answer.
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        cur.hop(relative)
        return False
    cur.enter(fd, name)
    return True


def _mkdir(cur: _Cursor, name: str) -> None:
    # Created concurrently is as good as created by us; the caller stats it again.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=cur.fd)
    cur.created_dirs = True


@contextmanager
def locate(
    workspace: str | os.PathLike[str],
    relative: str,
    *,
    open_final: bool = False,
    missing: Missing = "raise",
) -> Iterator[Location]:
    """Walk a workspace path through descriptors, following symlinks only inside.

    Symlinks at the last component are followed too (so writing through an
    inside link writes its target); the caller must then open or replace
    ``name`` relative to ``dir_fd`` without following symlinks.

    Args:
        workspace: the workspace root directory.
        relative: a path relative to it, as accepted by ``normalize_relative``.
        open_final: open the last component as a directory (for listing).
        missing: what to do with missing directories on the way: ``"raise"``
            (``FileNotFoundError``), ``"create"`` (``mkdir`` them, inside the
            workspace), or ``"lexical"`` (stop, and return the rest as ``name``).

    Yields:
        The ``Location``; its descriptors are closed when the block exits.

    Raises:
        WorkspaceError: the path is absolute, has ``..``, or a symlink on it
            points outside the workspace.
        OSError: the workspace or a component is missing or not a directory.
    """
    normalized = normalize_relative(relative)
    ws_real = os.path.realpath(workspace)
    root_fd = os.open(ws_real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    cur = _Cursor(root_fd)
    try:
        name = _walk(cur, ws_real, normalized, open_final=open_final, missing=missing)
        yield Location(
            dir_fd=cur.fd,
            name=name,
            parts=list(cur.names),
            lineage=list(cur.fds),
            created_dirs=cur.created_dirs,
        )
    finally:
        cur.close()
        os.close(root_fd)


def resolve_in_workspace(workspace: Path, relative: str) -> Path:
    """Return where a workspace-relative path really points, or refuse it.

    Symlinks inside the workspace are followed; missing trailing components
    are kept as given (a file about to be created resolves too). The answer is
    a snapshot: tools re-walk with descriptors when they act (see ``locate``).

    Args:
        workspace: the workspace root directory.
        relative: the path relative to it (POSIX separators).

    Returns:
        An absolute path under the workspace's real path.

    Raises:
        WorkspaceError: ``relative`` is absolute, contains ``..``, or a symlink
            on the way points outside the workspace.
        OSError: the workspace is missing, or a component is not a directory.
    """
    with locate(workspace, relative, missing="lexical") as loc:
        base = Path(os.path.realpath(workspace), *loc.parts)
        return base / loc.name if loc.name else base


INVENTORY_MAX_ENTRIES = 10_000
"""``inventory`` looks at no more directory entries than this."""
INVENTORY_MAX_DEPTH = 64
"""``inventory`` descends no deeper than this many directories."""
INVENTORY_HASH_BYTES = 1024 * 1024
"""``inventory`` hashes files up to this size (bytes); larger ones get ``sha256: None``."""


def _digest(dir_fd: int, name: str, st: os.stat_result) -> str | None:
    from effectgate._untrusted import open_regular  # the one home of bounded opens

    if st.st_size > INVENTORY_HASH_BYTES or st.st_nlink > 1:
        return None  # too big to read now, or maybe someone else's file
    try:
        fd = open_regular(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    try:
        digest = hashlib.sha256()
        left = INVENTORY_HASH_BYTES
        while left > 0 and (chunk := os.read(fd, min(65536, left))):
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def inventory(workspace: str | os.PathLike[str]) -> list[dict[str, object]]:
    """List the regular files under a workspace, for a summary; never follows a link.

    The workspace's contents are untrusted, so the walk is bounded: entries are
    ``lstat``-ed (a symlink to ``/etc/shadow`` or a 10 GB file is neither
    listed nor read), directories are opened relative to their parent's
    descriptor with ``O_NOFOLLOW`` (a tree deeper than ``PATH_MAX`` is walked
    without ever forming its full path for a system call), at most
    ``INVENTORY_MAX_DEPTH`` levels and ``INVENTORY_MAX_ENTRIES`` entries are
    visited, only files up to ``INVENTORY_HASH_BYTES`` with one hard link are
    hashed, and unreadable parts are skipped. FIFOs and devices are not opened.

    Args:
        workspace: the workspace root; missing or not a directory -> ``[]``.

    Returns:
        ``[{"path", "bytes", "sha256"}]`` sorted by path; ``sha256`` is a hex
        string, or ``None`` when the file was not hashed.
    """
    try:
        root = os.open(workspace, _DIR_FLAGS)
    except OSError:
        return []
    found: list[dict[str, object]] = []
    budget = [INVENTORY_MAX_ENTRIES]
    # Depth-first with one open descriptor per level (at most MAX_DEPTH + 1).
    frames: list[tuple[int, str, Iterator[str]]] = [(root, "", _names(root))]
    try:
        while frames:
            dir_fd, prefix, names = frames[-1]
            child = _next_child(dir_fd, prefix, names, found, budget)
            if child is None:
                frames.pop()
                os.close(dir_fd)
            elif len(frames) <= INVENTORY_MAX_DEPTH:
                with contextlib.suppress(OSError):
                    fd = os.open(child, _DIR_FLAGS, dir_fd=dir_fd)
                    frames.append((fd, f"{prefix}{child}/", _names(fd)))
    finally:
        for dir_fd, _, _ in frames:
            os.close(dir_fd)
    found.sort(key=lambda entry: str(entry["path"]))
    return found


def _names(dir_fd: int) -> Iterator[str]:
    try:
        return iter(sorted(os.listdir(dir_fd)))
    except OSError:
        return iter(())


def _next_child(
    dir_fd: int,
    prefix: str,
    names: Iterator[str],
    found: list[dict[str, object]],
    budget: list[int],
) -> str | None:
    """Record regular files from ``names`` until a directory turns up; return its name."""
    for name in names:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            digest = _digest(dir_fd, name, st)
            found.append({"path": f"{prefix}{name}", "bytes": st.st_size, "sha256": digest})
        elif stat.S_ISDIR(st.st_mode):
            return name
    return None
