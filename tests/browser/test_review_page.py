"""The project's review page (web/review) in headless Chromium against ``langgraph dev``.

The page reads the pending review through ``@langchain/langgraph-sdk``'s React
``useStream`` and shows only the standard HITL request (tool name, each
argument as an editable field, the description, the allowed decisions), as
LangChain's web clients do. Each scenario runs its own thread of the demo
incident on one server and one world per module; effects are counted in the
ticket service's and the mail sink's own SQLite files. A warm-up thread (through
the SDK) opens the ticket and sends the first mail, so every later thread's
mail is a possible duplicate and the page must show that warning.

Screenshots of each review and end state go to the test's ``tmp_path`` (the
path is printed; ``make browser`` keeps them under ``.browser-shots``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from effectgate import StateDir
from effectgate.demo import DemoServices
from effectgate.ledger import SqliteLedger
from effectgate.testing.langgraph_dev import LangGraphDev
from tests.browser.conftest import CHROMIUM, need_browser

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASK = "Check the orders error rate and open a ticket if needed"
WAIT_MS = 60_000
"""Bound on each wait for the page (a run of the scripted model, a server restart)."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One state directory, demo services and ``langgraph dev`` for the module."""
    need_browser()
    root = tmp_path_factory.mktemp("browser")
    state = StateDir.open(root / "state")
    with DemoServices(state.services) as services:
        services.set_error_rate("orders", 0.12)
        server = LangGraphDev(
            root / "server", state.root, services.endpoints, dependencies=[str(ROOT)]
        )
        server.start()
        try:
            client = get_sync_client(url=server.url)
            thread = _start(client)
            for _ in range(2):  # the ticket, then the mail and the file: approved as a raw client
                [item] = client.threads.get_state(thread)["interrupts"]
                n = len(item["value"]["action_requests"])
                answer = {"decisions": [{"type": "approve"}] * n}
                client.runs.wait(thread, "effectgate", command={"resume": {item["id"]: answer}})
            assert (len(services.tickets()), len(services.mails())) == (1, 1)
            yield {"state": state, "services": services, "server": server, "root": root}
        finally:
            server.stop()
            shutil.rmtree(root / "server" / ".langgraph_api", ignore_errors=True)


