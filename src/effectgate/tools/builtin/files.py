"""File tools confined to a workspace: read_file, list_dir, write_file, append_file.

Paths are checked twice (see ``effectgate.tools._workspace``): lexically by the
argument schema, so a bad path is a ``ToolCallError`` before review, and
physically at execution, by walking directory descriptors, so a symlink
swapped in after review cannot redirect a write. A refusal at execution is
``Rejected`` with the ``WorkspaceError`` as its ``__cause__``.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from effectgate._untrusted import open_regular, read_bounded
from effectgate.errors import NotAccepted, OutcomeUnknown, Rejected, WorkspaceError
from effectgate.tools._contract import EffectKind, ToolContext, ToolResult, ToolSpec
from effectgate.tools._workspace import Location, locate, normalize_relative

__all__ = [
    "AppendFileArgs",
    "ListDirArgs",
    "ReadFileArgs",
    "WriteFileArgs",
    "file_tools",
]

MAX_READ_BYTES = 1024 * 1024
"""read_file refuses larger files, and write_file's preview omits their diff (bytes)."""
MAX_PREVIEW_LINES = 400
"""Longer previews are cut, with a note saying how many lines were left out."""

_TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.EMFILE, errno.ENFILE}
)
"""OS errors worth retrying later (disk full, descriptors exhausted); others are permanent."""


def _checked_path(value: str) -> str:
    try:
        return normalize_relative(value)
    except WorkspaceError as exc:
        # pydantic turns ValueError into a validation error -> ToolCallError.
        raise ValueError(str(exc)) from exc


def _checked_file_path(value: str) -> str:
    if value.endswith(("/", "/.")):
        # "incidents/" names a directory; normalising would write a file "incidents"
        raise ValueError(f"path {value!r} names a directory, not a file")
    path = _checked_path(value)
    if path == ".":
        raise ValueError("path names the workspace itself, not a file")
    return path


WorkspacePath = Annotated[str, AfterValidator(_checked_path)]
WorkspaceFilePath = Annotated[str, AfterValidator(_checked_file_path)]
_SCHEMA = ConfigDict(extra="forbid", frozen=True)


class ReadFileArgs(BaseModel):
    """Arguments of read_file."""

    model_config = _SCHEMA
    path: WorkspaceFilePath = Field(description="File path relative to the workspace.")


class ListDirArgs(BaseModel):
    """Arguments of list_dir."""

    model_config = _SCHEMA
    path: WorkspacePath = Field(".", description="Directory relative to the workspace.")


class WriteFileArgs(BaseModel):
    """Arguments of write_file."""

    model_config = _SCHEMA
    path: WorkspaceFilePath = Field(description="File path relative to the workspace.")
    content: str = Field(description="The whole new content of the file (UTF-8 text).")


class AppendFileArgs(BaseModel):
    """Arguments of append_file."""

    model_config = _SCHEMA
    path: WorkspaceFilePath = Field(description="File path relative to the workspace.")
    content: str = Field(description="Text to add at the end of the file (UTF-8).")


@contextmanager
def _not_applied_on_error(tool: str, path: str) -> Iterator[None]:
    """Translate refusals and OS errors raised before anything was changed."""
    try:
        yield
    except WorkspaceError as exc:
        raise Rejected(f"{tool}: {exc}") from exc
    except OSError as exc:
        message = f"{tool} {path!r}: {exc.strerror or exc}"
        if exc.errno in _TRANSIENT_ERRNOS:
            raise NotAccepted(message) from exc
        raise Rejected(message) from exc


def _leaf(loc: Location, path: str) -> str:
    if loc.name is None:
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    return loc.name


def _single_link(fd: int, path: str) -> os.stat_result:
    """Refuse a file with other hard links: its bytes may live outside the workspace.

    A hard link is not a symlink: nothing on the path says where else the
    inode is reachable, so a link to a file outside the workspace would be
    read or appended to as if it were inside. Checked on the open descriptor,
    at the moment of the read or the append, not at review time.
    """
    st = os.fstat(fd)
    if st.st_nlink > 1:
        raise WorkspaceError(
            f"path {path!r} has {st.st_nlink} hard links; a file with other links may "
            "be outside the workspace, so it is refused",
            path=path,
        )
    return st


def _read_leaf(loc: Location, path: str) -> bytes:
    """Read a regular, singly linked file at ``loc``: no symlink, FIFO or device, bounded."""
    fd = open_regular(_leaf(loc, path), dir_fd=loc.dir_fd, follow_symlinks=False)
    try:
        _single_link(fd, path)
        return read_bounded(fd, MAX_READ_BYTES, path)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _existing_mode(dir_fd: int, name: str) -> int | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", name)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        # A FIFO, socket or device is someone's endpoint, not a file's content:
        # replacing it would silently cut whoever uses it off.
        raise OSError(errno.EINVAL, "not a regular file", name)
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def _temp_prefix(operation_id: str) -> str:
    """Temp files of one operation share a prefix, so a later attempt can find them."""
    return f".effectgate-{hashlib.sha256(operation_id.encode()).hexdigest()[:16]}-"


