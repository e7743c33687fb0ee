"""Build the walkthrough notebooks from the Python source in this file.

The ``.ipynb`` files are generated, never edited by hand: change a cell here,
then run ``.venv/bin/python notebooks/_make.py`` to rewrite them (without
outputs, with stable cell ids), and ``--check`` to verify that the committed
files match this source. ``tests/notebooks/test_notebooks.py`` runs the check
and executes every notebook.

The cells live below, one list per notebook: ``md()`` is a Markdown cell,
``code()`` a code cell; both are dedented.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat

HERE = Path(__file__).resolve().parent

Cell = tuple[str, str]


def md(text: str) -> Cell:
    """A Markdown cell."""
    return ("markdown", textwrap.dedent(text).strip("\n"))


def code(text: str) -> Cell:
    """A code cell."""
    return ("code", textwrap.dedent(text).strip("\n"))


# Shared cells ---------------------------------------------------------------------------

TABLE_HELPER = code(
    r'''
    def table(rows, headers):
        """Print rows as a plain fixed-width table."""
        rows = [[str(x) for x in row] for row in rows]
        widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
        for row in [list(headers), *rows]:
            print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


    def show_operations(ops):
        """One line per ledger operation: tool, state, attempt, receipt reference."""
        table(
            [
                (
                    op.tool,
                    op.state.value,
                    op.attempt,
                    op.receipt.source if op.receipt else "-",
                    op.receipt.reference if op.receipt else "-",
                    op.operation_id,
                )
                for op in ops
            ],
            ["tool", "state", "attempt", "receipt", "reference", "operation_id"],
        )
    '''
)


def workdir_cell(stem: str) -> Cell:
    """The cell that makes the notebook's private temporary directory."""
    return code(
        f'''
        import os
        import tempfile
        from pathlib import Path

        # Everything this notebook writes goes into one new directory, created in
        # EFFECTGATE_NOTEBOOK_DIR if set (the test suite sets it), else in the system temp dir.
        parent = os.environ.get("EFFECTGATE_NOTEBOOK_DIR")
        workdir = Path(tempfile.mkdtemp(prefix="{stem}-", dir=parent))
        print(workdir)
        '''
    )


# 01 quickstart ---------------------------------------------------------------------------