@pytest.fixture(scope="module")
def browser(world: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        yield page
    finally:
        context.close()


def _start(client: Any) -> str:
    thread = str(client.threads.create()["thread_id"])
    client.runs.wait(thread, "effectgate", input={"messages": [{"role": "user", "content": TASK}]})
    return thread


def _counts(world: dict[str, Any]) -> tuple[int, int]:
    services: DemoServices = world["services"]
    return len(services.tickets()), len(services.mails())


def _open(page: Any, page_url: str, world: dict[str, Any], thread: str) -> str:
    """Open the page on ``thread``; wait for its review; return the interrupt id shown."""
    page.goto(f"{page_url}?api={world['server'].url}&thread={thread}")
    review = page.get_by_test_id("review")
    review.wait_for()
    return str(review.get_attribute("data-interrupt-id"))


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    out = Path(os.environ.get("EFFECTGATE_BROWSER_SHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}", file=sys.stderr)
    return path


def _mail_review(page: Any) -> tuple[Any, Any]:
    """The mail's and the file's action sections, with the mail's duplicate warning shown."""
    mail, file = page.get_by_test_id("action-0"), page.get_by_test_id("action-1")
    assert mail.get_by_test_id("tool-name").inner_text() == "send_email"
    assert file.get_by_test_id("tool-name").inner_text() == "write_file"
    mail.get_by_test_id("description").wait_for()
    warning = mail.get_by_test_id("warning")
    assert warning.count() == 1, "no warning on the page: " + mail.inner_text()
    assert "possible duplicate of" in warning.inner_text()
    assert warning.is_visible()
    description = mail.get_by_test_id("description").inner_text()
    assert description.startswith("WARNING: this call is a possible duplicate of")
    assert "Operation: " in description and "effect kind: reconcilable" in description
    assert mail.get_by_test_id("arg-subject").input_value()  # each argument is a field
    return mail, file


def _done(page: Any) -> str:
    final = page.get_by_test_id("final-message")
    final.wait_for()
    return str(final.inner_text())


def _mail_ops(world: dict[str, Any], thread: str) -> list[Any]:
    with SqliteLedger(world["state"].ledger) as ledger:
        return [op for op in ledger.list() if op.tool == "send_email" and op.thread_id == thread]


def test_approve_sends_one_mail(page: Any, page_url: str, world: dict, tmp_path: Path) -> None:
    thread = _start(get_sync_client(url=world["server"].url))
    _open(page, page_url, world, thread)
    mail, file = _mail_review(page)
    _shot(page, tmp_path, "approve-review")
    before = _counts(world)
    mail.get_by_test_id("approve").click()
    file.get_by_test_id("approve").click()
    assert "TICKET-1" in _done(page)
    _shot(page, tmp_path, "approve-done")
    assert _counts(world) == (before[0], before[1] + 1)


def test_edit_sends_the_edited_mail(page: Any, page_url: str, world: dict, tmp_path: Path) -> None:
    thread = _start(get_sync_client(url=world["server"].url))
    _open(page, page_url, world, thread)
    mail, file = _mail_review(page)
    before = _counts(world)
    mail.get_by_test_id("arg-subject").fill("orders: edited in the browser")
    mail.get_by_test_id("edit").click()
    file.get_by_test_id("approve").click()
    _done(page)
    _shot(page, tmp_path, "edit-done")
    assert _counts(world) == (before[0], before[1] + 1)
    subjects = [m.get("subject") for m in world["services"].mails()]
    assert subjects.count("orders: edited in the browser") == 1


def test_reject_with_a_reason_sends_nothing(
    page: Any, page_url: str, world: dict, tmp_path: Path
) -> None:
    thread = _start(get_sync_client(url=world["server"].url))
    _open(page, page_url, world, thread)
    mail, file = _mail_review(page)
    before = _counts(world)
    for section in (mail, file):
        section.get_by_test_id("reason").fill("a duplicate of the mail already sent")
        section.get_by_test_id("reject").click()
    _done(page)
    _shot(page, tmp_path, "reject-done")
    assert _counts(world) == before
    [op] = _mail_ops(world, thread)
    assert op.state.value == "REJECTED"
    state = get_sync_client(url=world["server"].url).threads.get_state(thread)
    tool_answers = [m["content"] for m in state["values"]["messages"] if m["type"] == "tool"]
    assert any("a duplicate of the mail already sent" in str(c) for c in tool_answers)


def test_a_double_click_sends_one_answer_and_one_mail(
    page: Any, page_url: str, world: dict, tmp_path: Path
) -> None:
    thread = _start(get_sync_client(url=world["server"].url))
    _open(page, page_url, world, thread)
    mail, file = _mail_review(page)
    before = _counts(world)
    mail.get_by_test_id("approve").click()
    file.get_by_test_id("approve").dblclick()
    _done(page)
    _shot(page, tmp_path, "double-click-done")
    assert _counts(world) == (before[0], before[1] + 1)
    [op] = _mail_ops(world, thread)
    assert (op.state.value, op.attempt) == ("SUCCEEDED", 1)


def test_a_reload_while_a_review_waits_shows_the_same_review(
    page: Any, page_url: str, world: dict, tmp_path: Path
) -> None:
    thread = _start(get_sync_client(url=world["server"].url))
    shown = _open(page, page_url, world, thread)
    page.reload()
    page.get_by_test_id("review").wait_for()
    assert page.get_by_test_id("review").get_attribute("data-interrupt-id") == shown
    mail, file = _mail_review(page)
    before = _counts(world)
    mail.get_by_test_id("approve").click()
    file.get_by_test_id("approve").click()
    _done(page)
    _shot(page, tmp_path, "reload-done")
    assert _counts(world) == (before[0], before[1] + 1)


def test_a_server_killed_and_restarted_while_a_review_waits(
    page: Any, page_url: str, world: dict, tmp_path: Path
) -> None:
    """SIGKILL of ``langgraph dev`` while the page shows a review, then a restart: one mail.

    The development server's in-memory runtime writes its threads to disk
    every 10 s and its checkpoints only at a clean exit, so a killed one comes
    back without the thread or without its review; the reviewer then sends
    the task again on the same thread id (as a user would), the ledger
    settles the ticket already opened, and the mail is asked about again.
    Either way one mail goes out.
    """
    server: LangGraphDev = world["server"]
    thread = _start(get_sync_client(url=server.url))
    _open(page, page_url, world, thread)
    _shot(page, tmp_path, "kill-review")
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGKILL)  # the whole server, no clean shutdown
    server.wait_dead()
    server.start()
    client = get_sync_client(url=server.url)
    client.threads.create(thread_id=thread, if_exists="do_nothing")  # lost with the kill?
    if not client.threads.get_state(thread).get("interrupts"):
        client.runs.wait(
            thread, "effectgate", input={"messages": [{"role": "user", "content": TASK}]}
        )
    page.reload()
    page.get_by_test_id("review").wait_for()
    mail, file = _mail_review(page)
    before = _counts(world)
    mail.get_by_test_id("approve").click()
    file.get_by_test_id("approve").click()
    _done(page)
    _shot(page, tmp_path, "kill-done")
    assert _counts(world) == (before[0], before[1] + 1)
    [op] = _mail_ops(world, thread)
    assert (op.state.value, op.attempt) == ("SUCCEEDED", 1)
