"""The asyncio API: Node, Pool, AskHandle."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import weakref
from types import TracebackType
from typing import (
    Any,
    AsyncGenerator,
    Callable,
    Generator,
    NamedTuple,
    Optional,
    Protocol,
    TypeVar,
)

from . import _dispatch, _native
from ._dispatch import Handler, _bare_handovers, _soon
from ._errors import AskpoolError, NoRunningLoopError
from ._promises import Promises
from ._stats import NodeStats, PoolStats

H = TypeVar("H", bound=Handler)

_get_ident = threading.get_ident

_drivers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _native.LoopDriver] = (
    weakref.WeakKeyDictionary()
)
#: Each driver's `_LoopCloser`, held by its loop's reader alone.
_closers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, "weakref.ref[_LoopCloser]"
] = weakref.WeakKeyDictionary()


def _running_loop(what: str) -> asyncio.AbstractEventLoop:
    loop = asyncio._get_running_loop()
    if loop is None:
        raise NoRunningLoopError(
            f"{what} needs a running asyncio event loop in this thread; "
            "from plain threads use Node.ask_sync()"
        )
    return loop


#: The options of an ask besides its timeout, as the extension takes them.
AskOptions = tuple[Optional[str], Optional[str], Optional[str], Optional[str], Optional[int]]


def _valid_names(*pairs: tuple[str, Optional[str]]) -> None:
    """Refuses a name or id with a surrogate (which UTF-8 cannot carry) as
    ``InvalidArgumentError``, as every binding does, rather than the
    extension's ``UnicodeEncodeError``."""
    for what, text in pairs:
        if isinstance(text, str) and not text.isascii():
            if _dispatch._SURROGATES.search(text):
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(
                    f"{what} is not valid Unicode (a lone surrogate): {_dispatch._valid_text(text)!r}"
                )


def _ask_args(
    preferred_worker: Optional[str],
    request_id: Optional[str],
    correlation_id: Optional[str],
    causation_id: Optional[str],
    fingerprint: Optional[int],
) -> Optional[AskOptions]:
    """The rarely given options of ``ask`` and ``ask_sync``: ``None`` when
    none is given, so the common ask passes one argument for all of them."""
    if (
        preferred_worker is None
        and request_id is None
        and correlation_id is None
        and causation_id is None
        and fingerprint is None
    ):
        return None
    _valid_names(
        ("preferred_worker", preferred_worker),
        ("request_id", request_id),
        ("correlation_id", correlation_id),
        ("causation_id", causation_id),
    )
    if fingerprint is not None and (
        isinstance(fingerprint, bool)
        or not isinstance(fingerprint, int)
        or not 0 <= fingerprint < 2**128
    ):
        from ._errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"fingerprint must be an int from 0 to 2**128 - 1, not {fingerprint!r}"
        )
    return (preferred_worker, request_id, correlation_id, causation_id, fingerprint)


def _driver(loop: asyncio.AbstractEventLoop) -> _native.LoopDriver:
    driver = _drivers.get(loop)
    if driver is None:
        driver = _native.LoopDriver()
        end = _until_shutdown(driver)
        # Its first step registers it with the running loop, which closes
        # it in `shutdown_asyncgens()`.
        with contextlib.suppress(StopIteration):
            end.asend(None).send(None)
        closer = _LoopCloser(loop, driver, end)
        # The reader holds the closer (the loop keeps only a weak reference
        # to `end`), and drops it when the loop closes.
        loop.add_reader(driver.fileno(), _drain, driver, closer)
        _drivers[loop] = driver
        _closers[loop] = weakref.ref(closer)
    return driver


def _drain(driver: _native.LoopDriver, _closer: object) -> None:
    driver.drain()