QUICKSTART: list[Cell] = [
    md(
        """
        # 01 · Quickstart: review, approve, receipts, ledger

        effectgate is a LangGraph agent whose side effects are safe to replay. Every
        side-effecting tool call stops at a **human review** (a LangGraph `interrupt()`),
        and every approved call goes through a durable **operation ledger** before it
        touches the outside world, so a resume, a replay or a restart after a crash never
        repeats a write.

        This notebook runs the packaged *incident* demo end to end, offline:

        1. start two small external systems on 127.0.0.1 (a ticket service and a mail sink),
        2. build the agent with the scripted (offline) model,
        3. run until the review interrupt and read the review request,
        4. approve, and look at the receipts, the ledger and the external systems' own storage.
        """
    ),
    workdir_cell("01_quickstart"),
    TABLE_HELPER,
    md(
        """
        ## The outside world

        `DemoServices` starts a ticket service and a mail sink as separate processes. They keep
        their own SQLite files, so "did it happen?" is answered by *their* storage, never by
        effectgate. We set the order service's error rate to 12 %, above the demo's 5 % alert
        threshold, so the agent has an incident to handle.

        A `StateDir` holds everything else: the LangGraph checkpoints, the ledger, the file
        tools' workspace and the services' data.
        """
    ),
    code(
        """
        from effectgate import StateDir
        from effectgate.demo import DemoServices

        state = StateDir.open(workdir / "state")
        services = DemoServices(state.services)
        services.start()
        services.set_error_rate("orders", 0.12)
        services.endpoints
        """
    ),
    md(
        """
        ## The agent

        `open_agent` wires a chat model, the built-in tools (files, shell, tickets, mail), a
        SQLite checkpointer and a SQLite ledger to the state directory. `"scripted:incident"`
        is an offline model that plays a fixed script: read the error rate, open a ticket,
        then mail the on-call engineer and write an incident note *in parallel*.

        `open_agent` is a context manager; an `ExitStack` keeps it open across cells.
        """
    ),
    code(
        """
        from contextlib import ExitStack

        from effectgate import RunStatus, open_agent

        stack = ExitStack()
        agent = stack.enter_context(
            open_agent(state, model="scripted:incident", endpoints=services.endpoints)
        )

        TASK = "Check the order service and handle any incident."
        THREAD = "incident-1"
        result = agent.start(TASK, thread_id=THREAD)
        result.status
        """
    ),
    md(
        """
        ## The review request

        Reading the error rate is a read-only call, so it ran without asking. Opening a
        ticket is a write: the run stopped at the review interrupt. The request carries
        everything a reviewer needs: the arguments, a preview of exactly what will happen,
        the tool's **effect kind** (how it can be recovered if its outcome is ever unknown),
        the **operation id** (the idempotency key) and the **intent hash** (SHA-256 of the
        tool and its normalized arguments: an approval authorises exactly this hash).
        """
    ),
    code(
        """
        assert result.status is RunStatus.WAITING_REVIEW
        (pending,) = result.interrupts
        request = pending.value
        (action,) = request["action_requests"]
        print("tool:         ", action["name"])
        print("effect kind:  ", action["effect_kind"])
        print("operation id: ", action["operation_id"])
        print("intent hash:  ", action["intent_hash"])
        print("approval TTL: ", action["approval_ttl_s"], "s")
        print("decisions:    ", request["review_configs"][0]["allowed_decisions"])
        print()
        print(action["preview"])
        """
    ),
    md(
        """
        Nothing has been written yet: the ticket service's own storage is empty, and the
        ledger knows nothing about the ticket.
        """
    ),
    code(
        """
        assert services.tickets() == []
        assert agent.ledger.list(thread_id=THREAD) == []
        print("tickets:", len(services.tickets()), " ledger operations:", 0)
        """
    ),
    md(
        """
        ## Approve

        A resume answers the interrupt with one decision per pending call, in order. The
        shape follows LangChain's `HumanInTheLoopMiddleware`: `approve`, `edit` or `reject`.
        The ticket is created; the model then proposes two calls in one message (mail and
        note), so the run stops at a second review.
        """
    ),
    code(
        """
        result = agent.resume(
            THREAD, decisions={"decisions": [{"type": "approve"}], "reviewer": "ana"}
        )
        assert result.status is RunStatus.WAITING_REVIEW
        for action in result.interrupts[0].value["action_requests"]:
            print(f"--- {action['name']} ({action['effect_kind']}) {action['operation_id']}")
            print(action["preview"])
        """
    ),
    code(
        """
        result = agent.resume(
            THREAD,
            decisions={"decisions": [{"type": "approve"}, {"type": "approve"}], "reviewer": "ana"},
        )
        assert result.status is RunStatus.DONE
        print(result.final_message)
        """
    ),
    md(
        """
        ## Receipts

        Each executed operation ended `SUCCEEDED` with a **receipt**: the result, a reference
        in the external system (ticket number, Message-ID, content hash) and the attempt that
        produced it. The model saw the same receipts as `ToolMessage`s.
        """
    ),
    code(
        """
        show_operations(result.operations)
        """
    ),
    code(
        """
        import json

        from langchain_core.messages import ToolMessage

        for message in agent.messages(THREAD):
            if isinstance(message, ToolMessage):
                body = json.loads(message.content)
                print(f"{message.name:15} {body['status']:10} reference={body.get('reference')}")
        """
    ),
    md(
        """
        ## The ledger

        The ledger is the durable record of every external action. Its append-only event log
        shows each transition with its time and attempt: `PROPOSED → APPROVED` (the review),
        `APPROVED → IN_FLIGHT` (committed *before* the call leaves the process) and
        `IN_FLIGHT → SUCCEEDED` (committed before the graph moves on).
        """
    ),
    code(
        """
        events = agent.ledger.events(thread_id=THREAD)
        start = events[0].at
        table(
            [
                (
                    f"{(e.at - start).total_seconds():.3f}",
                    e.operation_id[:28],
                    e.kind.value,
                    e.src.value if e.src else "",
                    e.dst.value if e.dst else "",
                    e.attempt,
                )
                for e in events
            ],
            ["t (s)", "operation", "kind", "from", "to", "attempt"],
        )
        """
    ),
    code(
        """
        metrics = agent.ledger.metrics()
        print("operations by state:", {k: v for k, v in metrics.by_state.items() if v})
        print("first-attempt success rate:", metrics.first_attempt_success_rate)
        print("open unknowns:", metrics.open_unknowns)
        """
    ),
    md(
        """
        ## The outside world, from its own storage

        `effectgate.testing.oracle.world` reads the ticket service's and mail sink's SQLite
        files and the workspace bytes directly: one ticket, one mail, one note.
        """
    ),
    code(
        """
        from effectgate.testing.oracle import world

        w = world(state)
        print(w.as_dict())
        assert (w.tickets, w.mails) == (1, 1)
        assert list(w.files) == ["incidents/orders-error-rate.md"]
        print(w.files["incidents/orders-error-rate.md"].decode())
        """
    ),
    md(
        """
        ## Resuming a finished thread does nothing

        A resume of a thread that is done runs nothing; the ticket service saw exactly one
        create request.
        """
    ),
    code(
        """
        again = agent.resume(THREAD)
        assert again.status is RunStatus.DONE
        assert services.stats("tickets")["create_requests"] == 1
        services.stats("tickets")
        """
    ),
    code(
        """
        stack.close()
        services.stop()
        """
    ),
]

# 02 approve / edit / reject --------------------------------------------------------------

