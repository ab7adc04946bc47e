"""Cancellation both ways, and asks from threads without a loop."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import weakref
from typing import Any, cast

import pytest

import askpool
from askpool import Context, Node


async def _hosted_waiter(node: Node, name: str, seen: list[bool], started: asyncio.Event) -> None:
    pool = node.pool(name)

    @pool.handler
    async def handle(msg: Any, ctx: Context) -> Any:
        started.set()
        await ctx.wait_cancelled()
        seen.append(ctx.cancelled)
        return None


async def _turn_pool(node: Node, seen: list[bool]) -> None:
    """Pool "turn": its handler yields once (its next step goes to the
    slot's idle task), then, but for "warm", waits for its request's cancel
    and records what `ctx.cancelled` says then. Warmed: its slot's task made
    and idle (a handler's first step is handed to it only once it exists)."""

    @node.pool("turn").handler
    async def handle(msg: Any, ctx: Context) -> Any:
        await asyncio.sleep(0)
        if msg == "warm":
            return msg
        await asyncio.wait_for(ctx.wait_cancelled(), 5)
        seen.append(ctx.cancelled)
        return None

    assert await node.ask("turn", "warm") == "warm"


async def test_cancelling_the_awaiting_task_cancels_the_handler() -> None:
    seen: list[bool] = []
    started = asyncio.Event()
    async with Node() as node:
        await _hosted_waiter(node, "wait", seen, started)
        task = asyncio.ensure_future(node.ask("wait", 1, timeout=10))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [True]
        stats = node.stats()
        assert stats["pending"] == 0
        assert stats["pools"]["wait"]["cancels"] == 1


async def test_a_caller_cancelled_in_the_turn_its_handler_goes_on_in_cancels_the_ask() -> None:
    # A handler that yields once (`sleep(0)`) goes on at the next loop turn,
    # and its caller's `await` waits that turn first (`AskHandle.__await__`)
    # instead of waiting on the handle: a cancel of the caller's task in
    # that turn must still cancel the ask, as it does for a task waiting on
    # the handle. The handle is kept alive, so that only the cancel can
    # reach the handler (a dropped handle cancels its ask too).
    seen: list[bool] = []
    handles: list[askpool.AskHandle] = []
    async with Node() as node:
        await _turn_pool(node, seen)

        async def caller() -> Any:
            ask = node.ask("turn", 1, timeout=10)
            handles.append(ask)
            return await ask

        task = asyncio.create_task(caller())
        # The caller's first step (the ask, then its `await`) runs in this
        # turn; the cancel reaches it while it waits for the next one.
        await asyncio.sleep(0)
        assert len(handles) == 1 and not handles[0].done()
        # (The path under test: the await waits the turn, not the handle.)
        assert handles[0]._turn_first
        task.cancel("the caller gave up")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert handles[0].cancelled()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [True]
        assert node.stats()["pending"] == 0


async def test_a_caller_cancelled_in_the_turn_its_handler_answers_in_cancels_the_ask_first() -> None:
    # The handler would answer in the very turn its caller waits for (it
    # yields once, then returns): the caller's cancel, before that turn,
    # must cancel the ask at once, as it does for a task waiting on the
    # handle, so that the handler's answer is not taken for a success.
    answered: list[Any] = []
    async with Node() as node:

        @node.pool("turn").handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            answered.append((msg, ctx.cancelled))
            if msg == "fail":
                raise ValueError("after the caller gave up")
            return msg

        assert await node.ask("turn", "warm") == "warm"
        answered.clear()
        unretrieved: list[Any] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, c: unretrieved.append(c))
        for msg in ("charge", "fail"):
            handles: list[askpool.AskHandle] = []

            async def caller(m: str) -> Any:
                ask = node.ask("turn", m, timeout=10)
                handles.append(ask)
                return await ask

            task = asyncio.create_task(caller(msg))
            await asyncio.sleep(0)
            assert handles[0]._turn_first
            task.cancel("the caller gave up")
            # At once, as for a task waiting on the handle.
            assert handles[0].cancelled()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            assert handles[0].cancelled()
        # Each handler saw its request cancelled when it went on.
        assert answered == [("charge", True), ("fail", True)]
        assert node.stats()["pools"]["turn"]["cancels"] == 2
        gc.collect()
        await asyncio.sleep(0)
        # The handler's error had nobody to reach: nothing left unretrieved.
        assert unretrieved == []


async def test_done_callbacks_added_before_an_await_run_before_the_awaiter() -> None:
    # As for any future: the awaiting task's wake-up is a callback added
    # after the others, so they have run when it resumes.
    async with Node() as node:

        @node.pool("turn").handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            return msg

        assert await node.ask("turn", "warm") == "warm"
        order: list[str] = []
        ask = node.ask("turn", 1, timeout=5)
        ask.add_done_callback(lambda _: order.append("done callback"))
        assert await ask == 1
        order.append("awaiter resumed")
        assert order == ["done callback", "awaiter resumed"]


async def test_a_cancelled_caller_task_does_not_keep_its_ask_alive() -> None:
    # The task keeps its CancelledError, and with it the traceback of the
    # awaits it went through: not the handle (and so the ask's payload).
    class Payload:
        pass

    refs: dict[str, "weakref.ref[Any]"] = {}
    async with Node() as node:
        await _turn_pool(node, [])

        async def caller() -> Any:
            # Nothing of the ask in this frame's own variables (which the
            # traceback keeps too, as for any coroutine).
            payload = Payload()
            ask = node.ask("turn", payload, timeout=10)
            refs["handle"] = weakref.ref(ask)
            refs["payload"] = weakref.ref(payload)
            del payload, ask
            return await cast(askpool.AskHandle, refs["handle"]())

        task = asyncio.create_task(caller())
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the caller was not cancelled")
        # Until the handler saw the cancel and ended.
        for _ in range(100):
            gc.collect()
            if refs["payload"]() is None:
                break
            await asyncio.sleep(0.01)
        assert task.done()
        assert refs["handle"]() is None, "the cancelled task keeps its AskHandle"
        assert refs["payload"]() is None


async def test_cancelling_the_handle_cancels_the_handler() -> None:
    seen: list[bool] = []
    started = asyncio.Event()
    async with Node() as node:
        await _hosted_waiter(node, "wait", seen, started)
        handle = node.ask("wait", 1, timeout=10)
        await started.wait()
        assert handle.cancel()
        assert handle.cancelled()
        assert not handle.cancel()
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [True]


async def test_the_callers_deadline_is_visible_to_the_handler() -> None:
    seen: list[bool] = []
    started = asyncio.Event()
    async with Node() as node:
        await _hosted_waiter(node, "wait", seen, started)
        with pytest.raises(askpool.AskTimeoutError):
            await node.ask("wait", 1, timeout=0.05)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [True]


async def test_a_cancel_does_not_interrupt_a_handler_that_polls() -> None:
    flags: list[bool] = []
    async with Node() as node:
        pool = node.pool("poll")

        running = asyncio.Event()

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            flags.append(ctx.cancelled)
            running.set()
            while not ctx.cancelled:
                await asyncio.sleep(0.005)
            flags.append(ctx.cancelled)

        handle_ = node.ask("poll", 1, timeout=10)
        # Cancel once the handler runs (a fixed sleep could cancel before
        # it started on a loaded machine).
        await asyncio.wait_for(running.wait(), 5)
        handle_.cancel()
        for _ in range(200):
            if len(flags) == 2:
                break
            await asyncio.sleep(0.01)
        assert flags == [False, True]


async def test_ask_sync_from_a_thread_without_a_loop() -> None:
    async with Node() as node:
        pool = node.pool("threads", concurrency=2)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            return (msg, threading.current_thread().name)

        payload = object()
        loop_thread = threading.current_thread().name
        got = await asyncio.get_running_loop().run_in_executor(
            None, lambda: node.ask_sync("threads", payload, timeout=5)
        )
        assert got[0] is payload
        # The handler ran on the loop's thread, not the asking one.
        assert got[1] == loop_thread

        def ask_missing() -> Any:
            return node.ask_sync("missing", 1, timeout=1)

        with pytest.raises(askpool.NoRouteError):
            await asyncio.get_running_loop().run_in_executor(None, ask_missing)


def test_ask_sync_is_interrupted_by_a_signal_and_cancels_the_ask() -> None:
    node = Node()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="pool loop")
    thread.start()
    started = threading.Event()
    cancelled = threading.Event()

    async def host() -> None:
        pool = node.pool("slow")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            started.set()
            await ctx.wait_cancelled()
            cancelled.set()

    asyncio.run_coroutine_threadsafe(host(), loop).result(5)

    def interrupt(signum: int, frame: Any) -> None:
        # Interrupt the wait only once the handler runs: on a loaded
        # machine the loop thread may not have started it 0.3 s in.
        if not started.is_set():
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            # Without the signal this would wait out its 30 s timeout.
            node.ask_sync("slow", 1, timeout=30)
        assert started.is_set()
        # Dropping the interrupted ask sent the protocol cancel.
        assert cancelled.wait(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        node.close()


async def test_ask_sync_on_the_loop_thread_is_refused() -> None:
    async with Node() as node:
        with pytest.raises(askpool.FailedPreconditionError):
            node.ask_sync("p", 1)


async def test_a_caller_on_another_loop_and_thread() -> None:
    async with Node() as node:
        pool = node.pool("shared")

        @pool.handler
        async def handle(msg: int, ctx: Context) -> int:
            await asyncio.sleep(0)
            return msg + 1

        def other_loop() -> list[int]:
            async def main() -> list[int]:
                return list(await asyncio.gather(*(node.ask("shared", i, timeout=5) for i in range(50))))

            return asyncio.run(main())

        got = await asyncio.get_running_loop().run_in_executor(None, other_loop)
        assert got == [i + 1 for i in range(50)]


async def test_a_handler_running_when_its_pool_closes_is_told_and_still_answers() -> None:
    async with Node() as node:
        pool = node.pool("closing")
        started = asyncio.Event()

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            started.set()
            await ctx.wait_cancelled()
            return "told of the close" if ctx.cancelled else "not told"

        ask = asyncio.ensure_future(node.ask("closing", 1, timeout=30))
        await asyncio.wait_for(started.wait(), 5)
        pool.close()
        assert await asyncio.wait_for(ask, 5) == "told of the close"


async def test_cancelling_a_tell_before_its_pool_accepted_it_cancels_it() -> None:
    runs: list[str] = []
    gate = asyncio.Event()
    async with Node() as node:
        pool = node.pool("full", concurrency=1, max_in_flight=1)

        @pool.handler
        async def handle(msg: str, ctx: Context) -> None:
            runs.append(msg)
            if msg == "block":
                await gate.wait()

        await node.tell("full", "block")
        # The pool is full: the tell is re-sent until it is accepted, unless
        # its caller gives up first.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(node.tell("full", "unwanted", timeout=5), 0.2)
        gate.set()
        await node.tell("full", "wanted", timeout=5)
        # Longer than the tell's re-sends: a tell still going on would land.
        await asyncio.sleep(1.5)
        assert runs == ["block", "wanted"]
        assert node.stats()["pending"] == 0


async def test_wait_cancelled_awaited_on_another_loop_wakes_there() -> None:
    # A handler hands its context to a coroutine on another loop (another
    # thread). Its wait must be completed on that loop, the one it awaits
    # on: completed on the pool's loop it was never woken.
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, name="other loop")
    thread.start()
    saw: list[str] = []

    async def watch(ctx: Context) -> None:
        await ctx.wait_cancelled()
        saw.append(threading.current_thread().name)

    try:
        async with Node() as node:
            pool = node.pool("p")
            watching = asyncio.Event()

            @pool.handler
            async def handle(msg: Any, ctx: Context) -> Any:
                watcher = asyncio.run_coroutine_threadsafe(watch(ctx), other)
                watching.set()
                await asyncio.wait_for(asyncio.wrap_future(watcher), 10)
                return "watched"

            ask = node.ask("p", 1)
            await watching.wait()
            while pool.stats()["in_flight"] == 0:
                await asyncio.sleep(0.01)
            ask.cancel()
            for _ in range(500):
                if saw:
                    break
                await asyncio.sleep(0.01)
            assert saw == ["other loop"], "the wait on the other loop never woke"
            # The handle is an asyncio future: cancelled, it raises so.
            with pytest.raises(asyncio.CancelledError):
                await ask
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()


