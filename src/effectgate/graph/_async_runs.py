"""The async twins of ``Agent``'s runs: a blocking run driven from an event loop.

``Agent.astart``, ``aresume``, ``asend``, ``areplay`` and ``astream`` call
the sync method itself (the one home of each rule) in a worker thread
(``asyncio.to_thread``), so the event loop is never blocked by the model
call, SQLite or a tool. ``in_thread`` makes cancellation safe: the run is
asked to stop at its next superstep boundary and awaited, so no step is left
half-recorded. ``stream_updates`` turns a run's graph updates into an async
iterator.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from effectgate.graph._drive import Runs
from effectgate.graph._results import EventHook, RunResult

__all__ = ["in_thread", "stream_updates"]


async def in_thread(
    fn: Callable[..., RunResult],
    *args: Any,
    listener: EventHook | None,
    runs: Runs,
    **kw: Any,
) -> RunResult:
    """Await ``fn(*args, **kw)`` run in a worker thread; cancelling it stops that run only.

    Args:
        fn: the blocking run (``Agent.start``, ``resume``, ...).
        args: its positional arguments.
        listener: where the run's graph updates go, or ``None``.
        runs: the agent's runs under way: the listener is registered there for
            the worker thread, and a cancelled run is asked to drain through
            the control its thread registered.
        kw: its keyword arguments.

    Returns:
        What ``fn`` returned.

    Raises:
        asyncio.CancelledError: the awaiting task was cancelled; the run was
            asked to stop at its next step boundary and has ended.
        Exception: whatever ``fn`` raised.
    """
    started: list[int] = []
    cancelled = threading.Event()

    def call() -> RunResult:
        if cancelled.is_set():
            raise asyncio.CancelledError
        ident = threading.get_ident()
        started.append(ident)
        if listener is None:
            return fn(*args, **kw)
        runs.listeners[ident] = listener
        try:
            return fn(*args, **kw)
        finally:
            runs.listeners.pop(ident, None)

    work = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        # Stop this run only (other threads of this agent go on), at its
        # next step boundary, and wait: nothing is left half-recorded.
        cancelled.set()
        control = runs.controls.get(started[0]) if started else None
        if control is not None:
            control.request_drain("cancelled by the caller")
        await asyncio.wait([work])
        raise


async def stream_updates(
    run: Callable[[EventHook], Awaitable[RunResult]],
) -> AsyncGenerator[tuple[str, Any], None]:
    """Yield ``("updates", chunk)`` for each graph update of ``run``, then ``("result", result)``.

    Args:
        run: starts the run given the listener its updates go to (an
            ``in_thread`` call) and returns its awaitable result.

    Yields:
        ``("updates", {node: update})`` as the run streams them, then one
        ``("result", RunResult)``. Closing the iterator early (``break``,
        cancellation) cancels the run (``in_thread``: it stops at its next
        step boundary) and waits for it.

    Raises:
        Exception: whatever the run raised, from the iteration.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def listen(chunk: Mapping[str, Any]) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("updates", chunk))

    work = asyncio.ensure_future(run(listen))
    work.add_done_callback(lambda _: queue.put_nowait(("done", None)))
    try:
        while True:
            kind, item = await queue.get()
            if kind == "done":
                break
            yield kind, item
        yield "result", await work
    finally:
        if not work.done():
            work.cancel()
            await asyncio.wait([work])