DECISIONS: list[Cell] = [
    md(
        """
        # 02 · Approve, edit, reject, and an approval that expires

        One AI message can propose several side-effecting calls at once. The review interrupt
        asks about all of them together, and the reviewer answers each one separately:

        * **approve** runs the call as proposed,
        * **edit** runs *different* arguments (the approval is bound to their new intent hash,
          and the model is told what actually ran),
        * **reject** runs nothing and tells the model why.

        At the end, an approval that expires before its call starts goes back to review.
        """
    ),
    workdir_cell("02_approve_edit_reject"),
    TABLE_HELPER,
    code(
        """
        from contextlib import ExitStack

        from effectgate import RunStatus, ScriptedChatModel, StateDir, open_agent
        from effectgate.demo import DemoServices

        state = StateDir.open(workdir / "state")
        services = DemoServices(state.services)
        services.start()
        stack = ExitStack()
        """
    ),
    md(
        """
        ## A model that proposes three writes in one message

        `ScriptedChatModel.from_script` plays an in-memory script offline. This one opens a
        ticket, mails *everyone* and writes a note, all in a single AI message.
        """
    ),
    code(
        """
        TRIAGE = {
            "name": "triage",
            "turns": [
                {
                    "say": "Filing the incident: ticket, mail and note.",
                    "tool_calls": [
                        {
                            "name": "create_ticket",
                            "args": {
                                "title": "orders: error rate above 5%",
                                "body": "The order service's error rate is 0.12.",
                                "severity": "high",
                                "alert_id": "orders-error-rate",
                            },
                        },
                        {
                            "name": "send_email",
                            "args": {
                                "to": ["everyone@example.com"],
                                "subject": "orders are failing",
                                "body": "The order service is failing. Ticket to follow.",
                            },
                        },
                        {
                            "name": "write_file",
                            "args": {"path": "incidents/orders.md", "content": "# orders\\n"},
                        },
                    ],
                },
                {"say": "Filed what the reviewer allowed."},
            ],
        }
        agent = stack.enter_context(
            open_agent(
                state, model=ScriptedChatModel.from_script(TRIAGE), endpoints=services.endpoints
            )
        )
        THREAD = "triage-1"
        result = agent.start("Triage the orders incident.", thread_id=THREAD)
        assert result.status is RunStatus.WAITING_REVIEW
        actions = result.interrupts[0].value["action_requests"]
        table(
            [
                (a["name"], a["effect_kind"], a["operation_id"], a["intent_hash"][:16])
                for a in actions
            ],
            ["tool", "kind", "operation_id", "intent_hash"],
        )
        """
    ),
    md(
        """
        ## Decide: approve one, edit one, reject one

        The mail goes to the on-call engineer instead of everyone, with a clearer subject.
        Below is the diff between the proposed and the edited arguments.
        """
    ),
    code(
        """
        import difflib
        import json

        ticket, mail, note = actions
        edited_mail = {
            **mail["args"],
            "to": ["oncall@example.com"],
            "subject": "[high] orders error rate above 5%",
        }


        def pretty(args):
            return json.dumps(args, indent=2, sort_keys=True).splitlines()


        print(
            "\\n".join(
                difflib.unified_diff(
                    pretty(mail["args"]), pretty(edited_mail), "proposed", "edited", lineterm=""
                )
            )
        )
        """
    ),
    code(
        """
        answer = {
            "decisions": [
                {"type": "approve"},
                {"type": "edit", "edited_action": {"name": "send_email", "args": edited_mail}},
                {"type": "reject", "message": "Notes go into the ticket; no files today."},
            ],
            "reviewer": "ana",
        }
        result = agent.resume(THREAD, decisions=answer)
        assert result.status is RunStatus.DONE
        show_operations(result.operations)
        """
    ),
    md(
        """
        ## The edit has a new intent hash

        The ledger stores the *edited* arguments and their hash; the approval record names the
        reviewer, the decision and the hash it authorises. Recomputing the hash from the
        stored arguments with `effectgate.tools.intent_hash` gives the same value, and it is
        not the hash the model proposed.
        """
    ),
    code(
        """
        from effectgate.tools import intent_hash

        (mail_op,) = agent.ledger.list(thread_id=THREAD, tool="send_email")
        approval = agent.ledger.latest_approval(mail_op.operation_id)
        print("proposed intent hash:", mail["intent_hash"])
        print("executed intent hash:", mail_op.intent_hash)
        print("approved intent hash:", approval.intent_hash)
        print("approval:", approval.decision, "by", approval.reviewer)
        assert mail_op.intent_hash != mail["intent_hash"]
        assert approval.intent_hash == mail_op.intent_hash
        assert intent_hash("send_email", mail_op.tool_version, mail_op.args) == mail_op.intent_hash
        """
    ),
    md(
        """
        The external systems agree: one ticket, one mail to the on-call address only, and no
        note file (the rejected call never ran).
        """
    ),
    code(
        """
        from effectgate.testing.oracle import world

        (delivered,) = services.mails()
        print(delivered["rcpt_tos"], delivered["subject"])
        w = world(state)
        print(w.as_dict())
        assert delivered["rcpt_tos"] == ["oncall@example.com"]
        assert (w.tickets, w.mails, w.files) == (1, 1, {})
        """
    ),
    md(
        """
        ## What the model sees afterwards

        Every `tool_call_id` of the AI message is answered by exactly one `ToolMessage`
        before the model runs again (the OpenAI chat API rejects anything else). The edited
        call's answer says that a human replaced it and what ran instead; the rejected one
        says it was not executed, with the reviewer's reason.
        """
    ),
    code(
        """
        from langchain_core.messages import AIMessage, ToolMessage

        from effectgate.graph import history_problems

        messages = agent.messages(THREAD)
        for m in messages:
            if isinstance(m, AIMessage):
                calls = [c["name"] for c in m.tool_calls]
                print(f"AI    {m.content!r} calls={calls}")
            elif isinstance(m, ToolMessage):
                body = json.loads(m.content)
                said = body.get("note") or body.get("message") or body.get("reference")
                print(f"TOOL  {m.name:13} {body['status']:9} {said}")
            else:
                print(f"HUMAN {m.content!r}")
        assert history_problems(messages) == []
        """
    ),
    md(
        """
        ## An approval that expires

        Approvals last `Policy.approval_ttl` (one hour by default). If the call has not
        started by then, the approval no longer authorises it: the call goes back to review.

        To show this we use a two-second TTL and a note-writing script, and we stop the run
        right after the review step with LangGraph's own `interrupt_after`, as if the worker
        had been stopped between the review and the effect. Then we wait three seconds and
        resume.
        """
    ),
    code(
        """
        import time
        from datetime import timedelta

        from langgraph.types import Command

        from effectgate import Policy

        NOTE = {
            "name": "note",
            "turns": [
                {
                    "say": "Writing the note.",
                    "tool_calls": [
                        {
                            "name": "write_file",
                            "args": {"path": "notes/expiry.md", "content": "hi\\n"},
                        }
                    ],
                },
                {"say": "Note written."},
            ],
        }
        short = stack.enter_context(
            open_agent(
                state,
                model=ScriptedChatModel.from_script(NOTE),
                policy=Policy(approval_ttl=timedelta(seconds=2)),
            )
        )
        result = short.start("Write the note.", thread_id="note-1")
        pending = result.interrupts[0]
        short.graph.invoke(
            Command(resume={pending.id: {"decisions": [{"type": "approve"}], "reviewer": "ana"}}),
            {"configurable": {"thread_id": "note-1"}},
            interrupt_after=["review"],
            durability="sync",
        )
        show_operations(short.ledger.list(thread_id="note-1"))
        """
    ),
    code(
        """
        time.sleep(3)
        result = short.resume("note-1")
        assert result.status is RunStatus.WAITING_REVIEW
        (action,) = result.interrupts[0].value["action_requests"]
        print(action["description"])
        assert "expired" in action["description"]
        assert not (state.workspace / "notes/expiry.md").exists()
        show_operations(result.operations)
        """
    ),
    md(
        """
        The expired approval was withdrawn (the operation is `PROPOSED` again) and nothing was
        written. A fresh approval runs it once.
        """
    ),
    code(
        """
        result = short.resume(
            "note-1", decisions={"decisions": [{"type": "approve"}], "reviewer": "ana"}
        )
        assert result.status is RunStatus.DONE
        (note_op,) = result.operations
        table(
            [
                (a.decision, a.reviewer, a.decided_at.isoformat(), a.expires_at.isoformat())
                for a in short.ledger.approvals(note_op.operation_id)
            ],
            ["decision", "reviewer", "decided_at", "expires_at"],
        )
        assert (state.workspace / "notes/expiry.md").read_text() == "hi\\n"
        """
    ),
    code(
        """
        stack.close()
        services.stop()
        """
    ),
]

