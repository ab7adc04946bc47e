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
import re
import sys
import types
from asyncio import tasks as _tasks
from typing import Any, Callable, Coroutine, Generator, Optional

from . import _native
from ._errors import AskpoolError

#: An ``async def handler(msg, ctx)`` (the extension drives the coroutine it
#: returns), or an object with such an ``async def __call__``.
Handler = Callable[[Any, "_native.Context"], Coroutine[Any, Any, Any]]

#: Slots whose handler awaited and has not answered yet, with their replies.
_running: dict["Slot", _native.Reply] = {}

#: How many handlers' steps yielded nothing (a bare `yield`, as
#: `asyncio.sleep(0)`'s) and were handed over while their slot's task was
#: idle: the handler goes on at the next turn of the loop (`Slot._step`),
#: ahead of anything scheduled after it. One cell, read around an ask's start.
_bare_handovers = [0]

#: The replies of the handlers ``abandon`` is closing.
_abandoned: set[_native.Reply] = set()

#: What asyncio lets out of a task and out of the loop.
_LEAVES_THE_LOOP = (KeyboardInterrupt, SystemExit)

_get_running_loop = asyncio.get_running_loop
_current_task = _tasks.current_task
_send_in = _native._send_in
_step_as = _native._step_as
#: `loop.call_soon(callback, arg, context=context)` (see the extension's
#: `soon.rs`).
_soon = _native._soon


def _describe(exc: BaseException) -> Optional[tuple[str, str, Optional[str]]]:
    """``(type_name, message, code)`` for a handler's exception; ``None``
    when the handler was cancelled. Never raises: an exception whose
    ``str()`` fails is still described by its type."""
    if isinstance(exc, asyncio.CancelledError):
        return None
    code: Optional[str] = None
    if isinstance(exc, AskpoolError):
        try:
            found = exc.code
        except BaseException as e:  # noqa: BLE001 - a property that raises: no code
            found = None
            _leave_if_exit(e)
        # A subclass may set anything there (an Enum, a number): only a
        # string names a code; anything else is a plain handler error.
        code = found if isinstance(found, str) else None
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException as e:  # noqa: BLE001 - the handler's error wins
        message = f"<str() failed: {type(e).__name__}>"
        _leave_if_exit(e)
    return (_valid_text(_exact_str(name)), _valid_text(_exact_str(message)), code)


def _exact_str(text: object) -> str:
    """``text`` as a plain ``str``: the methods of a ``str`` subclass,
    which ``_valid_text`` calls, may raise or cheat; ``str.__str__``
    copies its characters without calling any of them."""
    if type(text) is str:
        return text
    if isinstance(text, str):
        return str.__str__(text)
    return "<str() gave no string>"


def _leave_if_exit(exc: BaseException) -> None:
    """Lets ``exc`` leave the loop if it is a ``KeyboardInterrupt`` or
    ``SystemExit`` (the handler's own, or one that struck while its error
    was described: its ``__str__``, its ``code``, a Ctrl-C at that moment):
    the request is still answered first, and the interrupt leaves the loop
    as from any task."""
    if isinstance(exc, _LEAVES_THE_LOOP):
        _leave_the_loop(exc)


def _valid_text(text: str) -> str:
    """``text`` with its surrogates (which UTF-8 cannot carry: a ``str`` may
    hold them, from ``surrogateescape`` or ``"\\ud800"``) as U+FFFD, so
    that a handler's error still reaches its caller with its type and
    message."""
    if text.isascii():
        return text
    return _SURROGATES.sub("\ufffd", text)


_SURROGATES = re.compile("[\ud800-\udfff]")


def _reraise(exc: BaseException) -> None:
    raise exc


def failure(exc: BaseException) -> Optional[tuple[str, str, Optional[str]]]:
    """The description of the exception of a handler that raised before
    awaiting (answered by the extension). A ``SystemExit`` or
    ``KeyboardInterrupt`` then leaves the loop, as from any task."""
    _leave_if_exit(exc)
    return _describe(exc)


