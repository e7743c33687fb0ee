"""The review screen in a pseudo-terminal: the model's reason, editing in $EDITOR, respond.

The CLI runs as a real process on a pseudo-terminal (pexpect). ``$EDITOR`` is a
small Python script that records the file it was opened on and writes the next
of a list of prepared texts, as a person would: a first try that is not JSON,
a second the tool's schema refuses, a third that is right. What is asserted is
what the external systems hold afterwards (the mail sink's own rows), plus what
the editor was shown on each opening (nothing typed is lost).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pexpect

from effectgate.ledger import OpState, SqliteLedger
from tests.cli.conftest import cli_env, world

CHOICES = "[approve/edit/reject/respond/quit]"
FAKE_EDITOR = """
import json, pathlib, sys
work = pathlib.Path(sys.argv[1])
path = pathlib.Path(sys.argv[2])
steps = json.loads((work / "steps.json").read_text())
n = len(list(work.glob("seen-*.txt")))
(work / f"seen-{n}.txt").write_text(path.read_text())
path.write_text(steps[n])
"""


class _Tee(io.StringIO):
    """Keeps everything the child printed, and shows it with pytest -s."""

    def write(self, text: str) -> int:
        sys.stdout.write(text)
        return super().write(text)


def _spawn(*args: str, env: dict[str, str]) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "effectgate.cli", *args],
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(60, 200),
    )
    child.logfile_read = _Tee()
    return child


def _editor(tmp_path: Path, steps: list[str]) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "editor"
    work.mkdir()
    (work / "steps.json").write_text(json.dumps(steps))
    script = work / "fake_editor.py"
    script.write_text(FAKE_EDITOR)
    env = cli_env()
    env["EDITOR"] = f"{sys.executable} {script} {work}"
    return work, env


def test_edit_in_editor_keeps_what_was_typed_and_mails_the_edited_recipient(
    tmp_path: Path,
) -> None:
    """Demo incident: the mail is edited in $EDITOR (bad JSON, then a schema refusal, then
    right), confirmed after the diff; the note is rejected. One mail, to the new recipient."""
    state = tmp_path / "state"
    mail = {
        "to": ["lead@example.com"],
        "subject": "[high] orders error rate — TICKET-1",
        "body": "Edited by the reviewer.",
    }
    not_json = json.dumps(mail, indent=2)[:-1] + ',\n  "oops"\n}\n'
    refused = json.dumps({**mail, "cc": ["boss@example.com"]}, indent=2)
    work, env = _editor(tmp_path, [not_json, refused, json.dumps(mail, indent=2)])
    child = _spawn("demo", "--state-dir", str(state), "--thread", "screen", env=env)

    child.expect_exact("review: 1 side-effecting call(s)")
    child.expect_exact("the model's stated reason")
    child.expect_exact("Opening a ticket.")
    child.expect_exact("[1/1] create_ticket")
    child.expect_exact(CHOICES)
    child.sendline("a")

    child.expect_exact("review: 2 side-effecting call(s)")
    child.expect_exact("Mailing the on-call")
    child.expect_exact("[1/2] send_email")
    child.expect_exact(CHOICES)
    child.sendline("e")
    child.expect_exact("not JSON")
    child.expect_exact("refused by the tool's schema")
    child.expect_exact("edited arguments, against the shown ones")
    child.expect_exact('+    "lead@example.com"')
    child.expect_exact("new preview")
    child.expect_exact("To: lead@example.com")
    child.expect_exact("[yes/edit/cancel]")
    child.sendline("y")
    child.expect_exact("[2/2] write_file")
    child.expect_exact(CHOICES)
    child.sendline("r")
    child.expect_exact("reason")
    child.sendline("no note for this one")
    child.expect_exact("write_file was rejected")
    child.expect_exact("done (exit code 0)")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    # What the editor was opened on: the shown arguments, then each time the text
    # last typed, with the error on top as comment lines.
    seen = [(work / f"seen-{n}.txt").read_text() for n in range(3)]
    assert '"oncall@example.com"' in seen[0] and not seen[0].startswith("# not JSON")
    assert "# not JSON" in seen[1] and '"oops"' in seen[1]
    assert "# refused by the tool's schema" in seen[2] and "cc" in seen[2]
    assert '"boss@example.com"' in seen[2]
    assert not (work / "seen-3.txt").exists()

    found = world(state)
    assert len(found["tickets"]) == 1
    assert [m["rcpt_tos"] for m in found["mails"]] == [["lead@example.com"]]
    assert found["files"] == {}
    with SqliteLedger(state / "ledger.sqlite3") as ledger:
        (op,) = ledger.list(thread_id="screen", tool="send_email")
        assert (op.state, op.attempt, op.args["to"]) == (
            OpState.SUCCEEDED,
            1,
            ["lead@example.com"],
        )
        assert [a.decision for a in ledger.approvals(op.operation_id)] == ["edit"]


def test_prompt_edit_and_respond_with_a_hostile_reason(tmp_path: Path) -> None:
    """Without $EDITOR the multi-line prompt edits (a bad entry is offered again); the
    reason is escaped and cut; ``respond`` answers the model and runs nothing."""
    state = tmp_path / "state"
    reason = "Writing two files.\x1b]52;c;cHduZWQ=\x07 " + "x" * 3000
    script = tmp_path / "two.json"
    script.write_text(
        json.dumps(
            {
                "name": "two",
                "final": "Done.",
                "turns": [
                    {
                        "say": reason,
                        "tool_calls": [
                            {"name": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
                            {"name": "write_file", "args": {"path": "b.txt", "content": "b\n"}},
                        ],
                    }
                ],
            }
        )
    )
    env = cli_env()  # no $EDITOR or $VISUAL: the multi-line prompt
    child = _spawn(
        "run", "write", "--model", f"scripted:{script}", "--state-dir", str(state),
        "--thread", "prompt", env=env,
    )  # fmt: skip
    child.expect_exact("Writing two files.\\x1b]52;c;cHduZWQ=\\x07")
    child.expect_exact("more characters not shown")
    child.expect_exact("[1/2] write_file")
    child.expect_exact(CHOICES)
    child.sendline("edit")
    child.expect_exact("args> ")
    # Ctrl-U clears the prefilled line; two lines of not-quite JSON, then "."
    child.sendline('\x15{"path": "a.txt",')
    child.expect_exact("...> ")
    child.sendline(' "content": "A, edited\\n"')
    child.expect_exact("...> ")
    child.sendline(".")
    child.expect_exact("not JSON")
    child.expect_exact("your text is kept")
    # offered again on one line, as typed: only the closing brace is missing
    child.expect_exact('args> {"path": "a.txt", "content": "A, edited\\n"')
    child.sendline("}")
    child.expect_exact("...> ")
    child.sendline(".")
    child.expect_exact('+  "content": "A, edited\\n"')
    child.expect_exact("[yes/edit/cancel]")
    child.sendline("y")
    child.expect_exact("[2/2] write_file")
    child.expect_exact(CHOICES)
    child.sendline("respond")
    child.expect_exact("your answer to the model")
    child.sendline("b.txt exists already; leave it")
    child.expect_exact("done (exit code 0)")
    child.expect(pexpect.EOF)
    raw = child.logfile_read.getvalue()
    child.close()
    assert child.exitstatus == 0
    assert "\x1b]52" not in raw

    assert world(state)["files"] == {"a.txt": b"A, edited\n"}
    with SqliteLedger(state / "ledger.sqlite3") as ledger:
        ops = {op.args["path"]: op for op in ledger.list(thread_id="prompt")}
        assert {p: op.state for p, op in ops.items()} == {
            "a.txt": OpState.SUCCEEDED,
            "b.txt": OpState.REJECTED,
        }
        [answer] = ledger.approvals(ops["b.txt"].operation_id)
        assert answer.message == "b.txt exists already; leave it"