# 03 kill and resume ----------------------------------------------------------------------

KILL: list[Cell] = [
    md(
        """
        # 03 · Kill a worker mid-dispatch, resume, and count

        A worker process runs the incident thread. We **SIGKILL** it while its ticket request
        is inside the ticket service, after the service committed the ticket but before the
        worker heard back. The ledger still says `IN_FLIGHT`; the ticket exists. Then we
        resume the thread from this notebook and count what the external systems hold.

        The kills happen in **subprocesses**, never in this kernel.
        """
    ),
    workdir_cell("03_kill_and_resume"),
    TABLE_HELPER,
    code(
        """
        from effectgate import OpState, RunStatus, SqliteLedger, StateDir, open_agent
        from effectgate.demo import DemoServices

        state = StateDir.open(workdir / "state")
        services = DemoServices(state.services)
        services.start()
        services.set_error_rate("orders", 0.12)
        ledger = SqliteLedger(state.ledger)
        THREAD = "incident-1"
        """
    ),
    md(
        """
        ## The worker

        `python -m effectgate.testing.worker` opens the agent on the state directory (it reads
        the services' addresses from `services/endpoints.json`), starts or resumes one thread,
        and approves every review. We make the ticket service commit each new ticket and then
        hold the connection for five seconds without answering (`timeout-after-commit`), so
        there is a moment when the ticket exists and the worker does not know it yet.
        """
    ),
    code(
        """
        import signal
        import subprocess
        import sys
        import time

        services.set_fault("tickets", "timeout-after-commit", delay_s=5)
        WORKER = [
            sys.executable, "-m", "effectgate.testing.worker",
            "--state-dir", str(state.root), "--thread", THREAD,
        ]
        worker = subprocess.Popen(
            WORKER,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        started = time.monotonic()
        while time.monotonic() - started < 60:
            in_flight = ledger.list(thread_id=THREAD, states=[OpState.IN_FLIGHT])
            if in_flight and services.tickets():
                break
            assert worker.poll() is None, worker.communicate()
            time.sleep(0.05)
        else:
            raise TimeoutError("the worker never reached the ticket call")

        worker.send_signal(signal.SIGKILL)
        worker.wait()
        print(f"killed after {time.monotonic() - started:.1f} s; exit status {worker.returncode}")
        assert worker.returncode == -signal.SIGKILL
        """
    ),
    md(
        """
        ## What the kill left behind

        The ledger row is `IN_FLIGHT`, attempt 1, with no receipt: the attempt was durably
        claimed before the request left, and the result never came back. The ticket service,
        asked directly, holds the ticket, filed under the operation id as its
        `Idempotency-Key`.
        """
    ),
    code(
        """
        show_operations(ledger.list(thread_id=THREAD))
        (op,) = ledger.list(thread_id=THREAD)
        assert (op.tool, op.state, op.attempt) == ("create_ticket", OpState.IN_FLIGHT, 1)
        assert op.receipt is None
        table(
            [(t["ticket_id"], t["title"], t["idempotency_key"]) for t in services.tickets()],
            ["ticket_id", "title", "idempotency_key"],
        )
        """
    ),
    md(
        """
        ## Resume from the notebook

        `agent.resume` takes the thread's lease (its holder is dead, so it takes it over at
        once), turns the `IN_FLIGHT` row into `UNKNOWN` (never "not done"), and asks the ticket
        service by key whether the ticket exists. It does: the operation becomes `SUCCEEDED`
        with a receipt whose source is `reconcile`, still attempt 1. Nothing was sent again.
        The run then stops at the review of the mail and the note.
        """
    ),
    code(
        """
        from contextlib import ExitStack

        services.set_fault("tickets", "normal")
        stack = ExitStack()
        agent = stack.enter_context(open_agent(state, endpoints=services.endpoints))
        result = agent.resume(THREAD)
        assert result.status is RunStatus.WAITING_REVIEW
        show_operations(result.operations)
        (ticket_op,) = agent.ledger.list(thread_id=THREAD, tool="create_ticket")
        assert (ticket_op.state, ticket_op.attempt) == (OpState.SUCCEEDED, 1)
        assert ticket_op.receipt.source == "reconcile"
        """
    ),
    code(
        """
        import json

        table(
            [
                (
                    e.src.value if e.src else "",
                    e.dst.value if e.dst else "",
                    e.attempt,
                    json.dumps(dict(e.detail))[:90],
                )
                for e in agent.ledger.events(operation_id=ticket_op.operation_id)
            ],
            ["from", "to", "attempt", "detail"],
        )
        """
    ),
    md(
        """
        ## A second kill, at a named seam

        Failpoints are named places where a process exits at once (`os._exit(137)`, like
        `kill -9`). `EFFECTGATE_FAILPOINT=AFTER_EXTERNAL_COMMIT@send_email` kills the worker
        right after the mail sink accepted the mail and before the ledger records it. The
        worker approves the pending mail and note, sends the mail, and dies.
        """
    ),
    code(
        """
        env = {**os.environ, "EFFECTGATE_FAILPOINT": "AFTER_EXTERNAL_COMMIT@send_email"}
        killed = subprocess.run(
            WORKER, capture_output=True, text=True, env=env, timeout=120, check=False
        )
        print("exit status", killed.returncode)
        print(killed.stderr.strip().splitlines()[-1])
        assert killed.returncode == 137
        show_operations(ledger.list(thread_id=THREAD))
        print("mails in the sink:", len(services.mails()))
        """
    ),
    code(
        """
        result = agent.resume(THREAD)
        assert result.status is RunStatus.DONE, result
        show_operations(result.operations)
        print(result.final_message)
        """
    ),
    md(
        """
        ## Count

        Two kills, two resumes: the ticket service and the mail sink each hold exactly one
        record, and the ticket service received exactly one create request.
        """
    ),
    code(
        """
        from effectgate.testing.oracle import checkpoint_problems, world

        w = world(state)
        print(w.as_dict())
        print("ticket create requests:", services.stats("tickets")["create_requests"])
        assert (w.tickets, w.mails) == (1, 1)
        assert (w.duplicate_tickets, w.duplicate_mails) == (0, 0)
        assert services.stats("tickets")["create_requests"] == 1
        assert checkpoint_problems(state.checkpoints, THREAD) == []
        """
    ),
    code(
        """
        stack.close()
        ledger.close()
        services.stop()
        """
    ),
]