def _leave_the_loop(exc: BaseException) -> None:
    """Raises ``exc`` (a ``KeyboardInterrupt`` or ``SystemExit``) out of
    the running loop at its next turn, where code that must answer first
    caught it."""
    try:
        asyncio.get_running_loop().call_soon(_reraise, exc)
    except RuntimeError:  # no loop: nowhere to leave
        pass


def _answer_failure(reply: _native.Reply, exc: BaseException) -> None:
    """Answers for a handler that raised ``exc``, whatever ``exc`` is: an
    exception that escaped here would end the slot's task with ``reply``
    held in its traceback, leaving the request unanswered and the slot
    taking no request again."""
    try:
        described = _describe(exc)
        if described is None:
            reply.cancelled()
        else:
            reply.error(*described)
    except BaseException as e:  # noqa: BLE001 - answered below, by type alone
        _leave_if_exit(e)
        try:
            reply.error(_valid_text(type(exc).__name__), "<the exception could not be described>")
        except BaseException:  # noqa: BLE001 - already answered
            pass


@types.coroutine
def _resume(
    coro: Coroutine[Any, Any, Any],
    first: Any,
    context: contextvars.Context,
    thrown: Optional[BaseException],
    first_done: bool,
) -> Generator[Any, Any, Any]:
    """Drives a coroutine the extension already started, each step in the
    request's context; ``thrown`` goes in first if given, else what the
    first step yielded goes to the task, unless ``first_done``: that step's
    bare ``yield`` (``asyncio.sleep(0)``) already had its loop turn, and the
    coroutine goes on at once. (A generator awaited as a coroutine, rather
    than an object with ``__await__``: no ``__init__`` to run per
    request.)"""
    yielded, sent = first, None
    # Only `yielded` keeps what the first step awaited, and only until the
    # next step: a handler that goes on for long would otherwise keep it
    # (with its result) alive until it returns.
    del first
    if thrown is None and not first_done:
        if getattr(yielded, "_asyncio_future_blocking", None) is False:
            # Cleared by `Slot.resume` while the future waited for this
            # task; a task takes only a future flagged as awaited.
            yielded._asyncio_future_blocking = True
        try:
            sent = yield yielded
        except BaseException as exc:  # a cancel thrown in by the task
            thrown = exc
    while True:
        # Outside any `except` block: the handler must not see the task's
        # exception as one being handled (`sys.exc_info()`).
        if thrown is None:
            # `context.run(coro.send, sent)`, with the return handed back
            # rather than raised as a `StopIteration`.
            returned, yielded = _send_in(context, coro, sent)
            if returned:
                return yielded
        else:
            try:
                yielded = context.run(coro.throw, thrown)
            except StopIteration as stop:
                return stop.value
        thrown = None
        try:
            sent = yield yielded
        except BaseException as exc:
            thrown = exc


#: A request whose handler awaited: its coroutine, what it yielded, its
#: context, and its reply.
_Job = tuple[Coroutine[Any, Any, Any], Any, contextvars.Context, _native.Reply]