class _LoopCloser:
    """What a loop that closes leaves behind, let go when it closes: the
    loop drops its readers, this one's arguments with them, also when it is
    closed without ``shutdown_asyncgens()`` (``run_until_complete``, then
    ``close``). Its pools leave the node (later asks fail at once), handlers
    left running are closed and answered, and the driver cancels what was
    still in flight, at the close rather than at a garbage collection (the
    driver's tasks and the loop's futures hold each other through Rust,
    where the collector cannot see)."""

    __slots__ = ("_loop", "_driver", "_end", "pools", "__weakref__")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        driver: _native.LoopDriver,
        end: AsyncGenerator[None, None],
    ) -> None:
        self._loop = weakref.ref(loop)
        self._driver = driver
        # Kept for `shutdown_asyncgens()`, which finds it by a weak reference.
        self._end = end
        #: The open pools whose workers run on the loop (a closed pool leaves).
        self.pools: set[_native.NativePool] = set()

    def __del__(self) -> None:
        try:
            # A copy: another thread's Pool.close() may leave the set now.
            for pool in list(self.pools):
                pool.close()
            loop = self._loop()
            if loop is not None and loop.is_closed():
                _dispatch.abandon(loop)
        finally:
            # The loop dropped its readers: it no longer watches the socket.
            self._driver.release()


async def _until_shutdown(driver: _native.LoopDriver) -> AsyncGenerator[None, None]:
    """Suspended until its loop shuts down its async generators, which
    ``asyncio.run`` (and ``asyncio.Runner``) do once every task is done.
    What is still in flight on the loop then (an ask nobody awaited, a
    tell, a stage stream) can never be awaited, nor polled once the loop
    closes: the driver cancels it, and the node forgets it."""
    try:
        yield
    finally:
        driver.close()


class StageEvent(NamedTuple):
    """One ACK-lifecycle stage of an ask (SENT, RECEIVED, READ, PARTIAL, then
    one of FULFILLED, REJECTED, FAILED, TIMED_OUT)."""

    stage: str
    #: Seconds since SENT.
    since_sent: float
    #: Seconds spent in the previous stage.
    since_previous: float
    #: Set on PARTIAL events: the handler's ``ctx.progress(fraction, note)``.
    fraction: Optional[float]
    note: Optional[str]


class DeadLetter(NamedTuple):
    """An ask (or tell) that failed for good, kept in the node's
    dead-letter queue (``Node.dead_letters()``) until replayed or purged."""

    request_id: str
    correlation_id: str
    #: The pool it was asked of.
    pool: str
    #: The message asked (the very object, not a copy).
    payload: Any
    #: The error it failed with.
    error: AskpoolError
    #: Attempts sent.
    attempts: int
    #: "POISON" or "RETRIES_EXHAUSTED" (as in every binding).
    reason: str
    #: "ASK" or "TELL": what was sent, and what its replay sends.
    kind: str


def _check_count(what: str, n: Optional[int], minimum: int) -> None:
    """A count option: an int (not a bool) from ``minimum`` to 2**63 - 1, or
    None. Anything else is ``InvalidArgumentError`` naming the option,
    rather than the ``TypeError`` or ``OverflowError`` a comparison or the
    native conversion would raise."""
    if n is None:
        return
    from ._errors import InvalidArgumentError

    if isinstance(n, bool) or not isinstance(n, int):
        raise InvalidArgumentError(f"{what} must be an int, not {type(n).__name__}")
    if not minimum <= n < 2**63:
        raise InvalidArgumentError(f"{what} must be from {minimum} to 2**63 - 1, not {n}")


def _check_seconds(what: str, t: Optional[float]) -> None:
    """A duration option: a positive finite number of seconds, or None."""
    _check_seconds_type(what, t)
    if t is not None and not 0 < t < float("inf"):
        from ._errors import InvalidArgumentError

        raise InvalidArgumentError(f"{what} must be a positive, finite number of seconds, not {t}")


def _check_seconds_type(what: str, t: object) -> None:
    """A number of seconds, or None: not a bool, whose conversion to a
    float would pass (an ask's or tell's timeout: its value is the
    extension's to check)."""
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
        from ._errors import InvalidArgumentError

        raise InvalidArgumentError(f"{what} must be a number of seconds, not {type(t).__name__}")


