"""The slow paths of running a pool's handlers, called by the extension.

The extension starts each handler's coroutine itself, on the loop thread; a
handler that returns without awaiting is answered there and never reaches
this module. One that awaits continues here as an asyncio task from where it
stopped (``resume``); an exception is described by ``failure``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Generator, Optional

from . import _native
from ._errors import AskpoolError

#: An ``async def handler(msg, ctx)`` (the extension drives the coroutine it
#: returns), or an object with such an ``async def __call__``.
Handler = Callable[[Any, "_native.Context"], Coroutine[Any, Any, Any]]

#: Handler tasks while they run, with their replies: the loop keeps only
#: weak references.
_running: dict[asyncio.Task[None], _native.Reply] = {}

#: The replies of the handlers ``abandon`` is closing.
_abandoned: set[_native.Reply] = set()


#: What asyncio lets out of a task and out of the loop.
_LEAVES_THE_LOOP = (KeyboardInterrupt, SystemExit)


def _describe(exc: BaseException) -> Optional[tuple[str, str, Optional[str]]]:
    """``(type_name, message, code)`` for a handler's exception; ``None``
    when the handler was cancelled. Never raises: an exception whose
    ``str()`` fails is still described by its type."""
    if isinstance(exc, asyncio.CancelledError):
        return None
    code = exc.code if isinstance(exc, AskpoolError) else None
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception as e:  # noqa: BLE001 - the handler's error wins
        message = f"<str() failed: {type(e).__name__}>"
    return (name, message, code)


def _reraise(exc: BaseException) -> None:
    raise exc


def failure(exc: BaseException) -> Optional[tuple[str, str, Optional[str]]]:
    """The description of the exception of a handler that raised before
    awaiting (answered by the extension). A ``SystemExit`` or
    ``KeyboardInterrupt`` then leaves the loop, as from any task."""
    if isinstance(exc, _LEAVES_THE_LOOP):
        try:
            asyncio.get_running_loop().call_soon(_reraise, exc)
        except RuntimeError:  # no loop: nowhere to leave
            pass
    return _describe(exc)


def _answer_failure(reply: _native.Reply, exc: BaseException) -> None:
    described = _describe(exc)
    if described is None:
        reply.cancelled()
    else:
        reply.error(*described)


class _Resume:
    """Awaitable that drives a coroutine the extension already started."""

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
    except BaseException as exc:
        if reply in _abandoned:
            # Closed with its loop (``abandon``): the close goes on.
            reply.cancelled()
            raise
        _answer_failure(reply, exc)
        # Answered: only what asyncio lets out of any task goes on (another
        # BaseException would only be logged as never retrieved).
        if isinstance(exc, _LEAVES_THE_LOOP):
            raise
    else:
        reply.ok(value)


def resume(coro: Coroutine[Any, Any, Any], first: Any, reply: _native.Reply) -> None:
    """Continues a handler that awaited as a task of the running loop."""
    task = asyncio.get_running_loop().create_task(_finish(coro, first, reply))
    _running[task] = reply
    task.add_done_callback(_forget)


def _forget(task: asyncio.Task[None]) -> None:
    _running.pop(task, None)


def abandon(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` was closed with handlers of it still running (stopped and
    closed without cancelling its tasks): they can never run again. Each is
    closed (its ``finally`` blocks run) and its request answered as
    cancelled, so that its caller is told instead of waiting out its timeout
    and nothing of it is kept."""
    first: Optional[BaseException] = None
    for task, reply in [(t, r) for t, r in _running.items() if t.get_loop() is loop]:
        del _running[task]
        # Pending for good, and on purpose: nothing to warn about.
        setattr(task, "_log_destroy_pending", False)
        _abandoned.add(reply)
        try:
            task.get_coro().close()
        except BaseException as exc:  # a handler that would not stop: the others still are
            first = first or exc
        finally:
            _abandoned.discard(reply)
    if first is not None:
        raise first
