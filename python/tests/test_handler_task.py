"""A handler runs as a task of its own, in a context of its own: never as its
caller's task or in its caller's context, however its request reached it (in
the caller's own `node.ask()`, or from the loop when it was queued)."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from typing import Any, Optional

import pytest

import askpool
from askpool import Context, Node

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")

#: How a request reaches its handler: in the caller's `node.ask()` (the pool
#: idle), or from the loop (queued behind a request that holds the only slot).
PATHS = ["inline", "queued"]


async def _ask(node: Node, pool: str, msg: Any, path: str, gate: asyncio.Event) -> Any:
    """Asks `msg`; on the queued path behind a request that waits for
    `gate`, which is set once this ask is queued."""
    if path == "inline":
        return await node.ask(pool, msg, timeout=10)
    blocker = asyncio.ensure_future(node.ask(pool, "block", timeout=10))
    await asyncio.sleep(0)
    asked = asyncio.ensure_future(node.ask(pool, msg, timeout=10))
    await asyncio.sleep(0)
    gate.set()
    await blocker
    return await asked


def _gated(gate: asyncio.Event, body: Any) -> Any:
    """A handler that holds its slot until `gate` for the message "block"
    (what `_ask` queues behind), and runs `body` for the others."""

    async def handle(msg: Any, ctx: Context) -> Any:
        if msg == "block":
            await gate.wait()
            return None
        return await body(msg, ctx)

    return handle


@pytest.mark.parametrize("path", PATHS)
async def test_a_handler_is_its_own_task_in_its_own_context(path: str, send_path: str) -> None:
    gate = asyncio.Event()
    _var.set("registered")
    seen: list[tuple[str, Optional[asyncio.Task[Any]], str]] = []
    async with Node() as node:
        pool = node.pool("own", concurrency=1)

        async def look(msg: Any, ctx: Context) -> Any:
            before = _var.get()
            _var.set("handler")
            task = asyncio.current_task()
            await asyncio.sleep(0)
            # The same task and context after awaiting.
            assert asyncio.current_task() is task
            seen.append((before, task, _var.get()))
            return "ok"

        pool.handler(_gated(gate, look))

        _var.set("caller")
        me = asyncio.current_task()
        assert await _ask(node, "own", "look", path, gate) == "ok"
        # Nothing the handler set reached the caller.
        assert _var.get() == "caller"
        [(before, task, after)] = seen
        # The context the handler was registered in, not the caller's.
        assert before == "registered"
        assert after == "handler"
        assert isinstance(task, asyncio.Task) and task is not me


async def test_each_request_starts_from_the_registration_context() -> None:
    async with Node() as node:
        pool = node.pool("fresh", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            before = _var.get()
            _var.set(f"request {msg}")
            if msg % 2:
                await asyncio.sleep(0)
            return before

        # Same slot every time: what one request set is not the next one's.
        for i in range(6):
            assert await node.ask("fresh", i, timeout=10) == "unset"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
@pytest.mark.parametrize("path", PATHS)
async def test_asyncio_timeout_in_a_handler_times_out_the_handler_not_its_caller(
    path: str, send_path: str
) -> None:
    gate = asyncio.Event()
    async with Node() as node:
        pool = node.pool("timeouts", concurrency=1)

        async def nap(msg: Any, ctx: Context) -> Any:
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.sleep(5)
            except TimeoutError:
                return "handler timed out"
            return "slept"

        pool.handler(_gated(gate, nap))

        async def caller() -> Any:
            return await _ask(node, "timeouts", "go", path, gate)

        # Its own task: a cancel meant for the handler would end it.
        assert await asyncio.create_task(caller()) == "handler timed out"
        # And the slot goes on serving.
        gate.set()
        assert await node.ask("timeouts", "block", timeout=10) is None


@pytest.mark.skipif(sys.version_info < (3, 11), reason="TaskGroup is 3.11+")
async def test_a_task_group_in_a_handler_cancels_within_the_handler() -> None:
    async with Node() as node:
        pool = node.pool("groups")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            async def fail() -> None:
                raise ValueError("child failed")

            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(asyncio.sleep(5))
                    group.create_task(fail())
            except Exception as e:  # an ExceptionGroup (3.11+ names)
                return [type(x).__name__ for x in e.exceptions]  # type: ignore[attr-defined]
            return "no error"

        assert await asyncio.ensure_future(node.ask("groups", 1, timeout=10)) == ["ValueError"]


async def test_a_handler_cancelling_its_own_task_is_answered_cancelled_and_the_slot_goes_on() -> None:
    async with Node() as node:
        pool = node.pool("selfcancel", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg == "first step":
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                await asyncio.sleep(5)
            elif msg == "swallowed":
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                try:
                    await asyncio.sleep(5)
                except asyncio.CancelledError:
                    return "kept going"
            else:
                await asyncio.sleep(0)
            return msg

        # The cancel reaches the handler where it awaits. (The slot's first
        # request: run in this ask before the slot's task ever had a turn.)
        with pytest.raises(askpool.AskCancelledError):
            await node.ask("selfcancel", "first step", timeout=10)
        assert await node.ask("selfcancel", "after", timeout=10) == "after"
        # Swallowed: answered as the handler says; the slot still serves.
        assert await node.ask("selfcancel", "swallowed", timeout=10) == "kept going"
        assert await node.ask("selfcancel", "again", timeout=10) == "again"
        stats = pool.stats()
        assert stats["in_flight"] == 0, stats


def test_a_handler_of_a_pool_on_another_loop_is_a_task_there() -> None:
    # Asked from a plain thread: the request reaches the handler from its
    # loop (no caller task anywhere), and it still is a task of its own.
    node = Node()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:

        async def host() -> None:
            @node.pool("remote").handler
            async def handle(msg: Any, ctx: Context) -> Any:
                task = asyncio.current_task()
                await asyncio.sleep(0)
                return task is not None and asyncio.current_task() is task

        asyncio.run_coroutine_threadsafe(host(), loop).result(5)
        assert node.ask_sync("remote", 1, timeout=10) is True
    finally:
        node.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
