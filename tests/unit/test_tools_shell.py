"""run_shell: runs in the workspace, always reviewed, timeouts are unknown outcomes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from effectgate.errors import OutcomeUnknown, ToolCallError
from effectgate.tools import EffectKind, ToolContext, shell_tool
from effectgate.tools.builtin.shell import MAX_OUTPUT_BYTES

CTX = ToolContext(operation_id="t:c1", thread_id="t", tool_call_id="c1", attempt=1)


def test_contract_is_unsafe_and_always_reviewed(tmp_path: Path) -> None:
    """run_shell is UNSAFE with requires_approval=True; its docs say there is no sandbox."""
    spec = shell_tool(tmp_path)
    assert spec.kind is EffectKind.UNSAFE
    assert spec.requires_approval is True and spec.needs_review
    assert "NO sandbox" in (shell_tool.__doc__ or "")
    assert "NO sandbox" in spec.render_preview(spec.normalize({"command": "ls"}))


def test_runs_in_workspace_and_reports_exit_code(tmp_path: Path) -> None:
    """cwd is the workspace; a non-zero exit is a result, with both streams."""
    spec = shell_tool(tmp_path)
    result = spec.call(
        spec.normalize({"command": "echo hi > f.txt; echo out; echo err >&2; exit 3"}), CTX
    )
    assert (tmp_path / "f.txt").read_text() == "hi\n"
    assert result.value == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n"}


def test_output_is_truncated_and_says_so(tmp_path: Path) -> None:
    """stdout over 16 KiB is cut to 16 KiB plus a note with the dropped byte count."""
    spec = shell_tool(tmp_path)
    result = spec.call(spec.normalize({"command": "head -c 20000 /dev/zero | tr '\\0' a"}), CTX)
    out = result.value["stdout"]
    assert out.startswith("a" * MAX_OUTPUT_BYTES)
    assert out.endswith(
        f"[effectgate: output truncated; {20000 - MAX_OUTPUT_BYTES} more bytes not shown]"
    )


def test_timeout_is_outcome_unknown_and_kills_the_group(tmp_path: Path) -> None:
    """A command past its timeout raises OutcomeUnknown; its children are killed too."""
    spec = shell_tool(tmp_path, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown, match=r"0\.3 s"):
        spec.call(
            spec.normalize({"command": "touch started; (sleep 1; touch late) & sleep 5"}), CTX
        )
    assert time.monotonic() - started < 1.0
    time.sleep(1.3)
    assert (tmp_path / "started").exists()
    assert not (tmp_path / "late").exists()


def test_schema_refuses_empty_and_extra(tmp_path: Path) -> None:
    """An empty command or an unknown key is a ToolCallError."""
    spec = shell_tool(tmp_path)
    for raw in ({"command": "  "}, {"command": "ls", "cwd": "/"}):
        with pytest.raises(ToolCallError):
            spec.normalize(raw)


def test_timeout_must_be_positive(tmp_path: Path) -> None:
    """A zero timeout is refused when the tool is built."""
    with pytest.raises(ValueError, match="positive"):
        shell_tool(tmp_path, timeout_s=0)
