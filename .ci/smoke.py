"""Smoke test for the lowest allowed dependency versions (run by .ci/lowest-deps).

Exercises what the demo does not: the OpenAI-compatible model path (langchain-openai,
openai, httpx) against a local server, through the CLI's `run` with one write that
stops for review and is approved; then checks the file the write left in the workspace.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from effectgate.testing.openai_server import FakeOpenAIServer, chat_reply

effectgate = Path(sys.executable).with_name("effectgate")
with tempfile.TemporaryDirectory() as tmp:
    state = Path(tmp) / "state"
    replies = [
        chat_reply("", [{"name": "write_file", "arguments": {"path": "a.txt", "content": "hi\n"}}]),
        chat_reply("wrote a.txt"),
    ]
    with FakeOpenAIServer(replies) as server:
        done = subprocess.run(
            [str(effectgate), "run", "write a.txt", "--model", "openai:smoke",
             "--base-url", server.base_url, "--api-key", "test", "--approve", "all",
             "--thread", "smoke", "--state-dir", str(state)],
            check=False,
        )
        requests = len(server.requests)
    assert done.returncode == 0, f"effectgate run exited {done.returncode}"
    written = (state / "workspace" / "a.txt").read_text()
    assert written == "hi\n", written
    assert requests == 2, requests
print("smoke: openai path, review, dispatch: ok")
