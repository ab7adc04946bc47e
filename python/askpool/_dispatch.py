"""Running a pool's handlers, for the extension.

Each worker slot of a pool is a :class:`Slot`: an asyncio task that every
handler of that slot runs as, one request at a time, each request in a fresh
copy of the context the pool's handler was registered in. So a handler sees
itself as a task of its own (``asyncio.current_task()``, ``asyncio.timeout``,
``TaskGroup``), never as its caller's task, and a context variable it sets
stays with its request.

The extension starts a handler's coroutine itself, on the loop thread, when
the slot takes the request, often inside the caller's own ``node.ask()``:
the first step runs as the slot's task (entered in place of whatever task
is current, as a task's step does) in the request's context, without waiting
for a turn of the loop, and a handler that returns without awaiting is
answered there. One that awaits goes on in the slot's task from where it
stopped (``Slot.resume``); one that raises is described by ``failure``.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio import tasks as _tasks
from typing import Any, Callable, Coroutine, Generator, Optional

from . import _native
from ._errors import AskpoolError

#: An ``async def handler(msg, ctx)`` (the extension drives the coroutine it
#: returns), or an object with such an ``async def __call__``.
Handler = Callable[[Any, "_native.Context"], Coroutine[Any, Any, Any]]

#: Slots whose handler awaited and has not answered yet, with their replies.
_running: dict["Slot", _native.Reply] = {}

#: The replies of the handlers ``abandon`` is closing.
_abandoned: set[_native.Reply] = set()

#: What asyncio lets out of a task and out of the loop.
_LEAVES_THE_LOOP = (KeyboardInterrupt, SystemExit)

_get_running_loop = asyncio.get_running_loop
_current_task = _tasks.current_task


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
    """Awaitable that drives a coroutine the extension already started, each
    step in the request's context; ``thrown`` goes in first if given."""

    __slots__ = ("_coro", "_first", "_context", "_thrown")

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        first: Any,
        context: contextvars.Context,
        thrown: Optional[BaseException],
    ) -> None:
        self._coro = coro
        self._first = first
        self._context = context
        self._thrown = thrown

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded, run = self._coro, self._first, self._context.run
        if self._thrown is not None:
            try:
                yielded = run(coro.throw, self._thrown)
            except StopIteration as stop:
                return stop.value
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # a cancel thrown in by the task
                try:
                    yielded = run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value


#: A request whose handler awaited: its coroutine, what it yielded, its
#: context, and its reply.
_Job = tuple[Coroutine[Any, Any, Any], Any, contextvars.Context, _native.Reply]


class Slot:
    """One worker slot of a pool: the asyncio task its handlers run as.

    The task is made when the slot first takes a request (a pool of many
    slots costs nothing until they are used), and made again if it ended: it
    ends when it is cancelled while idle (its loop shuts down), or when a
    cancel of it was left standing after a request (nobody uncancelled it:
    ``asyncio.run`` cancelling everything at its end)."""

    __slots__ = ("_handler", "_context", "_loop", "_task", "_waiter", "_job", "__weakref__")

    def __init__(self, handler: Handler, context: contextvars.Context) -> None:
        self._handler = handler
        self._context = context
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._job: Optional[_Job] = None

    def resume(
        self,
        coro: Coroutine[Any, Any, Any],
        first: Any,
        context: contextvars.Context,
        reply: _native.Reply,
    ) -> None:
        """Hands over a handler whose first step (run by the extension as
        this slot's task, in ``context``) awaited ``first``: the slot's task
        drives it from there and answers ``reply``."""
        self._job = (coro, first, context, reply)
        _running[self] = reply
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _new_task(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
        self._loop = loop
        self._waiter = None
        task = self._task = loop.create_task(self._serve())
        # An idle slot is pending for good, on purpose: a loop closed without
        # cancelling its tasks has nothing to warn about.
        setattr(task, "_log_destroy_pending", False)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The slot's task ended with a request handed to it and not driven
        (cancelled before its first step: by its handler's own first step, or
        with its loop): the handler is closed and the request answered
        cancelled, so that the slot is free again and its caller told."""
        job = self._job
        if self._task is not task or job is None:
            return
        self._job = None
        coro, _, context, reply = job
        _running.pop(self, None)
        try:
            context.run(coro.close)
        finally:
            reply.cancelled()

    async def _serve(self) -> None:
        loop = _get_running_loop()
        while True:
            thrown: Optional[BaseException] = None
            job = self._job
            if job is None:
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                except asyncio.CancelledError as exc:
                    job = self._job
                    if job is None:
                        raise  # idle: the slot's task ends
                    # Cancelled by its handler's first step (or as it handed
                    # over): the handler gets the cancel where it awaits.
                    thrown = exc
                finally:
                    self._waiter = None
                job = self._job
            assert job is not None
            self._job = None
            coro, first, context, reply = job
            try:
                await _finish(coro, first, context, reply, thrown)
            finally:
                _running.pop(self, None)
            task = _current_task(loop)
            cancelling = getattr(task, "cancelling", None)
            if cancelling is not None and cancelling():
                # A cancel of this task that its handler did not take back:
                # asyncio.run shutting down, or a handler's own. It ends here
                # (the next request makes a new task).
                raise asyncio.CancelledError()


async def _finish(
    coro: Coroutine[Any, Any, Any],
    first: Any,
    context: contextvars.Context,
    reply: _native.Reply,
    thrown: Optional[BaseException],
) -> None:
    try:
        value = await _Resume(coro, first, context, thrown)
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


def abandon(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` was closed with handlers of it still running (stopped and
    closed without cancelling its tasks): they can never run again. Each is
    closed (its ``finally`` blocks run) and its request answered as
    cancelled, so that its caller is told instead of waiting out its timeout
    and nothing of it is kept."""
    first: Optional[BaseException] = None
    for slot, reply in [(s, r) for s, r in _running.items() if s._loop is loop]:
        del _running[slot]
        _abandoned.add(reply)
        try:
            job, slot._job = slot._job, None
            if job is not None and job[3] is reply:
                # Handed over, never driven by the slot's task: close it here.
                try:
                    job[2].run(job[0].close)
                finally:
                    reply.cancelled()
            elif slot._task is not None:
                slot._task.get_coro().close()
        except BaseException as exc:  # a handler that would not stop: the others still are
            first = first or exc
        finally:
            _abandoned.discard(reply)
    if first is not None:
        raise first


def new_slot(handler: Handler) -> Callable[[], Slot]:
    """What the extension calls to make each worker slot of a pool whose
    handler is ``handler``: its requests run in copies of the current
    context (the one the handler is registered in)."""
    context = contextvars.copy_context()
    return lambda: Slot(handler, context)