async def test_handles_are_futures_for_wait_gather_and_task_groups() -> None:
    # The handles are asyncio futures, not coroutines: asyncio.wait (which
    # refuses coroutines since 3.11) and gather take them; a TaskGroup
    # takes a coroutine that awaits one. A version that made them pass for
    # coroutines (for create_task) broke asyncio.wait.
    async with Node() as node:
        pool = node.pool("echo", concurrency=4)

        @pool.handler
        async def echo(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            return msg

        asks = [node.ask("echo", i, timeout=5) for i in range(3)]
        told = node.tell("echo", "t")
        assert not any(asyncio.iscoroutine(a) for a in [*asks, told])
        done, pending = await asyncio.wait([*asks, told], timeout=5)
        assert not pending and len(done) == 4
        assert [a.result() for a in asks] == [0, 1, 2]
        assert await asyncio.gather(*(node.ask("echo", i, timeout=5) for i in range(3))) == [0, 1, 2]

        async def ask(i: int) -> Any:
            return await node.ask("echo", i, timeout=5)

        task_group = getattr(asyncio, "TaskGroup", None)
        if task_group is not None:  # 3.11+
            async with task_group() as group:
                tasks = [group.create_task(ask(i)) for i in range(3)]
            assert [t.result() for t in tasks] == [0, 1, 2]
