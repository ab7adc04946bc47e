"""A handler runs as a task of its own, in a context of its own: never as its
caller's task or in its caller's context, however its request reached it (in
the caller's own `node.ask()`, or from the loop when it was queued)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import sys
import threading
import weakref
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


def _cancel_me(msg: Optional[str] = None) -> None:
    """Cancels the running task: the handler's own."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel(msg)


def _warmed(body: Any) -> Any:
    """A handler that answers "warm" after one await (which leaves its
    slot's task made and idle), and runs `body` for the other messages."""

    async def handle(msg: Any, ctx: Context) -> Any:
        if msg == "warm":
            await asyncio.sleep(0)
            return "warm"
        return await body(msg, ctx)

    return handle


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
                _cancel_me()
                await asyncio.sleep(5)
            elif msg == "swallowed":
                _cancel_me()
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


async def test_a_cancel_of_a_fresh_slot_reaches_the_handler_where_it_awaits() -> None:
    # Each request on a new pool: its slot's task is made for it and has
    # not had a turn when the handler's first step cancels it.
    async with Node() as node:
        for i in range(3):
            pool = node.pool(f"fresh-{i}")

            @pool.handler
            async def handle(msg: Any, ctx: Context) -> Any:
                _cancel_me()
                try:
                    await asyncio.sleep(5)
                except asyncio.CancelledError:
                    return "kept going"
                return "slept"

            assert await node.ask(f"fresh-{i}", i, timeout=10) == "kept going"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
async def test_a_timeout_already_due_cancels_what_the_handler_awaits() -> None:
    state: dict[str, str] = {}

    async def work(name: str) -> None:
        try:
            await asyncio.sleep(0.2)
            state[name] = "finished"
        except asyncio.CancelledError:
            state[name] = "cancelled"
            raise

    async with Node() as node:
        pool = node.pool("due")

        async def handle(msg: Any, ctx: Context) -> Any:
            try:
                async with asyncio.timeout(0):
                    await asyncio.gather(work("a"), work("b"))
            except TimeoutError:
                return "timed out"
            return "done"

        pool.handler(_warmed(handle))

        # The slot's task made and idle: the cancel lands as the first
        # step hands over, on the gather, as it would in a task.
        assert await node.ask("due", "warm", timeout=10) == "warm"
        assert await node.ask("due", 1, timeout=10) == "timed out"
        await asyncio.sleep(0.3)
        assert state == {"a": "cancelled", "b": "cancelled"}