def _remove_stale_temps(dir_fd: int, prefix: str) -> None:
    # A process killed between writing its temp file and the rename leaves
    # it behind. The next attempt of the same operation removes it,
    # so recovery leaves no second artefact.
    for entry in os.listdir(dir_fd):
        if entry.startswith(prefix) and entry.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dir_fd)


def _write_temp(dir_fd: int, data: bytes, mode: int | None, prefix: str) -> str:
    """Write ``data`` to a fresh temp file in ``dir_fd``, fsync it, and return its name."""
    _remove_stale_temps(dir_fd, prefix)
    tmp = f"{prefix}{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # keep the replaced file's permissions
        _write_all(fd, data)
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    return tmp


def _fsync_dirs(loc: Location) -> None:
    # New directories are durable only once their parents are synced too.
    for fd in loc.lineage if loc.created_dirs else [loc.dir_fd]:
        os.fsync(fd)


def _replace_atomically(loc: Location, name: str, data: bytes, operation_id: str) -> None:
    """Temp file + fsync + rename + fsync(dir): readers see old or new bytes, never a mix."""
    prefix = _temp_prefix(operation_id)
    tmp = _write_temp(loc.dir_fd, data, _existing_mode(loc.dir_fd, name), prefix)
    try:
        # rename does not follow a symlink at ``name``: one swapped in now is replaced.
        os.replace(tmp, name, src_dir_fd=loc.dir_fd, dst_dir_fd=loc.dir_fd)
    except OSError:
        os.unlink(tmp, dir_fd=loc.dir_fd)
        raise


def _clip_lines(lines: list[str]) -> str:
    if len(lines) > MAX_PREVIEW_LINES:
        more = len(lines) - MAX_PREVIEW_LINES
        lines = [*lines[:MAX_PREVIEW_LINES], f"... ({more} more lines not shown)\n"]
    return "".join(lines)


def _diff(path: str, old: str | None, new: str) -> str:
    lines = []
    diff = difflib.unified_diff(
        [] if old is None else old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile=f"b/{path}",
    )
    for line in diff:
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if not lines:
        return f"no change: {path} already holds exactly this content\n"
    return _clip_lines(lines)


class _FileTools:
    """The four tools, sharing one workspace root."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def read_file(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        with (
            _not_applied_on_error("read_file", args.path),
            locate(self.workspace, args.path) as loc,
        ):
            data = _read_leaf(loc, args.path)
        return ToolResult(value={"path": args.path, "content": data.decode("utf-8", "replace")})

    def list_dir(self, args: ListDirArgs, ctx: ToolContext) -> ToolResult:
        entries: list[dict[str, str]] = []
        with (
            _not_applied_on_error("list_dir", args.path),
            locate(self.workspace, args.path, open_final=True) as loc,
        ):
            for entry in os.scandir(loc.dir_fd):
                entries.append({"name": entry.name, "type": _entry_type(entry)})
        entries.sort(key=lambda e: e["name"])
        return ToolResult(value={"path": args.path, "entries": entries})

    def write_file(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        data = args.content.encode("utf-8")
        with (
            _not_applied_on_error("write_file", args.path),
            locate(self.workspace, args.path, missing="create") as loc,
        ):
            _replace_atomically(loc, _leaf(loc, args.path), data, ctx.operation_id)
            try:
                _fsync_dirs(loc)
            except OSError as exc:
                # The new content is in place but may not survive a power cut.
                raise OutcomeUnknown(f"write_file {args.path!r}: fsync failed: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        value = {"path": args.path, "bytes": len(data), "sha256": digest}
        return ToolResult(value=value, reference=f"sha256:{digest}")

    def append_file(self, args: AppendFileArgs, ctx: ToolContext) -> ToolResult:
        data = args.content.encode("utf-8")
        # O_NONBLOCK: opening a FIFO for writing with no reader fails (ENXIO)
        # instead of waiting; the fstat below refuses any non-regular file.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_NONBLOCK | os.O_NOCTTY
        with (
            _not_applied_on_error("append_file", args.path),
            locate(self.workspace, args.path, missing="create") as loc,
        ):
            try:
                fd = os.open(_leaf(loc, args.path), flags, 0o666, dir_fd=loc.dir_fd)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # a FIFO with no reader, a socket
                    raise
                raise OSError(errno.EINVAL, "not a regular file", args.path) from exc
            try:
                if not stat.S_ISREG(_single_link(fd, args.path).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", args.path)
                os.set_blocking(fd, True)
                size = self._append(fd, loc, data, args.path)
            finally:
                os.close(fd)
        return ToolResult(value={"path": args.path, "bytes": len(data), "size": size})

    @staticmethod
    def _append(fd: int, loc: Location, data: bytes, path: str) -> int:
        try:
            _write_all(fd, data)
            os.fsync(fd)
            _fsync_dirs(loc)
        except OSError as exc:
            # Some bytes may already be in the file: a retry could duplicate them.
            raise OutcomeUnknown(f"append_file {path!r}: {exc.strerror or exc}") from exc
        return os.fstat(fd).st_size

    def current_text(self, path: str) -> str | None:
        """Return the file's current text, or ``None`` when it does not exist yet."""
        with locate(self.workspace, path, missing="lexical") as loc:
            if loc.name is not None and "/" in loc.name:
                return None  # a parent directory is missing: a new file
            try:
                return _read_leaf(loc, path).decode("utf-8", "replace")
            except FileNotFoundError:
                return None

    def write_preview(self, args: WriteFileArgs) -> str:
        try:
            old = self.current_text(args.path)
        except WorkspaceError as exc:
            return f"REFUSED: {exc}\n"
        except OSError as exc:
            return f"cannot show a diff ({exc.strerror or exc}); the file will be replaced\n"
        return _diff(args.path, old, args.content)

    def append_preview(self, args: AppendFileArgs) -> str:
        lines = [f"+{line}" for line in args.content.splitlines(keepends=True)]
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n(no newline at the end: the next append continues this line)\n"
        head = f"append {len(args.content.encode('utf-8'))} bytes to {args.path}:\n"
        return head + _clip_lines(lines)