class Slot:
    """One worker slot of a pool: the asyncio task its handlers run as.

    The task is made when the slot first takes a request (a pool of many
    slots costs nothing until they are used), and made again once it ended.
    It ends when it is cancelled while idle (its loop shuts down), and when a
    cancel of it is left standing after a request (one its handler did not
    take back, as ``asyncio.timeout`` does its own): the next request then
    runs as a new task, never under an old request's cancel. A cancel of
    the task after its request ended (a timer the handler left armed) does
    reach the slot's next request, and a callback added to the task runs
    when the slot's task ends, not when the request does: the task is the
    slot's, a request runs as it (as a server's connection task runs its
    requests one after the other)."""

    __slots__ = (
        "_handler",
        "_context",
        "_loop",
        "_task",
        "_waiter",
        "_job",
        "_thrown",
        "_cancelled_first",
        "__weakref__",
    )

    def __init__(self, handler: Handler, context: contextvars.Context) -> None:
        self._handler = handler
        self._context = context
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._job: Optional[_Job] = None
        #: A cancel for the handed-over request, from a task that ended
        #: before it could drive it.
        self._thrown: Optional[BaseException] = None
        #: What the handed-over request's handler awaits, when `resume`
        #: cancelled it (a cancel of the task asked in that step): its own
        #: `CancelledError` is the one to deliver.
        self._cancelled_first: Any = None

    def resume(
        self,
        coro: Coroutine[Any, Any, Any],
        first: Any,
        context: contextvars.Context,
        reply: _native.Reply,
    ) -> None:
        """Hands over a handler whose first step (run by the extension as
        this slot's task, in ``context``) awaited ``first``: the slot's task
        drives it from there and answers ``reply`` (``_step`` does, as
        that task, after a bare ``yield`` while the task is idle)."""
        self._job = (coro, first, context, reply)
        self._cancelled_first = None
        _running[self] = reply
        if first is not None and getattr(first, "_asyncio_future_blocking", False):
            # Until this slot's task takes it (`_resume` flags it again), the
            # future is not blocking a task: another coroutine may await it
            # meanwhile, as it may any future a task waits on (its `await`
            # refuses a future flagged as taken by no task yet).
            first._asyncio_future_blocking = False
        task = self._task
        # (`first is not None` first: a bare `yield`, as `asyncio.sleep(0)`'s,
        # has nothing to cancel, and needs no call to find that out.)
        if (
            first is not None
            and task is not None
            and _cancel_standing(task)
            and asyncio.isfuture(first)
        ):
            # Cancelled in that step: as a task's step does once its
            # coroutine yields, what it awaits is cancelled now, before
            # anything else runs, with the cancel's message.
            first.cancel(*_standing_cancel_args(task, self._waiter))
            self._cancelled_first = first
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if first is None:
                # The handler goes on at the next loop turn, first in line
                # (see `AskHandle.__await__`), and as the slot's task, which
                # stays parked on its waiter: `_step` runs it, without a
                # step of the task's own coroutine (its frames and its new
                # waiter) per request.
                _soon(self._loop, self._step, waiter, context)  # type: ignore[arg-type]
                _bare_handovers[0] += 1
            else:
                waiter.set_result(None)

    def _step(self, waiter: asyncio.Future[None]) -> None:
        """Goes on with the handler handed over by ``resume`` after a bare
        ``yield``, as the slot's task parked on ``waiter``: as that task's
        step would, but from a loop callback. Nothing to do once the task
        was woken otherwise (a cancel of it, which takes the request and
        throws the cancel in where the handler awaits); a step that awaits
        is handed over again. Runs with the request's context entered (so
        do the answer and a next request's first step it starts, which
        enters a fresh context of its own)."""
        job = self._job
        loop, task = self._loop, self._task
        if job is None or self._waiter is not waiter or waiter.done():
            return
        # Set, while the task waits on its waiter.
        assert loop is not None and task is not None
        self._job = None
        coro, _, context, reply = job
        del job
        if _running.get(self) is reply:
            del _running[self]
        try:
            answered, yielded = _step_as(loop, task, coro, reply)
        except BaseException as exc:
            _answer_failure(reply, exc)
            # Answered: only what asyncio lets out of any callback goes on.
            if isinstance(exc, _LEAVES_THE_LOOP):
                raise
            return
        if not answered:
            self.resume(coro, yielded, context, reply)

    def _cancel_where_awaited(self, exc: BaseException) -> Optional[BaseException]:
        """The slot's task was cancelled (``exc``) as a handler's step
        handed its request over: as a task's cancel does, the future the
        handler awaits is cancelled (what it waits on is cancelled with it,
        and the handler gets the ``CancelledError`` from it), and so it is
        when ``resume`` cancelled it already; only if there is none to
        cancel is the cancel thrown in directly."""
        assert self._job is not None
        first = self._job[1]
        if asyncio.isfuture(first) and (
            first.cancel(*exc.args) or first is self._cancelled_first
        ):
            return None
        return exc

    def _new_task(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
        """A new task for the slot's next request: it had none, or its task
        ended, or a cancel of it stands (the extension checks which)."""
        self._loop = loop
        self._waiter = None
        # Its own copy of the pool's context (not the caller's, current when
        # the slot first takes a request): a task keeps its context alive.
        context = self._context.copy()
        if _TASK_TAKES_CONTEXT:
            task = loop.create_task(self._serve(), context=context)
        else:
            # A task that counts the cancels asked of it, as 3.11's do.
            task = context.run(_CountingTask, self._serve(), loop=loop)
        self._task = task
        # An idle slot is pending for good, on purpose: a loop closed without
        # cancelling its tasks has nothing to warn about.
        setattr(task, "_log_destroy_pending", False)
        task.add_done_callback(self._ended, context=context)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The slot's task ended with a request handed to it and not driven
        (cancelled before its first turn, often by the handler's own first
        step): a new task drives it, the cancel thrown in where it awaits,
        as a task's cancel does."""
        if self._task is not task or self._job is None or task.get_loop().is_closed():
            return
        self._thrown = asyncio.CancelledError(*_cancel_args(task))
        self._new_task(task.get_loop())

    async def _serve(self) -> None:
        loop = _get_running_loop()
        me = _current_task(loop)
        assert me is not None
        # `_cancel_standing(me)`, looked up once for the task's requests
        # (before 3.11, a `_CountingTask`'s).
        cancelling = getattr(me, "cancelling", None)
        while True:
            thrown: Optional[BaseException] = None
            if self._thrown is not None and self._job is not None:
                # The cancel of the task that ended before driving it.
                thrown = self._cancel_where_awaited(self._thrown)
            self._thrown = None
            # Whether this task waited a loop turn for the request since its
            # handler's first step (see below).
            woken = False
            if self._job is None:
                waiter = self._waiter = _Waiter(loop=loop)
                waiter._task = me
                waiter._in_step = False
                try:
                    await waiter
                    woken = True
                except asyncio.CancelledError as exc:
                    if _UNCANCEL_TAKES_BACK and waiter._in_step and me.cancelling() == 0:
                        # Asked in a step the extension ran as this task and
                        # taken back (`uncancel`) before that step ended: a
                        # running task's cancel, not delivered yet, which
                        # 3.13's `uncancel` takes back. Nothing is delivered;
                        # the wake-up was the loop turn that step yielded for.
                        woken = True
                    elif self._task is not me or self._job is None:
                        raise  # idle, or replaced: this task ends
                    else:
                        thrown = self._cancel_where_awaited(exc)
                finally:
                    if self._waiter is waiter:
                        self._waiter = None
            if self._task is not me:
                return  # replaced while it waited
            if self._job is None:
                continue  # a cancel taken back, with no request (see above)
            job, self._job = self._job, None
            self._cancelled_first = None
            assert job is not None
            coro, first, context, reply = job
            del job
            # A step that yielded nothing (a bare `yield`, as
            # `asyncio.sleep(0)`'s) asked its task to go on at the next loop
            # turn, as a task's step does with `call_soon`. This task, woken
            # for the request (by a cancel taken back in that step: `resume`
            # hands a bare yield to `_step` otherwise), took that very turn,
            # so the handler goes on now instead of yielding for one more. A
            # request taken in this task's own step (no wait) still yields
            # first.
            first_done = woken and first is None
            # `_finish`'s work inline (a coroutine less per request, a frame
            # less per step of the handler).
            try:
                resumed = _resume(coro, first, context, thrown, first_done)
                # What the first step awaited is the generator's alone now.
                first = None
                value = await resumed
            except BaseException as exc:
                if reply in _abandoned:
                    # Closed with its loop (``abandon``): the close goes on.
                    reply.cancelled()
                    raise
                _answer_failure(reply, exc)
                # Answered: only what asyncio lets out of any task goes on
                # (another BaseException would only be logged as never
                # retrieved).
                if isinstance(exc, _LEAVES_THE_LOOP):
                    raise
                if cancelling is None and isinstance(exc, asyncio.CancelledError):
                    # Before 3.11 asyncio counts no cancels (`cancelling`
                    # below): a cancel the handler let out is taken for one
                    # of the task left standing (asyncio.run's shutdown
                    # cancels the slot's task while its handler runs), and
                    # the task ends as below. Going on, it waited for a next
                    # request, and asyncio.run waited for it for good.
                    raise asyncio.CancelledError()
                value = None
            else:
                # Answering may start the slot's next request already (its
                # first step nested in this step, see `Reply.ok`): `resume`
                # then hands it to this task, which drives it below.
                reply.ok(value)
            finally:
                # That next request's entry stays.
                if _running.get(self) is reply:
                    del _running[self]
            # Let go of the request before waiting for the next: the future
            # its handler first awaited (with its result), its context (its
            # variables' values) and its reply value would stay alive for as
            # long as the slot stays idle.
            del coro, first, context, reply, thrown, value, resumed
            if cancelling is not None and cancelling() > 0:
                # A cancel its handler did not take back: asyncio.run
                # shutting down, or a handler's own. The task ends here (the
                # next request makes a new one).
                raise asyncio.CancelledError()


#: Python 3.11's `create_task(..., context=)`.
_TASK_TAKES_CONTEXT = sys.version_info >= (3, 11)

#: Python 3.13's `uncancel`, which takes back a cancel not delivered yet.
_UNCANCEL_TAKES_BACK = sys.version_info >= (3, 13)


class _Waiter(asyncio.Future):  # type: ignore[type-arg]
    """What a slot's idle task waits on for its next request. The
    extension runs handler steps as that task while it stays parked here
    (a first step, `Slot._step`), so a cancel of the task asked in such a
    step cancels this future, where a running task's cancel would only be
    marked for its next step; this remembers that it came from such a
    step (the task was the current one), for `_serve`."""

    __slots__ = ("_task", "_in_step")
    # Set by `_serve` right after making it (no `__init__` of its own).
    _task: asyncio.Task[None]
    _in_step: bool

    def cancel(self, msg: Any = None) -> bool:
        if not self.done() and _current_task(self.get_loop()) is self._task:
            self._in_step = True
        return super().cancel(msg)


class _CountingTask(asyncio.Task):  # type: ignore[type-arg]
    """A slot's task before 3.11, whose tasks have no `cancelling()`: it
    counts the cancels asked of it, as 3.11's does (none is taken back
    before 3.11: there is no `uncancel`). So a cancel its handler caught
    (asyncio.run's shutdown cancel, taken back by the handler or by
    `wait_for` swallowing it) still ends the slot's task after the request,
    as on 3.11, instead of leaving it waiting for a next request, and
    asyncio.run waiting for it, for good."""

    _cancels = 0

    def cancel(self, *args: Any, **kwargs: Any) -> bool:
        self._cancels += 1
        return super().cancel(*args, **kwargs)

    def cancelling(self) -> int:
        return self._cancels


#: Whether a cancel of a task was asked and not taken back (3.11+'s
#: `cancelling()`, a `_CountingTask`'s before; else one asked and not yet
#: delivered): the extension's own reading, which it uses to pick a slot's
#: task.
_cancel_standing = _native._cancel_standing


def _cancel_args(future: asyncio.Future[Any]) -> tuple[Any, ...]:
    """The arguments of the ``CancelledError`` a cancelled future (or task)
    ended with (its cancel's message)."""
    try:
        future.result()
    except asyncio.CancelledError as exc:
        return exc.args
    except BaseException:
        pass
    return ()


def _standing_cancel_args(task: asyncio.Task[None], waiter: Optional[asyncio.Future[None]]) -> tuple[Any, ...]:
    """The message of a cancel asked of a slot's task in a handler step run
    as it (as a tuple: empty for none), which a task passes on to what its
    coroutine awaits. Asked while the task was parked on its waiter (a step
    the extension ran), the cancel went to the waiter; asked while the task
    ran its own step, the task holds it."""
    if waiter is not None and waiter.cancelled():
        return _cancel_args(waiter)
    message = getattr(task, "_cancel_message", None)
    return () if message is None else (message,)


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