# 04 time travel --------------------------------------------------------------------------

TIME_TRAVEL: list[Cell] = [
    md(
        """
        # 04 · Time travel: replay every checkpoint, fork with `update_state`

        LangGraph keeps a checkpoint after every step, and can re-run a thread from any of
        them (*replay*) or from an edited copy (*fork*). Re-running a step that wrote to the
        outside world is exactly what effectgate makes harmless: the ledger answers with the
        stored receipt instead of calling the tool again, and a fork that changes the
        arguments of an executed call is flagged as a **conflict** for review.
        """
    ),
    workdir_cell("04_time_travel"),
    TABLE_HELPER,
    code(
        """
        from contextlib import ExitStack

        from effectgate import RunStatus, StateDir, open_agent
        from effectgate.demo import DemoServices
        from effectgate.testing.oracle import world

        state = StateDir.open(workdir / "state")
        services = DemoServices(state.services)
        services.start()
        services.set_error_rate("orders", 0.12)
        stack = ExitStack()
        agent = stack.enter_context(open_agent(state, endpoints=services.endpoints))
        THREAD = "incident-1"
        CONFIG = {"configurable": {"thread_id": THREAD}}


        def approve_all(result):
            n = len(result.interrupts[0].value["action_requests"])
            return {"decisions": [{"type": "approve"}] * n, "reviewer": "ana"}


        def run_to_end(result):
            while result.status is RunStatus.WAITING_REVIEW:
                result = agent.resume(THREAD, decisions=approve_all(result))
            return result


        TASK = "Check the order service and handle any incident."
        result = run_to_end(agent.start(TASK, thread_id=THREAD))
        assert result.status is RunStatus.DONE
        show_operations(result.operations)
        """
    ),
    md(
        """
        ## The thread's checkpoints

        `agent.graph` is the compiled LangGraph graph; `get_state_history` lists the
        checkpoints newest first, with the node(s) that would run next.
        """
    ),
    code(
        """
        history = list(agent.graph.get_state_history(CONFIG))
        table(
            [
                (
                    s.metadata["step"],
                    ", ".join(s.next) or "(end)",
                    len(s.values.get("messages", [])),
                    "yes" if s.interrupts else "",
                    s.config["configurable"]["checkpoint_id"],
                )
                for s in history
            ],
            ["step", "next", "messages", "interrupt", "checkpoint_id"],
        )
        """
    ),
    md(
        """
        ## Replay from every checkpoint

        `agent.replay(thread, checkpoint_id)` re-runs the thread from that checkpoint. The
        scripted model proposes the same calls again; the ticket, the mail and the note are
        operations that already ended with these very arguments, so they are not even
        reviewed again, and dispatch hands back the stored receipts. The external systems do
        not change.
        """
    ),
    code(
        """
        before = world(state)
        reused_before = agent.ledger.metrics().results_reused
        for snapshot in history:
            checkpoint_id = snapshot.config["configurable"]["checkpoint_id"]
            replayed = run_to_end(agent.replay(THREAD, checkpoint_id))
            assert replayed.status is RunStatus.DONE
        after = world(state)
        print("replays:", len(history))
        print("stored receipts handed back:", agent.ledger.metrics().results_reused - reused_before)
        print("ticket create requests:", services.stats("tickets")["create_requests"])
        print("mail DATA commands:   ", services.stats("mail")["data_commands"])
        assert after == before
        assert services.stats("tickets")["create_requests"] == 1
        assert services.stats("mail")["data_commands"] == 1
        """
    ),
    md(
        """
        ## Fork with edited arguments

        `update_state` writes a new checkpoint on top of an old one. Here we take the
        checkpoint where the model had just proposed the ticket, and replace the proposal
        with one that has a different title, as if the model had said something else. The
        ticket's operation id comes from its alert id, so the new call maps onto the operation
        that already succeeded, with a different intent hash: a **conflict**. The review
        shows it, and `approve` is not among the allowed decisions.
        """
    ),
    code(
        """
        snapshot = next(
            s
            for s in history  # the original run's checkpoints, listed above
            if s.next == ("review",)
            and any(c["name"] == "create_ticket" for c in s.values["messages"][-1].tool_calls)
        )
        proposal = snapshot.values["messages"][-1]
        call = dict(proposal.tool_calls[0])
        call["args"] = {**call["args"], "title": "orders: SEV1, everything is on fire"}
        forked = agent.graph.update_state(
            snapshot.config,
            {"messages": [proposal.model_copy(update={"tool_calls": [call]})]},
            as_node="agent",
        )
        result = agent.replay(THREAD, forked["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW
        request = result.interrupts[0].value
        (action,) = request["action_requests"]
        print("allowed decisions:", request["review_configs"][0]["allowed_decisions"])
        print("conflict:")
        for key, value in action["conflict"].items():
            print(f"  {key}: {value}")
        """
    ),
    code(
        """
        from effectgate.errors import DecisionError

        try:
            agent.resume(THREAD, decisions={"decisions": [{"type": "approve"}]})
        except DecisionError as exc:
            print("refused:", exc)
        else:
            raise AssertionError("approving a conflict must be refused")
        reject = {"type": "reject", "message": "keep the first ticket"}
        result = agent.resume(THREAD, decisions={"decisions": [reject], "reviewer": "ana"})
        print(result.status, "-", result.final_message)
        assert world(state) == before
        assert services.stats("tickets")["create_requests"] == 1
        """
    ),
    md(
        """
        ## A re-plan with new call ids

        A real model replayed from an old checkpoint rarely produces the same tool-call ids.
        Here a model with fresh random ids re-plans from the checkpoint just before the mail
        and the note. Their operation ids are new, but each call's intent hash equals that of
        an operation that already succeeded, so the review flags it as a **possible
        duplicate** and never approves it on its own. We reject both.
        """
    ),
    code(
        """
        from langchain_core.messages import ToolMessage

        from effectgate import ScriptedChatModel
        from effectgate.models import load_script

        replanner = stack.enter_context(
            open_agent(
                state,
                model=ScriptedChatModel.from_script(load_script("incident"), fresh_ids=True),
                endpoints=services.endpoints,
            )
        )
        before_mail = next(
            s
            for s in history  # the original run's checkpoints
            if s.next == ("agent",)
            and [m.name for m in s.values["messages"] if isinstance(m, ToolMessage)]
            == ["get_error_rate", "create_ticket"]
        )
        result = replanner.replay(THREAD, before_mail.config["configurable"]["checkpoint_id"])
        assert result.status is RunStatus.WAITING_REVIEW
        actions = result.interrupts[0].value["action_requests"]
        table(
            [(a["name"], a["operation_id"], a["possible_duplicate_of"]) for a in actions],
            ["tool", "new operation_id", "possible duplicate of"],
        )
        assert all(a["possible_duplicate_of"] for a in actions)
        result = replanner.resume(
            THREAD, decisions={"decisions": [{"type": "reject"}] * len(actions), "reviewer": "ana"}
        )
        assert result.status is RunStatus.DONE
        print(world(state).as_dict())
        assert world(state) == before
        """
    ),
    code(
        """
        stack.close()
        services.stop()
        """
    ),
]