def _check_pool_name(name: object) -> None:
    from ._errors import InvalidArgumentError

    if not isinstance(name, str):
        raise InvalidArgumentError(f"a pool name is a str, not {type(name).__name__}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= 255:
        raise InvalidArgumentError(f"a pool name is 1 to 255 bytes, not {size}")


class _NextTurn:
    """What the task awaiting an ``AskHandle`` waits on for one turn of the
    loop, when the handle's handler goes on first in that turn (see
    ``AskHandle.__await__``): to the task, a future done at that turn.
    Waiting on it, rather than on nothing (a bare ``yield``), the task is
    cancelled as it is when waiting on the handle: its cancel cancels the
    handle at once (the protocol cancel), before the handler can answer in
    that turn. Made without ``__init__``, and with no ``get_loop`` (a task
    reads ``_loop`` then): calls less per ask."""

    __slots__ = ("_handle", "_loop", "_asyncio_future_blocking")
    _handle: "AskHandle"
    _loop: asyncio.AbstractEventLoop
    _asyncio_future_blocking: bool

    def add_done_callback(self, fn: Callable[["_NextTurn"], object], *, context: Any = None) -> None:
        # The task's wake-up, at the next turn: behind the handler's step,
        # scheduled before this.
        _soon(self._loop, fn, self, context)

    def cancel(self, msg: Any = None) -> bool:
        return self._handle.cancel(msg)

    def cancelled(self) -> bool:
        return self._handle.cancelled()

    def done(self) -> bool:
        return True

    def result(self) -> None:
        # What the handle holds, the task takes from the handle.
        return None

    def __repr__(self) -> str:
        return f"<next loop turn of {self._handle!r}>"


_new_turn = object.__new__

_StageTuple = tuple[str, float, float, Optional[float], Optional[str]]


class _StageSource(Protocol):
    def next_stage(self, driver: _native.LoopDriver, target: asyncio.Future[Any]) -> None: ...


class _Staged:
    """``stages()`` of a handle whose ``_native`` reads stage events (an
    ask's, a durable ask's)."""

    # Its handles declare the slot: a second base of a Future subclass can
    # add no slot of its own (the two layouts would conflict).
    __slots__ = ()
    _native: _StageSource
    _stages_taken: bool

    def stages(self) -> AsyncGenerator[StageEvent, None]:
        """The stage events as they happen, ending after the last terminal
        one. Empty on a node made with ``track_stages=False``. One stream
        per handle: a second call raises ``InvalidArgumentError`` (two
        iterators would each get part of the events)."""
        if getattr(self, "_stages_taken", False):
            from ._errors import InvalidArgumentError

            raise InvalidArgumentError(f"stages() of {type(self).__name__} can be read once")
        self._stages_taken = True  # type: ignore[misc]  # (see __slots__)
        return self._stage_events()

    async def _stage_events(self) -> AsyncGenerator[StageEvent, None]:
        loop = _running_loop(f"{type(self).__name__}.stages()")
        driver = _driver(loop)
        while True:
            target: asyncio.Future[Optional[_StageTuple]] = loop.create_future()
            self._native.next_stage(driver, target)
            event = await target
            if event is None:
                return
            yield StageEvent(*event)


class AskHandle(asyncio.Future[Any], _Staged):
    """An ask in flight: an asyncio future of the reply. Cancelling it (or
    the task awaiting it) sends the protocol cancel to the pool."""

    __slots__ = ("_native", "_stages_taken", "_turn_first")
    _native: _native.NativeAsk
    _stages_taken: bool
    #: Whether its start handed a handler's bare `yield` over while its
    #: slot's task was idle (`_dispatch._bare_handovers`): the handler then
    #: goes on first in line at the next loop turn (`Slot._step`), and
    #: answers there if it returns.
    _turn_first: bool

    def __await__(self) -> Generator[Any, None, Any]:
        # As `asyncio.Future.__await__`, but an ask whose handler goes on at
        # the next loop turn (one that awaited `asyncio.sleep(0)`) first
        # waits for that turn (`_NextTurn`, a future done at that turn,
        # whose cancel cancels the handle): its caller's task then runs
        # after the handler's step in that same turn and finds the reply
        # there, instead of being woken by the reply's callbacks one turn
        # later. Not when callbacks were added to the handle before: they
        # run before its awaiter, as for any future. Anything else waits on
        # the handle.
        if not self.done():
            if self._turn_first and not self._callbacks:
                turn = _new_turn(_NextTurn)
                turn._handle = self
                turn._loop = self._loop
                turn._asyncio_future_blocking = True
                try:
                    yield turn
                except BaseException:
                    # A cancel the handle had no use for (it was done): as
                    # below, the traceback keeps this frame, not the handle.
                    del self, turn
                    raise
                del turn
            if not self.done():
                self._asyncio_future_blocking = True
                yield self
                if not self.done():
                    raise RuntimeError("await wasn't used with future")
        try:
            return self.result()
        except BaseException:
            # The traceback keeps this frame: not the handle (and its reply)
            # with it, for as long as the task that awaited it is kept.
            del self
            raise

    __iter__ = __await__

    @property
    def request_id(self) -> str:
        return self._native.request_id

    @property
    def correlation_id(self) -> str:
        return self._native.correlation_id

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        self._native.cancel()
        return super().cancel(msg)



def _is_async_handler(declared: object) -> bool:
    return inspect.iscoroutinefunction(declared) or inspect.iscoroutinefunction(
        getattr(type(declared), "__call__", None)
    )


def _unwrapped(fn: Any) -> object:
    """What a decorator (``functools.wraps``) wrapped, or ``fn`` itself
    (a ``__wrapped__`` chain that loops unwraps to nothing)."""
    try:
        return inspect.unwrap(fn)
    except ValueError:
        return fn


class DurableHandle(asyncio.Future[Any], _Staged):
    """A durable ask in flight: an asyncio future of the reply, with the id
    of the promise that records it. ``stages()`` streams the asks it makes,
    one after another (SENT to a terminal stage each; an ask made again
    after a transient failure starts at SENT again), and ends with its
    outcome; it is empty when the store already had the outcome, or while
    the handle only waits for an ask of the same id made by another."""

    __slots__ = ("id", "_native", "_stages_taken")
    id: str
    _native: _native.NativeDurable


async def _close_with_loop(pool: Pool, native: _native.NativePool) -> None:
    """Waits for its loop's shutdown, then closes the pool."""
    loop = asyncio.get_running_loop()
    try:
        # A timer, not a bare future: the loop holds its timers, so this task
        # stays reachable (and uncollected) for as long as the loop lives.
        await asyncio.sleep(_FOREVER)
    finally:
        native.close()
        pool._forget()
        if loop.is_closed():
            # Closed without cancelling its tasks: handlers left running
            # on it would hold their requests for good.
            _dispatch.abandon(loop)


#: Longer than any loop runs (about 31 years).
_FOREVER = 1e9


class Pool:
    """A pool hosted by a node; give it a handler with ``@pool.handler``.
    The pool lives as long as the event loop it was given its handler on."""

    def __init__(
        self,
        node: Node,
        name: str,
        concurrency: int,
        max_in_flight: Optional[int],
        reply_cache: Optional[int] = None,
        reply_ttl: Optional[float] = None,
    ) -> None:
        _check_pool_name(name)
        _check_count("concurrency", concurrency, 1)
        _check_count("max_in_flight", max_in_flight, 1)
        _check_count("reply_cache", reply_cache, 1)
        _check_seconds("reply_ttl", reply_ttl)
        self._node = node
        self.name = name
        self.concurrency = concurrency
        self.max_in_flight = max_in_flight
        self.reply_cache = reply_cache
        self.reply_ttl = reply_ttl
        self._native: Optional[_native.NativePool] = None
        #: The task that closes the pool when its loop shuts down, and the loop.
        self._keeper: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = None

    def handler(self, fn: H) -> H:
        """Registers ``async def fn(msg, ctx)`` (or an object with an
        ``async def __call__``, or a decorator's wrapper of either that keeps
        ``__wrapped__``, as ``functools.wraps`` does) and starts the pool's
        workers on the running event loop."""
        if not _is_async_handler(fn) and not _is_async_handler(_unwrapped(fn)):
            raise TypeError(f"a pool handler must be an `async def`, not {fn!r}")
        if self._native is not None:
            from ._errors import FailedPreconditionError

            raise FailedPreconditionError(f"pool {self.name!r} already has a handler")
        loop = _running_loop("Pool.handler")
        driver = _driver(loop)
        self._native = self._node._native.pool(
            driver,
            self.name,
            _dispatch.new_slot(fn),
            self.concurrency,
            self.max_in_flight,
            self.reply_cache,
            self.reply_ttl,
        )
        # The pool's workers run on this loop: when the loop shuts down
        # (asyncio.run cancels every task it leaves), the pool leaves the node,
        # so later asks fail at once with NoRouteError instead of queueing
        # for workers that will never run again and timing out.
        closer = _closers[loop]()
        if closer is not None:
            closer.pools.add(self._native)
        keeper = loop.create_task(
            _close_with_loop(self, self._native), name=f"askpool pool {self.name!r}"
        )
        # A loop closed without cancelling its tasks (run_forever, then
        # close) drops this one pending, which closes the pool all the same
        # (its `finally`): nothing to warn about.
        setattr(keeper, "_log_destroy_pending", False)
        self._keeper = (loop, keeper)
        self._node._pools.add(self)
        return fn

    def close(self) -> None:
        """Leaves the node: new asks get ``NoRouteError``, queued ones are
        cancelled."""
        if self._native is not None:
            self._native.close()
            self._release()

    def _forget(self) -> Optional[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]]:
        """Drops what held the closed pool (its node's and its loop's
        records); returns its keeper if it still had one."""
        keeper, self._keeper = self._keeper, None
        if keeper is None or self._native is None:
            return None
        self._node._pools.discard(self)
        closer = _closers.get(keeper[0])
        alive = closer() if closer is not None else None
        if alive is not None:
            alive.pools.discard(self._native)
        return keeper

    def _release(self) -> None:
        """Lets go of the closed pool: its loop's keeper task and closer
        held it (and through it its node and reply cache, about 1 MiB) for
        as long as the loop lived, however many pools were closed on it."""
        keeper = self._forget()
        if keeper is None:
            return
        loop, task = keeper
        if asyncio._get_running_loop() is loop:
            task.cancel()
        elif not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass  # closed meanwhile: the task went with it

    def stats(self) -> PoolStats:
        """A snapshot of the pool's counters (requests in flight and queued,
        handler runs, duplicates, replays, cancels, ...). Raises
        ``FailedPreconditionError`` before the pool has a handler."""
        if self._native is None:
            from ._errors import FailedPreconditionError

            raise FailedPreconditionError(f"pool {self.name!r} has no handler yet")
        return self._native.stats()  # type: ignore[return-value]