async def test_a_cancel_left_by_a_request_answered_at_once_is_not_the_next_ones() -> None:
    async with Node() as node:
        pool = node.pool("left", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg == "a":
                _cancel_me()
                return "a done"
            await asyncio.sleep(0.05)
            return "b done"

        await node.ask("left", "warm", timeout=10)
        first = node.ask("left", "a", timeout=10)
        second = node.ask("left", "b", timeout=10)
        assert await first == "a done"
        assert await second == "b done"


async def test_the_slot_task_keeps_no_caller_context_alive() -> None:
    var: contextvars.ContextVar[object] = contextvars.ContextVar("var")

    class Big:
        pass

    async with Node() as node:
        pool = node.pool("keeps")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            return "ok"

        async def caller() -> "weakref.ref[Big]":
            big = Big()
            var.set(big)
            assert await node.ask("keeps", 1, timeout=10) == "ok"
            return weakref.ref(big)

        ref = await asyncio.create_task(caller())
        await asyncio.sleep(0.05)
        gc.collect()
        assert ref() is None


async def test_a_handler_does_not_see_its_callers_exception() -> None:
    async with Node() as node:
        pool = node.pool("exc")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            seen = repr(sys.exc_info()[1])
            if msg == "await":
                await asyncio.sleep(0)
            return seen

        for msg in ("inline", "await"):
            try:
                raise KeyError("the caller's")
            except KeyError:
                assert await node.ask("exc", msg, timeout=10) == "None"



async def test_a_cancel_in_the_first_step_reaches_what_the_handler_awaits() -> None:
    children: list["asyncio.Task[str]"] = []
    started: list[Any] = []
    async with Node() as node:
        pool = node.pool("inner")

        async def handle(msg: Any, ctx: Context) -> Any:
            async def child() -> str:
                started.append(msg)
                await asyncio.sleep(0.3)
                return "child finished"

            task = asyncio.current_task()
            assert task is not None
            children.append(asyncio.create_task(child()))
            task.cancel()
            try:
                await children[-1]
            except asyncio.CancelledError:
                return "handler cancelled"
            return "not cancelled"

        pool.handler(_warmed(handle))

        # On an idle slot task and on a fresh one alike: the awaited child is
        # cancelled before it ran, as a task's own cancel would.
        assert await node.ask("inner", 1, timeout=10) == "handler cancelled"
        assert await node.ask("inner", "warm", timeout=10) == "warm"
        assert await node.ask("inner", 2, timeout=10) == "handler cancelled"
        assert [c.cancelled() for c in children] == [True, True]
        # Cancelled before it ever ran (a cancel that only came after it
        # started would cancel it too).
        assert started == []


@pytest.mark.parametrize("path", PATHS)
async def test_a_handlers_cancel_of_its_own_task_keeps_its_message(path: str) -> None:
    """`asyncio.current_task().cancel(msg)` in a handler: what it awaits next
    fails with a `CancelledError` carrying `msg`, as in a task of its own,
    whether the slot's task is new, parked between requests, or the cancel
    comes in a step after a bare yield (before: the message was dropped)."""
    seen: list[tuple[Any, tuple[Any, ...]]] = []

    async def own_task(when: str) -> None:
        if when == "later":
            await asyncio.sleep(0)
        _cancel_me("bye")
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError as exc:
            seen.append(("own task " + when, exc.args))
            raise

    gates: list[asyncio.Event] = []
    async with Node() as node:
        pool = node.pool("selfcancel", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg in ("first", "later"):
                await own_task(msg)
            elif msg == "block":
                await gates[-1].wait()
            return msg

        for when in ("first", "later"):
            task = asyncio.ensure_future(own_task(when))
            with pytest.raises(asyncio.CancelledError):
                await task
        # A new slot task (the pool's first request), then the same one
        # parked between requests, then a cancel after a bare yield.
        for msg in ("first", "first", "later"):
            gates.append(asyncio.Event())
            with pytest.raises(askpool.AskCancelledError):
                await _ask(node, "selfcancel", msg, path, gates[-1])
        assert await node.ask("selfcancel", "after", timeout=10) == "after"
    assert seen == [
        ("own task first", ("bye",)),
        ("own task later", ("bye",)),
        ("own task first", ("bye",)),
        ("own task first", ("bye",)),
        ("own task later", ("bye",)),
    ]


async def _answers_as_a_task_would(handler: Any) -> None:
    """`handler` (which returns what it saw) answers as it does run as a
    task of its own, on a new slot task and on the same one idle."""
    expected = await asyncio.ensure_future(handler(1, None))
    async with Node() as node:
        node.pool("p").handler(handler)
        assert await node.ask("p", 1, timeout=10) == expected
        assert await node.ask("p", 0, timeout=10) == "no cancel"
        assert await node.ask("p", 1, timeout=10) == expected


async def test_a_cancel_of_the_task_then_of_what_it_awaits_gives_the_tasks_message() -> None:
    # The slot's task cancelled ("task"), then, in the same callback, the
    # future its handler awaits cancelled by someone else ("other"), before
    # the task runs: as for a task of its own, the task's cancel.
    async def handler(msg: Any, ctx: Optional[Context]) -> Any:
        loop = asyncio.get_running_loop()
        me, fut = asyncio.current_task(), loop.create_future()
        assert me is not None
        if msg:
            loop.call_soon(lambda: (me.cancel("task"), fut.cancel("other")))
        else:
            loop.call_soon(fut.set_result, None)
        try:
            await fut
        except asyncio.CancelledError as exc:
            return exc.args
        return "no cancel"

    await _answers_as_a_task_would(handler)


@pytest.mark.skipif(
    sys.version_info < (3, 10), reason="3.9 keeps no message of a task that ended cancelled"
)
async def test_a_handlers_cancel_of_its_own_task_then_a_bare_yield_keeps_its_message() -> None:
    async def handler(msg: Any, ctx: Optional[Context]) -> Any:
        if msg:
            _cancel_me("mine")
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError as exc:
            return exc.args
        return "no cancel"

    await _answers_as_a_task_would(handler)


async def test_steps_after_a_bare_yield_are_the_slots_task_in_the_requests_context() -> None:
    # With the slot's task idle, a step after `asyncio.sleep(0)` is run by
    # the extension from a loop callback (`Slot._step`), not by the task's
    # own coroutine: still as the slot's task, in the request's context,
    # with a cancel or an exception of that step where a task's step puts
    # them.
    async with Node() as node:
        pool = node.pool("steps", concurrency=1)
        tasks: list[Optional[asyncio.Task[Any]]] = []

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            task = asyncio.current_task()
            _var.set(msg)
            for _ in range(3):
                await asyncio.sleep(0)
                assert asyncio.current_task() is task
                assert _var.get() == msg
            tasks.append(task)
            if msg == "self-cancel":
                _cancel_me()
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    return "cancelled where it awaited"
                return "not cancelled"
            if msg == "raise":
                raise KeyError("a later step")
            return msg

        assert await node.ask("steps", "warm", timeout=10) == "warm"
        assert await node.ask("steps", "a", timeout=10) == "a"
        assert await node.ask("steps", "self-cancel", timeout=10) == "cancelled where it awaited"
        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("steps", "raise", timeout=10)
        assert (info.value.type_name, info.value.message) == ("KeyError", "'a later step'")
        assert await node.ask("steps", "b", timeout=10) == "b"
        me = asyncio.current_task()
        assert all(isinstance(t, asyncio.Task) and t is not me for t in tasks)
        # One task for the requests before the cancel (its slot's), a new
        # one after the cancel it left standing.
        assert tasks[0] is tasks[1] is tasks[2]
        assert tasks[3] is not tasks[2] and tasks[3] is tasks[4]
        assert _var.get() == "unset"
        assert pool.stats()["in_flight"] == 0


async def test_a_cancel_of_the_idle_slots_task_before_the_next_step_reaches_the_handler() -> None:
    # The handler's first step ran inside the ask and yielded nothing; the
    # slot's task is cancelled before the loop's next turn, where the
    # handler would go on: the cancel reaches it at its `sleep(0)`.
    async with Node() as node:
        pool = node.pool("outside", concurrency=1)
        tasks: list[asyncio.Task[Any]] = []

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            task = asyncio.current_task()
            assert task is not None
            tasks.append(task)
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                return "cancelled where it awaited"
            return "went on"

        # The slot's task made, and idle (waiting for a request) after it.
        assert await node.ask("outside", "warm", timeout=10) == "went on"
        await asyncio.sleep(0)
        asked = node.ask("outside", "cancel", timeout=10)
        assert len(tasks) == 2 and tasks[1] is tasks[0]
        tasks[1].cancel()
        assert await asked == "cancelled where it awaited"
        assert await node.ask("outside", "after", timeout=10) == "went on"
        assert pool.stats()["in_flight"] == 0


def test_system_exit_in_a_later_step_of_an_idle_slots_handler_leaves_the_loop() -> None:
    # As `test_system_exit_in_a_handler_leaves_the_loop_as_in_any_task`, for
    # a step run by the extension for the slot's idle task (`Slot._step`):
    # the exit leaves the loop (before the caller gets its answer).
    answered: list[askpool.HandlerError] = []

    async def main() -> None:
        async with Node() as node:
            pool = node.pool("quits", concurrency=1)

            @pool.handler
            async def handle(msg: Any, ctx: Context) -> Any:
                await asyncio.sleep(0)
                if msg == "quit":
                    raise SystemExit()
                return msg

            assert await node.ask("quits", "warm", timeout=5) == "warm"
            try:
                await node.ask("quits", "quit", timeout=5)
            except askpool.HandlerError as e:
                answered.append(e)
            await asyncio.sleep(1)

    with pytest.raises(SystemExit):
        asyncio.run(main())
    assert answered == []


@pytest.mark.parametrize("after_a_bare_yield", [False, True], ids=["first-await", "after-sleep0"])
async def test_handlers_awaiting_one_future_each_get_its_result(after_a_bare_yield: bool) -> None:
    # A future a handler awaits, handed to its slot's task for the next
    # turn, may be awaited by another coroutine meanwhile (a cache of
    # loads in flight): each gets its result, as with plain tasks. It was
    # left flagged as taken by a task, and the other `await` refused it
    # ("await wasn't used with future").
    async with Node() as node:
        pool = node.pool("shared", concurrency=2)
        loading: dict[str, asyncio.Task[str]] = {}

        async def load(key: str) -> str:
            await asyncio.sleep(0.01)
            return key.upper()

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if after_a_bare_yield:
                await asyncio.sleep(0)
            if msg == "warm":
                await asyncio.sleep(0)
                return msg
            if msg not in loading:
                loading[msg] = asyncio.ensure_future(load(msg))
            return await loading[msg]

        # Both slots' tasks made and idle.
        await asyncio.gather(node.ask("shared", "warm", timeout=5), node.ask("shared", "warm", timeout=5))
        await asyncio.sleep(0.01)
        got = await asyncio.gather(
            node.ask("shared", "k", timeout=5), node.ask("shared", "k", timeout=5), return_exceptions=True
        )
        assert list(got) == ["K", "K"]
        # And a plain task awaiting the handler's future in the same turn.
        del loading["k"]
        asked = asyncio.ensure_future(node.ask("shared", "k", timeout=5))
        await asyncio.sleep(0)
        assert await loading["k"] == "K"
        assert await asked == "K"


@pytest.mark.skipif(sys.version_info < (3, 13), reason="uncancel takes back a pending cancel from 3.13")
@pytest.mark.parametrize("then", ["awaits", "returns"])
async def test_a_cancel_taken_back_in_a_step_is_not_delivered(then: str) -> None:
    # As in a task of its own: a handler cancelling its task and taking the
    # cancel back (`uncancel`) in the same step is not cancelled, neither
    # where it awaits next nor in the slot's next request.
    async with Node() as node:
        pool = node.pool("taken_back", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            if msg != "take back":
                await asyncio.sleep(0)
                return msg
            me = asyncio.current_task()
            assert me is not None
            me.cancel()
            me.uncancel()
            if then == "returns":
                return "returned"
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                return "cancelled anyway"
            return "not cancelled"

        assert await node.ask("taken_back", "warm", timeout=5) == "warm"
        await asyncio.sleep(0)
        expected = "returned" if then == "returns" else "not cancelled"
        assert await node.ask("taken_back", "take back", timeout=5) == expected
        assert await node.ask("taken_back", "next", timeout=5) == "next"
        assert pool.stats()["in_flight"] == 0