# 05 unknown outcomes ---------------------------------------------------------------------

UNKNOWN: list[Cell] = [
    md(
        """
        # 05 · Unknown outcomes: reconcile, park, decide

        A timeout after a request was sent does not mean it failed: the other side may have
        committed it. effectgate records such an attempt as `UNKNOWN`, and the **tool's
        contract** decides what happens next:

        | effect kind | after `UNKNOWN` |
        |---|---|
        | `idempotent` / `keyed` | a new attempt with the same arguments / the same key |
        | `reconcilable` | look it up: found → `SUCCEEDED`; cannot ask → `NEEDS_RECONCILIATION` |
        | `unsafe` | `NEEDS_RECONCILIATION`: a human decides, with the evidence |

        This notebook shows three cases: a ticket that timed out after commit (reconciled by
        lookup), a mail that timed out while lookups were down (parked, then a human verdict),
        and a shell command that timed out (unsafe: parked, then a human verdict). It ends
        with the ledger metrics and a timeline of every operation's states.
        """
    ),
    workdir_cell("05_unknown_outcomes"),
    TABLE_HELPER,
    md(
        """
        ## Tools with short timeouts

        We build the tool list ourselves, with short timeouts (one second for the ticket and
        mail clients, two for shell commands), so that this notebook does not wait long.
        """
    ),
    code(
        """
        from contextlib import ExitStack

        from effectgate import OpState, RunStatus, StateDir, open_agent
        from effectgate.demo import DemoServices
        from effectgate.tools import file_tools, mail_tools, shell_tool, ticket_tools

        state = StateDir.open(workdir / "state")
        services = DemoServices(state.services)
        services.start()
        services.set_error_rate("orders", 0.12)
        ep = services.endpoints
        tools = [
            *file_tools(state.workspace),
            shell_tool(state.workspace, timeout_s=2.0),
            *ticket_tools(ep.ticket_url, timeout_s=1.0),
            *mail_tools(ep.smtp_host, ep.smtp_port, ep.mail_url, timeout_s=1.0),
        ]
        table([(t.name, t.kind.value) for t in tools], ["tool", "effect kind"])
        stack = ExitStack()
        agent = stack.enter_context(open_agent(state, tools=tools))


        def approve_all(result):
            n = len(result.interrupts[0].value["action_requests"])
            return {"decisions": [{"type": "approve"}] * n, "reviewer": "ana"}
        """
    ),
    md(
        """
        ## 1. Timeout after commit, lookups working → reconciled

        The ticket service commits the ticket, then holds the connection for two seconds
        without answering; our client gives up after one. The attempt is `UNKNOWN`. The
        ticket tool can look a ticket up by its idempotency key: found, so the operation is
        `SUCCEEDED` with a receipt from the lookup (`source = reconcile`), attempt 1.
        """
    ),
    code(
        """
        services.set_fault("tickets", "timeout-after-commit", delay_s=2)
        THREAD = "incident-1"
        result = agent.start("Check the order service and handle any incident.", thread_id=THREAD)
        result = agent.resume(THREAD, decisions=approve_all(result))
        (ticket_op,) = agent.ledger.list(thread_id=THREAD, tool="create_ticket")
        show_operations([ticket_op])
        assert (ticket_op.state, ticket_op.attempt) == (OpState.SUCCEEDED, 1)
        assert ticket_op.receipt.source == "reconcile"
        for e in agent.ledger.events(operation_id=ticket_op.operation_id):
            print(f"{e.src.value if e.src else '':9} -> {e.dst.value:10} {dict(e.detail)}")
        """
    ),
    md(
        """
        ## 2. Timeout after commit, lookups down → parked → human verdict

        Now the mail sink accepts the mail, holds the connection, and refuses lookups
        (`ambiguous-unqueryable`). The mail's outcome is unknown and nobody can ask, so the
        operation is parked as `NEEDS_RECONCILIATION`, and the run stops at a
        **reconciliation interrupt** carrying the evidence. The note, written in parallel,
        succeeded on its own.
        """
    ),
    code(
        """
        import json

        services.set_fault("mail", "ambiguous-unqueryable", delay_s=2)
        result = agent.resume(THREAD, decisions=approve_all(result))
        assert result.status is RunStatus.WAITING_RECONCILIATION
        show_operations(result.operations)
        (pending,) = result.interrupts
        print(json.dumps(pending.value["evidence"], indent=2, ensure_ascii=False))
        """
    ),
    md(
        """
        While it waits, the ledger metrics show the open unknown and its age.
        """
    ),
    code(
        """
        metrics = agent.ledger.metrics()
        print("open unknowns:", metrics.open_unknowns)
        print(f"oldest reconciliation age: {metrics.oldest_reconciliation_age_s:.2f} s")
        assert metrics.open_unknowns == 1
        """
    ),
    md(
        """
        A verdict is `succeeded` (with the reference you checked), `failed`, or `retry`. A
        retry may duplicate the mail, so it is refused unless the human acknowledges that
        risk explicitly:
        """
    ),
    code(
        """
        from effectgate.errors import DecisionError

        mail_id = pending.value["operation_id"]
        try:
            agent.resume(THREAD, verdicts={mail_id: {"verdict": "retry"}})
        except DecisionError as exc:
            print("refused:", exc)
        """
    ),
    md(
        """
        The human looks in the mail sink (here: its own storage) for the Message-ID the tool
        used, finds the mail, and says so. The verdict becomes the receipt (`source = human`)
        and the thread finishes without sending anything again.
        """
    ),
    code(
        """
        (delivered,) = services.mails()
        print("found in the mail sink:", delivered["message_id"], delivered["subject"])
        result = agent.resume(
            THREAD,
            verdicts={
                mail_id: {
                    "verdict": "succeeded",
                    "reference": delivered["message_id"],
                    "evidence": "found in the mail sink's mailbox",
                    "reviewer": "ana",
                }
            },
        )
        assert result.status is RunStatus.DONE
        show_operations(result.operations)
        assert len(services.mails()) == 1
        """
    ),
    md(
        """
        ## 3. An unsafe tool → parked → human verdict

        `run_shell` is **unsafe**: it has no idempotency key and nothing can be asked
        afterwards, so any unknown outcome goes to a human. This command appends a line to a
        log and then hangs; the tool kills it after its two-second timeout.
        """
    ),
    code(
        """
        from effectgate import ScriptedChatModel

        DEPLOY = {
            "name": "deploy",
            "turns": [
                {
                    "say": "Recording the deployment.",
                    "tool_calls": [
                        {
                            "name": "run_shell",
                            "args": {
                                "command": "echo 'orders v2 deployed' >> deploy.log; sleep 10"
                            },
                        }
                    ],
                },
                {"say": "Deployment recorded."},
            ],
        }
        shell_agent = stack.enter_context(
            open_agent(state, tools=tools, model=ScriptedChatModel.from_script(DEPLOY))
        )
        result = shell_agent.start("Record the orders v2 deployment.", thread_id="deploy-1")
        print(result.interrupts[0].value["action_requests"][0]["preview"])
        result = shell_agent.resume("deploy-1", decisions=approve_all(result))
        assert result.status is RunStatus.WAITING_RECONCILIATION
        evidence = result.interrupts[0].value["evidence"]
        print("why:       ", evidence["why"])
        print("last error:", evidence["last_error"])
        """
    ),
    md(
        """
        Re-running the command would append a second line. The human checks the log instead:
        the line is there, so the command did take effect.
        """
    ),
    code(
        """
        log = (state.workspace / "deploy.log").read_text()
        print(repr(log))
        assert log == "orders v2 deployed\\n"
        shell_id = result.interrupts[0].value["operation_id"]
        result = shell_agent.resume(
            "deploy-1",
            verdicts={
                shell_id: {
                    "verdict": "succeeded",
                    "reference": "deploy.log line 1",
                    "evidence": "the line is in the log, once",
                    "reviewer": "ana",
                }
            },
        )
        assert result.status is RunStatus.DONE
        show_operations(result.operations)
        """
    ),
    md(
        """
        ## Ledger metrics

        Computed from the ledger alone: operations by state, how often the first attempt
        succeeded, how many stored receipts were handed back instead of calling a tool, and
        how many unknowns are still open.
        """
    ),
    code(
        """
        metrics = agent.ledger.metrics()
        print("operations by state:", {k: v for k, v in metrics.by_state.items() if v})
        print("first-attempt success rate:", metrics.first_attempt_success_rate)
        print("mean attempts:", metrics.mean_attempts)
        print("receipts reused:", metrics.results_reused)
        print("open unknowns:", metrics.open_unknowns)
        assert metrics.open_unknowns == 0
        sources = sorted(op.receipt.source for op in agent.ledger.list())
        print("receipt sources:", sources)
        """
    ),
    md(
        """
        ## A timeline of every operation

        Each row is one operation; each bar is the time it spent in a state, from the ledger's
        event log (`ledger.events()`). The ticket went `IN_FLIGHT → UNKNOWN → SUCCEEDED` in a
        second; the mail and the shell command sat in `NEEDS_RECONCILIATION` until the human
        verdicts. Rendered with matplotlib's Agg backend.
        """
    ),
    code(
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from IPython.display import Image, display

        COLORS = {
            "PROPOSED": "#bbbbbb",
            "APPROVED": "#8fb3d9",
            "IN_FLIGHT": "#3b75af",
            "UNKNOWN": "#ef8636",
            "NEEDS_RECONCILIATION": "#c53a32",
            "RETRY_WAIT": "#f2cf5b",
            "SUCCEEDED": "#519e3e",
            "FAILED": "#222222",
            "REJECTED": "#8d6ab8",
        }
        events = [e for e in agent.ledger.events() if e.dst is not None]
        t0 = events[0].at
        end = (events[-1].at - t0).total_seconds() + 0.3
        ops = agent.ledger.list()
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(ops) + 1.2))
        seen = set()
        for row, op in enumerate(ops):
            mine = [e for e in events if e.operation_id == op.operation_id]
            for e, nxt in zip(mine, [*mine[1:], None], strict=True):
                x0 = (e.at - t0).total_seconds()
                x1 = (nxt.at - t0).total_seconds() if nxt else end
                label = e.dst.value if e.dst.value not in seen else None
                seen.add(e.dst.value)
                ax.broken_barh(
                    [(x0, max(x1 - x0, 0.01))],
                    (row - 0.35, 0.7),
                    color=COLORS[e.dst.value],
                    label=label,
                )
        ax.set_yticks(range(len(ops)), [f"{op.tool} ({op.thread_id})" for op in ops])
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the first ledger event")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize="small")
        ax.set_title("operation states over time")
        fig.tight_layout()
        fig.savefig(workdir / "timeline.png", dpi=80)
        plt.close(fig)
        display(Image(filename=workdir / "timeline.png"))
        """
    ),
    code(
        """
        stack.close()
        services.stop()
        """
    ),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_approve_edit_reject.ipynb": DECISIONS,
    "03_kill_and_resume.ipynb": KILL,
    "04_time_travel.ipynb": TIME_TRAVEL,
    "05_unknown_outcomes.ipynb": UNKNOWN,
}


def build(name: str) -> Any:
    """Return the notebook ``name`` as an ``nbformat`` node: no outputs, stable cell ids."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    stem = name.split("_", maxsplit=1)[0]
    for i, (kind, text) in enumerate(NOTEBOOKS[name]):
        cell = (
            nbformat.v4.new_markdown_cell(text)
            if kind == "markdown"
            else nbformat.v4.new_code_cell(text)
        )
        cell.id = f"nb{stem}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """Return the notebook ``name`` as the exact text written to disk."""
    return nbformat.writes(build(name)) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write every notebook, or with ``--check`` report those that differ from this source."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        text = render(name)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("out of date (run notebooks/_make.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