class Node:
    """A caller of asks and a host of worker pools. Use it as an async
    context manager: leaving it shuts it down (pending asks fail with
    ``UnavailableError``).

    ``default_timeout``: seconds, for asks that give none (30).
    ``dlq_capacity``: dead letters kept (1,000). ``track_stages``: record
    each ask's ACK lifecycle for ``AskHandle.stages()``. ``circuit_breaker``:
    a breaker per target pool that fails asks fast (``UnavailableError``)
    after repeated failures. ``promises``: the store of durable asks.
    ``max_payload_bytes``: the largest ``bytes``, ``bytearray`` or
    ``memoryview`` payload an ask or tell may carry (16 MiB; ``None``: no
    bound); a larger one raises ``OversizePayloadError`` and nothing is sent.
    Other objects pass by reference and are not sized."""

    def __init__(
        self,
        *,
        default_timeout: Optional[float] = None,
        dlq_capacity: Optional[int] = None,
        track_stages: bool = True,
        circuit_breaker: bool = True,
        promises: Optional[Promises] = None,
        max_payload_bytes: Optional[int] = _native.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        _check_seconds("default_timeout", default_timeout)
        _check_count("dlq_capacity", dlq_capacity, 0)
        _check_count("max_payload_bytes", max_payload_bytes, 0)
        self._native = _native.NativeNode(
            default_timeout, dlq_capacity, track_stages, circuit_breaker, max_payload_bytes
        )
        self.promises = promises
        #: Its open pools that have a handler (closed with the node).
        self._pools: set[Pool] = set()
        # The loop of the last call and its driver, as one tuple: read (and
        # replaced) in one step, so a thread switch can never pair one
        # thread's loop with another loop's driver.
        self._current: Optional[tuple[asyncio.AbstractEventLoop, _native.LoopDriver]] = None
        #: `_current` when its loop is one of asyncio's own (see `_here`).
        self._fast: Optional[tuple[asyncio.AbstractEventLoop, _native.LoopDriver]] = None

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shuts the node down: pending asks fail with ``UnavailableError``,
        its pools stop admitting and cancel what is queued, and later asks
        and tells fail at once with ``UnavailableError``. Idempotent; leaving
        ``async with`` calls it."""
        self._native.shutdown()
        for pool in list(self._pools):
            pool._release()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._native.closed

    @property
    def caller_id(self) -> str:
        """This node's id as a caller (16 hex digits, new for every node):
        pools deduplicate requests by caller id and request id."""
        return self._native.caller_id

    def _here(self, what: str) -> tuple[asyncio.AbstractEventLoop, _native.LoopDriver]:
        loop = _running_loop(what)
        current = self._current
        if current is not None and current[0] is loop:
            return current
        current = (loop, _driver(loop))
        self._current = current
        # asyncio's own loops record the thread running them: `ask` can
        # then tell that this loop is still the running one without
        # `asyncio._get_running_loop()`, which costs a getpid() system
        # call per ask on Python < 3.12.
        self._fast = current if isinstance(loop, asyncio.BaseEventLoop) else None
        return current

    def pool(
        self,
        name: str,
        *,
        concurrency: int = 1,
        max_in_flight: Optional[int] = None,
        reply_cache: Optional[int] = None,
        reply_ttl: Optional[float] = None,
    ) -> Pool:
        """A pool hosted here. ``concurrency``: handlers running at once (1).
        ``max_in_flight``: admitted, unfinished requests before
        ``BufferFullError``. ``reply_cache`` / ``reply_ttl``: bounds of the
        cache that answers duplicates (100,000 replies, 120 s); a
        ``reply_ttl`` of 0 keeps none, so a duplicate arriving after the
        reply runs the handler again."""
        _valid_names(("a pool name", name))
        return Pool(self, name, concurrency, max_in_flight, reply_cache, reply_ttl)

    def ask(
        self,
        pool: str,
        msg: Any,
        *,
        timeout: Optional[float] = None,
        preferred_worker: Optional[str] = None,
        request_id: Optional[str] = None,
        correlation_id: Optional[str] = None,
        causation_id: Optional[str] = None,
        fingerprint: Optional[int] = None,
    ) -> AskHandle:
        """Asks ``pool`` with ``msg``; await the handle for the reply (the
        handler's returned object itself).

        ``request_id`` (32 hex digits) makes a retry across a restart
        deduplicated; ``fingerprint`` (an int < 2**128, e.g. a hash of the
        payload) makes reusing that id for another payload fail with
        ``PayloadMismatchError`` instead of returning the other reply."""
        # A float or an int (not a bool, whose type is neither) needs no
        # call to check it.
        if timeout is not None and type(timeout) is not float and type(timeout) is not int:
            _check_seconds_type("timeout", timeout)
        # The common case inline: the loop of the last ask, still running in
        # this thread (a thread runs one loop at a time).
        loop: asyncio.AbstractEventLoop
        fast = self._fast
        if fast is not None and fast[0]._thread_id == _get_ident():  # type: ignore[attr-defined]
            loop, driver = fast
        else:
            loop, driver = self._here("Node.ask")
        handle = AskHandle(loop=loop)
        # `_ask_args` only for an ask that gives one of its options: a call
        # less for the common ask.
        if (
            preferred_worker is None
            and request_id is None
            and correlation_id is None
            and causation_id is None
            and fingerprint is None
        ):
            options = None
        else:
            options = _ask_args(
                preferred_worker, request_id, correlation_id, causation_id, fingerprint
            )
        handovers = _bare_handovers[0]
        handle._native = self._native.ask(driver, handle, pool, msg, timeout, options)
        handle._turn_first = _bare_handovers[0] != handovers
        return handle

    def ask_sync(
        self,
        pool: str,
        msg: Any,
        *,
        timeout: Optional[float] = None,
        preferred_worker: Optional[str] = None,
        request_id: Optional[str] = None,
        correlation_id: Optional[str] = None,
        causation_id: Optional[str] = None,
        fingerprint: Optional[int] = None,
    ) -> Any:
        """Asks from a thread without a running loop: blocks this thread (not
        others: the GIL is released) until the reply. The pool's handlers must
        run on a loop in another thread."""
        if asyncio._get_running_loop() is not None:
            from ._errors import FailedPreconditionError

            raise FailedPreconditionError(
                "ask_sync() would block the running event loop; await ask() instead"
            )
        _check_seconds_type("timeout", timeout)
        return self._native.ask_sync(
            pool,
            msg,
            timeout,
            _ask_args(preferred_worker, request_id, correlation_id, causation_id, fingerprint),
        )

    def ask_durable(
        self, pool: str, msg: Any, *, request_id: Optional[str] = None
    ) -> DurableHandle:
        """An ask whose outcome is recorded in ``self.promises``: its promise
        id (``handle.id``, also the request id) can be awaited with
        ``await_durable`` after this process restarts, without running the
        handler again. ``msg`` and the reply are pickled into the store: a
        store file is trusted input (whoever can write it can run code in
        the processes that await its durable asks, as with any pickle)."""
        _valid_names(("a pool name", pool), ("request_id", request_id))
        loop, driver = self._here("Node.ask_durable")
        handle = DurableHandle(loop=loop)
        handle._native = self._native.ask_durable(
            driver, handle, self._store(), pool, msg, request_id
        )
        handle.id = handle._native.id
        return handle

    def await_durable(self, id: str) -> DurableHandle:
        """The outcome of durable ask ``id``: at once if its promise is
        settled, else the ask is made again under the same id."""
        _valid_names(("id", id))
        loop, driver = self._here("Node.await_durable")
        handle = DurableHandle(loop=loop)
        handle._native = self._native.await_durable(driver, handle, self._store(), id)
        handle.id = handle._native.id
        return handle

    def _store(self) -> _native.NativePromises:
        if self.promises is None:
            from ._errors import FailedPreconditionError

            raise FailedPreconditionError(
                "durable asks need a promise store: Node(promises=Promises.open(path))"
            )
        return self.promises._native

    def tell(
        self,
        pool: str,
        msg: Any,
        *,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
        correlation_id: Optional[str] = None,
        causation_id: Optional[str] = None,
    ) -> asyncio.Future[str]:
        """A one-way message: the future gives its request id once the pool
        accepted it; nothing comes back after that."""
        _check_seconds_type("timeout", timeout)
        _valid_names(
            ("a pool name", pool),
            ("request_id", request_id),
            ("correlation_id", correlation_id),
            ("causation_id", causation_id),
        )
        loop, driver = self._here("Node.tell")
        target: asyncio.Future[str] = loop.create_future()
        self._native.tell(
            driver, target, pool, msg, timeout, request_id, correlation_id, causation_id
        )
        return target

    def stats(self) -> NodeStats:
        """A snapshot of the node's counters (pending asks, armed timers,
        retries, late outcomes, dead-letter queue depth and drops) and of
        each pool it hosts, by name (see ``Pool.stats``)."""
        return self._native.stats()  # type: ignore[return-value]

    def dead_letters(self) -> list[DeadLetter]:
        """Asks that failed for good (poison, or retries exhausted), oldest
        first, with their payloads."""
        return [DeadLetter(*letter) for letter in self._native.dead_letters()]

    def replay_dead_letter(self, request_id: str) -> AskHandle:
        """Takes a dead letter out and sends it again with its request id, as
        what it was: an ask's replay gives the reply (its pool may answer
        from its reply cache without running the handler), a tell's gives
        its request id once its pool accepted it, as ``tell`` does, and has
        no stages. A replay that fails puts the letter back with its new
        error. The
        replay of a durable ask's letter settles that ask's promise with its
        outcome. Raises ``FailedPreconditionError`` at once if there is no
        dead letter with that id (``InvalidArgumentError`` if ``request_id``
        is not 32 hex digits)."""
        _valid_names(("request_id", request_id))
        loop, driver = self._here("Node.replay_dead_letter")
        handle = AskHandle(loop=loop)
        handle._turn_first = False
        handle._native = self._native.replay_dead_letter(driver, handle, request_id)
        return handle

    def purge_dead_letters(self) -> int:
        """Empties the dead-letter queue; returns how many letters it held."""
        return self._native.purge_dead_letters()

