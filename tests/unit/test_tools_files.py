"""File tools: schemas, exact bytes, atomic replace, appends, confinement at execution."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest

from effectgate.errors import Rejected, ToolCallError, WorkspaceError
from effectgate.tools import EffectKind, ToolContext, ToolSpec, file_tools


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    return root


@pytest.fixture
def tools(ws: Path) -> dict[str, ToolSpec]:
    return {spec.name: spec for spec in file_tools(ws)}


def ctx(n: int = 1) -> ToolContext:
    return ToolContext(operation_id=f"t:c{n}", thread_id="t", tool_call_id=f"c{n}", attempt=1)


def call(spec: ToolSpec, **raw):
    return spec.call(spec.normalize(raw), ctx())


def test_kinds_and_review_flags(tools: dict[str, ToolSpec]) -> None:
    """read/list are READ, write is IDEMPOTENT, append is UNSAFE and reviewed."""
    assert {n: s.kind for n, s in tools.items()} == {
        "read_file": EffectKind.READ,
        "list_dir": EffectKind.READ,
        "write_file": EffectKind.IDEMPOTENT,
        "append_file": EffectKind.UNSAFE,
    }
    assert not tools["read_file"].needs_review
    assert tools["write_file"].needs_review and tools["append_file"].needs_review


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"path": "a/./b.txt", "content": "x"}, {"content": "x", "path": "a/b.txt"}),
        ({"path": "./a//b.txt", "content": "x"}, {"path": "a/b.txt", "content": "x"}),
    ],
)
def test_equal_meaning_paths_hash_equal(tools: dict[str, ToolSpec], a: dict, b: dict) -> None:
    """Path spelling and key order do not change the intent hash."""
    spec = tools["write_file"]
    assert spec.intent_hash(spec.normalize(a)) == spec.intent_hash(spec.normalize(b))


def test_list_dir_default_is_filled(tools: dict[str, ToolSpec]) -> None:
    """list_dir() and list_dir(path='.') and list_dir(path='./') are one intent."""
    spec = tools["list_dir"]
    hashes = {spec.intent_hash(spec.normalize(raw)) for raw in ({}, {"path": "."}, {"path": "./"})}
    assert len(hashes) == 1
    assert spec.args_dict(spec.normalize({})) == {"path": "."}


def test_different_content_or_path_hash_differently(tools: dict[str, ToolSpec]) -> None:
    """Arguments that change the effect change the hash."""
    spec = tools["write_file"]
    base = spec.intent_hash(spec.normalize({"path": "a.txt", "content": "x"}))
    assert base != spec.intent_hash(spec.normalize({"path": "a.txt", "content": "x\n"}))
    assert base != spec.intent_hash(spec.normalize({"path": "b.txt", "content": "x"}))


@pytest.mark.parametrize(
    "raw",
    [
        {"path": "../escape.txt", "content": "x"},
        {"path": "a/../../escape.txt", "content": "x"},
        {"path": "/etc/passwd", "content": "x"},
        {"path": ".", "content": "x"},
        {"path": "incidents/", "content": "x"},  # a directory: it used to write "incidents"
        {"path": "a/.", "content": "x"},
        {"path": "a.txt", "content": "x", "mode": "w"},
        {"path": "a.txt"},
        {"path": 5, "content": "x"},
    ],
)
def test_schema_refuses_bad_arguments(tools: dict[str, ToolSpec], raw: dict) -> None:
    """Escapes, the root itself, extra keys and missing fields fail at schema level."""
    with pytest.raises(ToolCallError) as info:
        tools["write_file"].normalize(raw, tool_call_id="c9")
    assert info.value.tool == "write_file" and info.value.tool_call_id == "c9"


def test_write_file_bytes_exact_and_atomic(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """The file holds exactly the UTF-8 bytes; no temp file is left; result has the digest."""
    content = "héllo\r\nwörld\n\x00end"
    data = content.encode("utf-8")
    result = call(tools["write_file"], path="sub/dir/f.txt", content=content)
    assert (ws / "sub" / "dir" / "f.txt").read_bytes() == data
    digest = hashlib.sha256(data).hexdigest()
    assert result.value == {"path": "sub/dir/f.txt", "bytes": len(data), "sha256": digest}
    assert result.reference == f"sha256:{digest}"
    assert sorted(os.listdir(ws / "sub" / "dir")) == ["f.txt"]
    call(tools["write_file"], path="sub/dir/f.txt", content="short")
    assert (ws / "sub" / "dir" / "f.txt").read_bytes() == b"short"
    assert sorted(os.listdir(ws / "sub" / "dir")) == ["f.txt"]


def test_write_file_twice_is_idempotent_and_keeps_mode(
    ws: Path, tools: dict[str, ToolSpec]
) -> None:
    """A repeat leaves the same bytes; the replaced file keeps its permissions."""
    target = ws / "run.sh"
    target.write_text("old")
    target.chmod(0o751)
    for _ in range(2):
        call(tools["write_file"], path="run.sh", content="#!/bin/sh\n")
    assert target.read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751


def test_write_file_onto_directory_is_rejected(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """Replacing a directory is refused for good and leaves no temp file."""
    (ws / "d").mkdir()
    with pytest.raises(Rejected, match="directory"):
        call(tools["write_file"], path="d", content="x")
    assert os.listdir(ws) == ["d"]


def test_write_preview_is_a_unified_diff(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """New files diff against /dev/null; existing ones show removed and added lines."""
    spec = tools["write_file"]
    new = spec.render_preview(spec.normalize({"path": "n.txt", "content": "one\n"}))
    assert new.splitlines()[:2] == ["--- /dev/null", "+++ b/n.txt"]
    assert "+one" in new.splitlines()
    (ws / "e.txt").write_text("keep\nold\n")
    diff = spec.render_preview(spec.normalize({"path": "e.txt", "content": "keep\nnew"}))
    lines = diff.splitlines()
    assert lines[:2] == ["--- a/e.txt", "+++ b/e.txt"]
    assert "-old" in lines and "+new" in lines and " keep" in lines
    assert "\\ No newline at end of file" in lines
    same = spec.render_preview(spec.normalize({"path": "e.txt", "content": "keep\nold\n"}))
    assert same.startswith("no change")


def test_append_twice_gives_two_lines(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """append_file is not idempotent: two calls, two lines (why it is UNSAFE)."""
    spec = tools["append_file"]
    first = call(spec, path="log/events.txt", content="deployed\n")
    second = call(spec, path="log/events.txt", content="deployed\n")
    assert (ws / "log" / "events.txt").read_bytes() == b"deployed\ndeployed\n"
    assert first.value == {"path": "log/events.txt", "bytes": 9, "size": 9}
    assert second.value["size"] == 18
    preview = spec.render_preview(spec.normalize({"path": "x", "content": "a\nb\n"}))
    assert preview.splitlines() == ["append 4 bytes to x:", "+a", "+b"]


def test_read_and_list(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """read_file returns the text; list_dir returns sorted typed entries."""
    (ws / "b.txt").write_text("bee")
    (ws / "a").mkdir()
    (ws / "c").symlink_to("b.txt")
    assert call(tools["read_file"], path="./b.txt").value == {"path": "b.txt", "content": "bee"}
    assert call(tools["read_file"], path="c").value["content"] == "bee"
    assert call(tools["list_dir"]).value == {
        "path": ".",
        "entries": [
            {"name": "a", "type": "dir"},
            {"name": "b.txt", "type": "file"},
            {"name": "c", "type": "symlink"},
        ],
    }


def test_read_missing_file_is_rejected(tools: dict[str, ToolSpec]) -> None:
    """A missing file is a permanent refusal carrying the OS error."""
    with pytest.raises(Rejected) as info:
        call(tools["read_file"], path="nope.txt")
    assert isinstance(info.value.__cause__, FileNotFoundError)


@pytest.mark.parametrize("tool", ["read_file", "write_file", "append_file"])
def test_symlink_out_is_rejected_at_execution(
    ws: Path, tools: dict[str, ToolSpec], tool: str
) -> None:
    """A symlink leading out passes the schema but is Rejected when the tool runs."""
    outside = ws.parent / "outside"
    (outside / "secret.txt").write_text("secret\n")
    (ws / "out").symlink_to(outside)
    spec = tools[tool]
    args = spec.normalize(
        {"path": "out/secret.txt", "content": "pwned"}
        if tool != "read_file"
        else {"path": "out/secret.txt"}
    )
    with pytest.raises(Rejected) as info:
        spec.call(args, ctx())
    assert isinstance(info.value.__cause__, WorkspaceError)
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_symlink_swapped_in_after_preview(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """Reviewed a diff for sub/f.txt; sub then became a link out: nothing lands outside."""
    outside = ws.parent / "outside"
    (ws / "sub").mkdir()
    (ws / "sub" / "f.txt").write_text("old\n")
    spec = tools["write_file"]
    args = spec.normalize({"path": "sub/f.txt", "content": "new\n"})
    assert "-old" in spec.render_preview(args).splitlines()
    (ws / "sub").rename(ws / "sub.orig")
    (ws / "sub").symlink_to(outside)
    assert spec.render_preview(args).startswith("REFUSED")
    with pytest.raises(Rejected) as info:
        spec.call(args, ctx())
    assert isinstance(info.value.__cause__, WorkspaceError)
    assert os.listdir(outside) == []
    assert (ws / "sub.orig" / "f.txt").read_text() == "old\n"


def test_final_component_swapped_to_link_is_replaced_not_followed(
    ws: Path, tools: dict[str, ToolSpec]
) -> None:
    """A link at the file name itself, pointing out, is refused; the target is untouched."""
    outside = ws.parent / "outside"
    (outside / "victim.txt").write_text("victim\n")
    (ws / "f.txt").symlink_to(outside / "victim.txt")
    with pytest.raises(Rejected):
        call(tools["write_file"], path="f.txt", content="x")
    with pytest.raises(Rejected):
        call(tools["append_file"], path="f.txt", content="x")
    assert (outside / "victim.txt").read_text() == "victim\n"


def test_racing_symlink_swaps_never_redirect_a_write(ws: Path, tools: dict[str, ToolSpec]) -> None:
    """While 'sub' flips between a link inside and a link outside, no write lands outside."""
    outside = ws.parent / "outside"
    (ws / "real").mkdir()
    (ws / "sub").symlink_to("real")
    stop = threading.Event()

    def flip() -> None:
        i = 0
        while not stop.is_set():
            tmp = ws / f".flip{i % 2}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(outside if i % 2 else "real")
            os.replace(tmp, ws / "sub")  # atomic swap of the link
            i += 1

    flipper = threading.Thread(target=flip)
    flipper.start()
    spec = tools["write_file"]
    outcomes = {"ok": 0, "rejected": 0}
    try:
        for n in range(300):
            try:
                spec.call(spec.normalize({"path": f"sub/f{n % 5}.txt", "content": f"{n}"}), ctx())
                outcomes["ok"] += 1
            except Rejected as exc:
                assert isinstance(exc.__cause__, WorkspaceError | OSError)
                outcomes["rejected"] += 1
    finally:
        stop.set()
        flipper.join()
    assert os.listdir(outside) == []
    assert outcomes["ok"] + outcomes["rejected"] == 300
    assert all(name.startswith("f") for name in os.listdir(ws / "real"))


def test_swap_between_check_and_open_is_caught(
    ws: Path, tools: dict[str, ToolSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker acts in the window right after 'sub' was checked: the open still refuses."""
    outside = ws.parent / "outside"
    (ws / "sub").mkdir()
    real_stat = os.stat
    swapped = []

    def stat_then_swap(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if path == "sub" and not swapped:
            swapped.append(True)
            (ws / "sub").rename(ws / "sub.orig")
            (ws / "sub").symlink_to(outside)
        return result

    monkeypatch.setattr(os, "stat", stat_then_swap)
    spec = tools["write_file"]
    with pytest.raises(Rejected) as info:
        spec.call(spec.normalize({"path": "sub/f.txt", "content": "x"}), ctx())
    monkeypatch.undo()
    assert swapped and isinstance(info.value.__cause__, WorkspaceError)
    assert os.listdir(outside) == []
