"""A worker process for the conversation crash tests: start (or resume), approve, send.

``python -m tests.conversations._worker --state-dir DIR --thread T [--resume] [--send MSG]...``
plays ``CONVERSATION`` against the demo services whose endpoints are in
``DIR/services/endpoints.json``. Without ``--resume`` it calls ``Agent.start``
only (never ``resume`` as a fallback): a thread that exists is continued by
start-or-resume. Prints one JSON summary line; exits 0 when the thread is done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from effectgate import StateDir, open_agent
from effectgate.demo.services import published_endpoints
from effectgate.graph import Agent, RunStatus
from effectgate.models import ScriptedChatModel
from tests.conversations._scripts import CONVERSATION, TASK, approve_all


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--send", action="append", default=[])
    parser.add_argument(
        "--die-after-recording-turn",
        action="store_true",
        help="exit 137 right after a follow-up turn is recorded, before its message is added",
    )
    args = parser.parse_args()
    if args.die_after_recording_turn:
        Agent._apply_turn = lambda *a, **k: os._exit(137)  # type: ignore[method-assign]
    sd = StateDir.open(args.state_dir)
    model = ScriptedChatModel.from_script(CONVERSATION)
    with open_agent(sd, model=model, endpoints=published_endpoints(sd.services)) as agent:
        if args.resume:
            result = agent.resume(args.thread)
        else:
            result = agent.start(TASK, thread_id=args.thread)
        result = approve_all(agent, result)
        for i, message in enumerate(args.send):
            # the request id a client would send: a retry of the same request
            # (same id) continues the turn it recorded instead of adding another
            sent = agent.send(args.thread, message, request_id=f"request-{i}")
            result = approve_all(agent, sent)
    print(json.dumps({"status": result.status.value, "error": result.error}), flush=True)
    return 0 if result.status is RunStatus.DONE else 1


if __name__ == "__main__":
    sys.exit(main())
