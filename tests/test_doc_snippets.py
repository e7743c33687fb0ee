"""The docs' examples run as written: every ``python`` and shell block of README.md and docs/*.md.

One test per block, in file order. The blocks of one file share one
temporary directory (their working directory, so ``.effectgate`` and
relative paths land there; ``/tmp/eg`` stands for ``<dir>/eg``), and a
file's blocks run in sequence: a shell block may go on with the thread an
earlier block started. The model is the offline scripted one the examples
name, the services the local demo ones; nothing needs a network.

- ``python``: the block runs in a fresh interpreter; it must exit 0 and, if
  it calls ``print``, print something.
- ``sh`` / ``bash``: each command line (``\\`` continuations joined) runs with
  bash, ``pipefail`` on and the venv's ``bin`` first on ``PATH``; it must end
  with the exit code a comment on it or right under it states
  (``# … (exit 137)``), else 0.
- ``console``: the lines starting with ``$ `` are the commands; the exit code
  is the one the output under a command states (``(exit code 4)``,
  ``exiting 137``), else 0.

An HTML comment right before a block changes that:
``<!-- doc-test: skip REASON -->`` (it cannot run offline: a server, an API
key; keep these few), ``<!-- doc-test: continues -->`` (a Python fragment
that goes on from the file's previous Python block: both run together).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent

_FENCE = re.compile(
    r"(?:^<!--\s*doc-test:\s*(?P<directive>.*?)\s*-->\n)?^```(?P<lang>\w+)\n(?P<body>.*?)^```",
    re.S | re.M,
)
_SHELL = {"sh", "bash", "shell", "console"}
_EXIT = re.compile(r"\(exit(?: code)? (\d+)\)|exiting (\d+)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc page."""

    file: Path
    index: int  # among the file's runnable blocks
    lang: str
    body: str
    directive: str | None
    line: int

    @property
    def name(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}:{self.lang}"


def _blocks() -> list[Block]:
    found = []
    for path in FILES:
        text = path.read_text()
        n = 0
        for match in _FENCE.finditer(text):
            lang = match["lang"]
            if lang != "python" and lang not in _SHELL:
                continue  # data: json, yaml, text
            line = text.count("\n", 0, match.start("lang")) + 1
            found.append(Block(path, n, lang, match["body"], match["directive"], line))
            n += 1
    return found


BLOCKS = _blocks()


def _expected(text: str) -> int | None:
    found = _EXIT.search(text)
    return None if found is None else int(found.group(1) or found.group(2))


def _commands(block: Block) -> list[tuple[str, int]]:
    """``(command, expected exit code)`` per command of a shell block."""
    out: list[tuple[str, int]] = []
    if block.lang == "console":
        for line in block.body.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], 0))
            elif out and (code := _expected(line)) is not None:
                out[-1] = (out[-1][0], code)
        return out
    joined = re.sub(r"\\\n\s*", " ", block.body)
    for raw in joined.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if out and (code := _expected(line)) is not None:
                out[-1] = (out[-1][0], code)
            continue
        code = _expected(line.partition("#")[2]) if "#" in line else None
        out.append((line, 0 if code is None else code))
    return out


def _python_source(block: Block) -> str:
    """The block's code, after the file's previous Python block when it ``continues``."""
    if block.directive != "continues":
        return block.body
    earlier = [b for b in BLOCKS if b.file == block.file and b.lang == "python"]
    before = [b for b in earlier if b.index < block.index]
    assert before, f"{block.name}: 'continues' but no Python block before it"
    return _python_source(before[-1]) + "\n" + block.body


@dataclass
class FileDirs:
    """One working directory per doc file, and how many of its blocks ran there."""

    root: Path
    dirs: dict[Path, Path]
    ran: dict[Path, int]

    def at(self, file: Path) -> Path:
        if file not in self.dirs:
            self.dirs[file] = self.root / file.stem
            self.dirs[file].mkdir()
            self.ran[file] = 0
        return self.dirs[file]


@pytest.fixture(scope="module")
def file_dirs(tmp_path_factory: pytest.TempPathFactory) -> FileDirs:
    """The shared directories of this process (each xdist worker has its own)."""
    return FileDirs(tmp_path_factory.mktemp("docs"), {}, {})


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EFFECTGATE_FAILPOINT", "EDITOR")}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "NO_COLOR": "1",
                "COLUMNS": "100", "OPENAI_API_KEY": ""})  # fmt: skip
    env.pop("EFFECTGATE_STATE_DIR", None)
    env.pop("EFFECTGATE_STORE", None)
    return env


def test_the_docs_have_examples_to_run() -> None:
    """Every kind is found (a changed fence syntax would silently test nothing)."""
    langs = {b.lang for b in BLOCKS}
    assert {"python", "sh", "console"} <= langs, langs
    skipped = [b.name for b in BLOCKS if (b.directive or "").startswith("skip")]
    assert all(len(b.directive or "") > len("skip ") + 10 for b in BLOCKS if b.name in skipped)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_doc_block_runs(block: Block, file_dirs: FileDirs) -> None:
    """Run one block as its kind says (module docstring), after its file's earlier blocks.

    The earlier blocks have run already in a plain run; under xdist a worker
    that was handed a later block runs the earlier ones first, so that a
    block going on from them finds their state.
    """
    if _skipped(block):
        pytest.skip(block.directive)
    cwd = file_dirs.at(block.file)
    for earlier in BLOCKS:
        before = file_dirs.ran[block.file] <= earlier.index < block.index
        if earlier.file == block.file and before and not _skipped(earlier):
            _run(earlier, cwd)
    _run(block, cwd)
    file_dirs.ran[block.file] = block.index + 1


def _skipped(block: Block) -> bool:
    return bool(block.directive and block.directive.startswith("skip"))


def _run(block: Block, cwd: Path) -> None:
    assert block.directive in (None, "continues") or _skipped(block), block.directive
    if block.lang == "python":
        script = cwd / f"block_{block.index}.py"
        script.write_text(_python_source(block))
        done = subprocess.run([sys.executable, str(script)], cwd=cwd, env=_env(), timeout=180,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == 0, (block.name, done.stdout[-1500:], done.stderr[-3000:])
        if "print(" in block.body:
            assert done.stdout.strip(), f"{block.name}: the example printed nothing"
        return
    commands = _commands(block)
    assert commands, f"{block.name}: no command"
    for command, expected in commands:
        line = command.replace("/tmp/eg", str(cwd / "eg"))
        done = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=_env(),
                              timeout=180, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == expected, (
            block.name,
            command,
            done.returncode,
            done.stdout[-2000:],
            done.stderr[-2000:],
        )