def _entry_type(entry: os.DirEntry[Any]) -> str:
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def file_tools(workspace: str | os.PathLike[str]) -> list[ToolSpec]:
    """Build the file tools for one workspace directory.

    Every path is relative to ``workspace`` and confined to it: ``..`` and
    absolute paths are refused by the schema (``ToolCallError`` from
    ``ToolSpec.normalize``), and symlinks leading out are refused when the tool
    runs (``Rejected`` with the ``WorkspaceError`` as ``__cause__``). Symlinks
    that stay inside the workspace are followed. Only regular files are read
    or appended to, opened with ``O_NONBLOCK | O_NOFOLLOW`` and checked with
    ``fstat`` (a FIFO or device is refused at once, never waited on), and a
    file with more than one hard link is refused by ``read_file`` and
    ``append_file``: its other name may be outside the workspace. These checks
    run when the tool runs, whatever the review saw.

    - ``read_file(path)`` (READ) -> ``{"path", "content"}``; UTF-8, undecodable
      bytes replaced; files over ``MAX_READ_BYTES`` are refused.
    - ``list_dir(path=".")`` (READ) -> ``{"path", "entries": [{"name", "type"}]}``,
      sorted by name; type is ``file``, ``dir``, ``symlink`` or ``other``.
    - ``write_file(path, content)`` (IDEMPOTENT) replaces the whole content
      atomically: temp file in the same directory, fsync, ``rename``, fsync of
      the directory; missing parent directories are created. Result
      ``{"path", "bytes", "sha256"}``, reference ``sha256:<hex>``. Preview: a
      unified diff against the current content (``/dev/null`` for new files).
    - ``append_file(path, content)`` (UNSAFE: a repeat appends twice) appends
      the bytes and fsyncs. Result ``{"path", "bytes", "size"}``.

    Args:
        workspace: the directory the tools may touch. It is looked up at each
            call, so it may be created after the tools are built.

    Returns:
        ``[read_file, list_dir, write_file, append_file]``.

    Note:
        Atomic replace: temp + fsync + rename + fsync(dir), as in
        ``rename(2)`` and LWN's "Ensuring data reaches disk" (2011).
    """
    tools = _FileTools(Path(workspace))
    return [
        ToolSpec(
            name="read_file",
            description="Read a UTF-8 text file in the workspace.",
            args_schema=ReadFileArgs,
            func=tools.read_file,
            kind=EffectKind.READ,
        ),
        ToolSpec(
            name="list_dir",
            description="List the entries of a directory in the workspace.",
            args_schema=ListDirArgs,
            func=tools.list_dir,
            kind=EffectKind.READ,
        ),
        ToolSpec(
            name="write_file",
            description="Replace the whole content of a file in the workspace (creates it).",
            args_schema=WriteFileArgs,
            func=tools.write_file,
            kind=EffectKind.IDEMPOTENT,
            preview=tools.write_preview,
        ),
        ToolSpec(
            name="append_file",
            description="Append text to the end of a file in the workspace (creates it).",
            args_schema=AppendFileArgs,
            func=tools.append_file,
            kind=EffectKind.UNSAFE,
            preview=tools.append_preview,
        ),
    ]
