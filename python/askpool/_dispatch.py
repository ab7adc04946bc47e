"""Runs a pool's async handlers on the loop thread.

A handler starts eagerly inside the dispatch call: a handler that finishes
without awaiting (most of them, in process) replies at once and costs no
asyncio task. One that awaits continues as a task from where it stopped.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Coroutine, Generator

from . import _native
from ._errors import AskpoolError

Handler = Callable[[Any, "_native.Context"], Awaitable[Any]]


def _fail(reply: _native.Reply, exc: BaseException) -> None:
    code = exc.code if isinstance(exc, AskpoolError) else None
    reply.error(type(exc).__name__, str(exc), code)


class _Resume:
    """Awaitable that drives a coroutine already started by ``dispatcher``."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._first
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # a cancel thrown in by the task
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _finish(coro: Coroutine[Any, Any, Any], first: Any, reply: _native.Reply) -> None:
    try:
        value = await _Resume(coro, first)
    except asyncio.CancelledError:
        reply.cancelled()
        raise
    except BaseException as exc:
        _fail(reply, exc)
        if not isinstance(exc, Exception):
            raise
    else:
        reply.ok(value)


def dispatcher(
    handler: Handler, loop: asyncio.AbstractEventLoop
) -> Callable[[Any, _native.Context, _native.Reply], None]:
    """The callable the extension calls with each request of the pool."""

    # Tasks are held here while they run: the loop keeps only weak references.
    running: set[asyncio.Task[None]] = set()

    def dispatch(msg: Any, ctx: _native.Context, reply: _native.Reply) -> None:
        try:
            coro: Coroutine[Any, Any, Any] = handler(msg, ctx)  # type: ignore[assignment]
            first = coro.send(None)
        except StopIteration as stop:
            reply.ok(stop.value)
            return
        except asyncio.CancelledError:
            reply.cancelled()
            return
        except BaseException as exc:
            _fail(reply, exc)
            if not isinstance(exc, Exception):
                raise
            return
        task = loop.create_task(_finish(coro, first, reply))
        running.add(task)
        task.add_done_callback(running.discard)

    return dispatch
