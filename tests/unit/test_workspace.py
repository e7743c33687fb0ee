"""Workspace confinement: lexical normalization and the descriptor walk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from effectgate.errors import WorkspaceError
from effectgate.tools import resolve_in_workspace
from effectgate.tools._workspace import locate, normalize_relative


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "docs" / "deep").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("a\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    return root


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("a/./b", "a/b"),
        ("a/b/", "a/b"),
        ("./a//b", "a/b"),
        (".", "."),
        ("", "."),
        ("./", "."),
        ("name with spaces.txt", "name with spaces.txt"),
    ],
)
def test_normalize_relative_is_lexical(given: str, expected: str) -> None:
    """Equal-meaning spellings normalize to one string."""
    assert normalize_relative(given) == expected


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../b", "a/..", "..", "a\x00b", "//x"])
def test_normalize_relative_refuses_escapes(bad: str) -> None:
    """Absolute paths, any '..' and NUL bytes are refused with the path attached."""
    with pytest.raises(WorkspaceError) as info:
        normalize_relative(bad)
    assert info.value.path == bad


def test_resolve_plain_and_missing_paths(ws: Path) -> None:
    """Existing and not-yet-existing paths resolve under the workspace's real path."""
    real = Path(os.path.realpath(ws))
    assert resolve_in_workspace(ws, "docs/a.md") == real / "docs" / "a.md"
    assert resolve_in_workspace(ws, "docs/new/dir/f.txt") == real / "docs" / "new" / "dir" / "f.txt"
    assert resolve_in_workspace(ws, ".") == real


def test_resolve_follows_symlinks_that_stay_inside(ws: Path) -> None:
    """Relative and absolute symlinks into the workspace are followed."""
    real = Path(os.path.realpath(ws))
    (ws / "rel").symlink_to("docs/deep")
    (ws / "docs" / "up").symlink_to("../docs")  # '..' inside a target, still inside
    (ws / "abs").symlink_to(real / "docs")
    assert resolve_in_workspace(ws, "rel/x") == real / "docs" / "deep" / "x"
    assert resolve_in_workspace(ws, "docs/up/a.md") == real / "docs" / "a.md"
    assert resolve_in_workspace(ws, "abs/a.md") == real / "docs" / "a.md"


@pytest.mark.parametrize(
    "make_link",
    [
        lambda ws: (ws / "out").symlink_to("../outside"),
        lambda ws: (ws / "out").symlink_to(ws.parent / "outside"),
        lambda ws: (ws / "out").symlink_to("/"),
        lambda ws: (ws / "docs" / "out").symlink_to("../../outside"),
    ],
    ids=["relative", "absolute", "root", "nested-relative"],
)
def test_resolve_refuses_symlinks_pointing_out(ws: Path, make_link) -> None:
    """A symlink whose target leaves the workspace is refused, wherever it sits."""
    make_link(ws)
    target = "out/secret.txt" if (ws / "out").is_symlink() else "docs/out/secret.txt"
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        resolve_in_workspace(ws, target)


def test_final_symlink_pointing_out_is_refused(ws: Path) -> None:
    """The last component is checked too, not only directories on the way."""
    (ws / "leak.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    with pytest.raises(WorkspaceError):
        resolve_in_workspace(ws, "leak.txt")


def test_symlink_loop_is_refused(ws: Path) -> None:
    """A symlink cycle ends in WorkspaceError, not an endless walk."""
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    with pytest.raises(WorkspaceError, match="too many symlinks"):
        resolve_in_workspace(ws, "loop1/x")


def test_locate_create_makes_directories_inside(ws: Path) -> None:
    """missing='create' makes the missing directories, inside the workspace only."""
    with locate(ws, "n1/n2/f.txt", missing="create") as loc:
        assert loc.name == "f.txt"
        assert loc.parts == ["n1", "n2"]
        assert loc.created_dirs
    assert (ws / "n1" / "n2").is_dir()


def test_locate_raise_on_missing_directory(ws: Path) -> None:
    """missing='raise' reports a missing directory as FileNotFoundError."""
    with pytest.raises(FileNotFoundError), locate(ws, "nope/f.txt"):
        pass


def test_locate_closes_its_descriptors(ws: Path) -> None:
    """No descriptor leaks from a walk, whether it succeeds or is refused."""
    (ws / "out").symlink_to("../outside")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with locate(ws, "docs/deep/x", missing="lexical"):
            pass
        with pytest.raises(WorkspaceError), locate(ws, "out/x"):
            pass
    assert len(os.listdir("/proc/self/fd")) == before
