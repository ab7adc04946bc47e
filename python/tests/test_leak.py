"""100,000 asks with timeouts and cancels: nothing stays behind."""

from __future__ import annotations

import asyncio
import ctypes
import contextlib
import contextvars
import gc
import os
import sys
import time
import weakref
from typing import Any

import askpool
from askpool import AskHandle, Context, Node, _dispatch, _native

TOTAL = 100_000
BATCH = 1_000


def rss_bytes() -> int:
    """Resident memory, after the allocators gave back what they hold free:
    glibc keeps freed blocks in its arenas, and the extension's mimalloc
    its freed pages (how much depends on what ran before in the process),
    which is no memory held by the program."""
    _native._release_freed_memory()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass  # not glibc: the figure includes what the allocator keeps
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _batch(node: Node, start: int) -> dict[str, int]:
    """One batch: a third answered, a third timed out while the handler
    waits for its cancel, a third cancelled by the caller."""
    handles = []
    for i in range(start, start + BATCH):
        kind = i % 3
        if kind == 0:
            handles.append(node.ask("quick", i, timeout=5))
        elif kind == 1:
            handles.append(node.ask("hang", i, timeout=0.002))
        else:
            handles.append(node.ask("hang", i, timeout=5))
    await asyncio.sleep(0)
    for i, h in enumerate(handles):
        if (start + i) % 3 == 2:
            h.cancel()
    results = await asyncio.gather(*handles, return_exceptions=True)
    counts = {"ok": 0, "timeout": 0, "cancelled": 0}
    for r in results:
        if isinstance(r, askpool.AskTimeoutError):
            counts["timeout"] += 1
        elif isinstance(r, asyncio.CancelledError):
            counts["cancelled"] += 1
        elif isinstance(r, int):
            counts["ok"] += 1
        else:
            raise AssertionError(f"unexpected outcome {r!r}")
    return counts


async def test_100k_asks_with_timeouts_and_cancels_leave_nothing_behind() -> None:
    # Breakers off: the timeouts here are on purpose.
    async with Node(dlq_capacity=64, circuit_breaker=False) as node:
        # Small reply caches: the test crosses their bounds many times over.
        quick = node.pool("quick", concurrency=8, reply_cache=2_000)
        hang = node.pool("hang", concurrency=BATCH, reply_cache=2_000)

        @quick.handler
        async def answer(msg: int, ctx: Context) -> int:
            return msg

        @hang.handler
        async def wait_for_cancel(msg: int, ctx: Context) -> None:
            await ctx.wait_cancelled()

        totals = {"ok": 0, "timeout": 0, "cancelled": 0}
        warm = 0
        for start in range(0, TOTAL, BATCH):
            for k, v in (await _batch(node, start)).items():
                totals[k] += v
            if start == 10 * BATCH:
                gc.collect()
                warm = rss_bytes()
        assert sum(totals.values()) == TOTAL
        assert totals["ok"] == TOTAL // 3 + 1
        # A few "hang" asks may be timed out before their cancel lands; none
        # may be lost.
        assert totals["timeout"] >= TOTAL // 3 - 10
        assert totals["cancelled"] >= TOTAL // 3 - 10

        # Let the last cancels reach their handlers.
        for _ in range(200):
            stats = node.stats()
            if stats["pools"]["hang"]["in_flight"] == 0:
                break
            await asyncio.sleep(0.01)
        # asyncio keeps the last gathered futures until its next iteration.
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        stats = node.stats()
        assert stats["pending"] == 0
        assert stats["armed_timers"] == 0
        for name in ("quick", "hang"):
            pool = stats["pools"][name]
            assert pool["in_flight"] == 0, pool
            assert pool["queued"] == 0, pool
            assert pool["dedup_in_progress"] == 0, pool
            assert pool["dedup_terminal"] <= 2_000, pool
        assert not [o for o in gc.get_objects() if isinstance(o, AskHandle)]
        # No task is left queued on the loop's driver.
        assert node._current is not None and node._current[1].queued() == 0
        # No slot is still running a request (each would hold its reply).
        loop = asyncio.get_running_loop()
        assert [s for s in _dispatch._running if s._loop is loop] == []
        growth = rss_bytes() - warm
        print(f"RSS growth after warm-up: {growth / 2**20:.1f} MiB")
        # The reply caches and the DLQ are full by the warm-up mark; the
        # timed-out asks kept for late reconciliation (10,000 at most) fill
        # after it. Anything kept per ask would be ~1 KiB x 90,000 (~90 MiB).
        assert growth < 24 * 1024 * 1024, f"RSS grew {growth / 2**20:.1f} MiB"
        assert stats["timed_out_records"] <= 10_000


async def test_closing_a_pool_stops_its_workers() -> None:
    async with Node() as node:
        pool = node.pool("short", concurrency=3)

        @pool.handler
        async def answer(msg: Any, ctx: Context) -> Any:
            return msg

        assert await node.ask("short", 1, timeout=5) == 1
        pool.close()
        try:
            await node.ask("short", 1, timeout=1)
        except askpool.NoRouteError:
            pass
        else:
            raise AssertionError("a closed pool still answered")


async def test_wait_cancelled_futures_are_released_once_the_handler_answers() -> None:
    # The usual race of work against the cancel: `asyncio.wait` of both, the
    # loser cancelled or just dropped. Nothing of a request whose handler
    # answered may stay behind waiting for a cancel that cannot come any more.
    futures: list[weakref.ref[asyncio.Future[None]]] = []
    async with Node() as node:
        pool = node.pool("race", concurrency=4)

        @pool.handler
        async def race(msg: int, ctx: Context) -> int:
            cancel = ctx.wait_cancelled()
            futures.append(weakref.ref(cancel))
            work = asyncio.ensure_future(asyncio.sleep(0))
            _, pending = await asyncio.wait({work, cancel}, return_when=asyncio.FIRST_COMPLETED)
            if msg % 2:
                for p in pending:
                    p.cancel()
            return msg

        @node.pool("sync").handler
        async def no_await(msg: int, ctx: Context) -> int:
            futures.append(weakref.ref(ctx.wait_cancelled()))
            return msg

        for i in range(200):
            assert await node.ask("race", i, timeout=5) == i
            assert await node.ask("sync", i, timeout=5) == i
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()
        assert len(futures) == 400
        alive = [f for f in futures if f() is not None]
        assert alive == [], f"{len(alive)} wait_cancelled() futures still held"
        assert node._current is not None and node._current[1].queued() == 0


async def test_a_cancelled_wait_cancelled_future_is_released_while_its_handler_runs() -> None:
    # A long handler that checks for a cancel now and then with a timeout:
    # each timed-out wait is let go at once, not kept until the handler ends.
    futures: list[weakref.ref[asyncio.Future[None]]] = []
    checked = asyncio.Event()
    release = asyncio.Event()
    async with Node() as node:

        @node.pool("long").handler
        async def long(msg: int, ctx: Context) -> int:
            for _ in range(50):
                cancel = ctx.wait_cancelled()
                futures.append(weakref.ref(cancel))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(cancel, 0.0001)
                del cancel
            checked.set()
            await release.wait()
            return msg

        ask = node.ask("long", 1, timeout=10)
        await asyncio.wait_for(checked.wait(), 5)
        gc.collect()
        alive = [f for f in futures if f() is not None]
        assert alive == [], f"{len(alive)} timed-out wait_cancelled() futures still held"
        release.set()
        assert await ask == 1


async def test_what_a_handler_first_awaited_is_let_go_while_it_runs() -> None:
    # The first step of a handler runs inline; what it awaited (here a
    # future with a large result) is the slot's to hand back to it, and must
    # not stay alive for as long as the handler goes on after it.
    loop = asyncio.get_running_loop()
    first: asyncio.Future[bytes] = loop.create_future()
    held = weakref.ref(first)
    awaited = [first]
    del first
    checked = asyncio.Event()
    release = asyncio.Event()
    async with Node() as node:

        @node.pool("long").handler
        async def long(msg: int, ctx: Context) -> int:
            future = awaited.pop()
            assert len(await future) == 1 << 20
            del future
            checked.set()
            await release.wait()
            return msg

        ask = node.ask("long", 1, timeout=10)
        await asyncio.sleep(0)
        future = held()
        assert future is not None and not future.done()
        future.set_result(bytes(1 << 20))
        del future
        await asyncio.wait_for(checked.wait(), 5)
        gc.collect()
        assert held() is None, "the future the handler first awaited is still held"
        release.set()
        assert await ask == 1


def test_asks_a_finished_asyncio_run_left_in_flight_leave_nothing_behind() -> None:
    """A caller loop that ends (``asyncio.run`` returns) with asks, tells and
    stage streams still in flight to a pool on another loop: nobody can
    await them any more, so they are cancelled with the loop, and the
    node's pending count returns to 0 (no ask waits for a loop that will
    never poll it again), with nothing reported."""
    import sys
    import threading

    unraisable: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    node = Node(circuit_breaker=False)
    ready = threading.Event()
    stop = threading.Event()
    release = threading.Event()

    def host() -> None:
        async def main() -> None:
            pool = node.pool("far", concurrency=64)

            @pool.handler
            async def handle(msg: Any, ctx: Context) -> Any:
                while not release.is_set() and not ctx.cancelled:
                    await asyncio.sleep(0.001)
                return msg

            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.001)

        asyncio.run(main())

    thread = threading.Thread(target=host)
    thread.start()
    try:
        assert ready.wait(10)
        kept: list[AskHandle] = []

        async def caller() -> None:
            kept.extend(node.ask("far", i, timeout=30) for i in range(20))

            async def read(handle: AskHandle) -> None:
                async for _ in handle.stages():
                    pass

            # Stage streams read by tasks: asyncio.run cancels those.
            for handle in kept[:5]:
                asyncio.get_running_loop().create_task(read(handle))
            await asyncio.sleep(0.05)
            assert node.stats()["pending"] == 20

        asyncio.run(caller())
        release.set()
        for _ in range(500):
            if node.stats()["pending"] == 0:
                break
            time.sleep(0.01)
        assert node.stats()["pending"] == 0
        assert node.stats()["armed_timers"] == 0
        assert all(h.cancelled() for h in kept)
        gc.collect()
        assert unraisable == []
    finally:
        sys.unraisablehook = hook
        stop.set()
        thread.join()
        node.close()


async def test_pools_closed_on_a_running_loop_are_let_go() -> None:
    # Each pool's loop held it (its closer and its keeper task) until the
    # loop ended, and through it its node and reply cache (about 1 MiB):
    # a service making and closing nodes or pools on one long-lived loop
    # grew without bound.
    loop = asyncio.get_running_loop()
    tasks_before = len(asyncio.all_tasks())
    natives: list[Any] = []

    async def handler(msg: int, ctx: Context) -> int:
        return msg

    rss_before = 0
    live_before = _native._live_pools()
    for i in range(400):
        if i == 100:
            gc.collect()
            rss_before = rss_bytes()
        async with Node() as node:
            node.pool("p").handler(handler)
            assert await node.ask("p", i, timeout=5) == i
        other = Node()
        pool = other.pool("q", reply_cache=16)
        pool.handler(handler)
        assert pool._native is not None
        natives.append(pool._native)
        pool.close()
        other.close()
        del pool
    for _ in range(3):  # the last keepers' cancels run
        await asyncio.sleep(0)
    gc.collect()
    closer = askpool._node._closers[loop]()
    assert closer is not None
    assert len(closer.pools) == 0, len(closer.pools)
    left = [t.get_name() for t in asyncio.all_tasks()]
    assert len(left) <= tasks_before, left
    # Nothing but this list holds them: each counts as many references as
    # a fresh object held the same way (5 while the loop held them too).
    fresh = [object()]
    alone = {sys.getrefcount(held) for held in fresh}
    assert len(alone) == 1
    assert {sys.getrefcount(native) for native in natives} == alone
    natives.clear()
    # Every pool is gone in the core too (their workers end on the runtime's
    # threads, a moment after the close).
    for _ in range(200):
        if _native._live_pools() <= live_before:
            break
        await asyncio.sleep(0.01)
    assert _native._live_pools() <= live_before, (_native._live_pools(), live_before)
    # 300 nodes with default reply caches held about 300 MiB before. RSS
    # swings by about 150 MiB with the reply caches the runtime has yet to
    # free (the dedup table retires memory in batches): a coarse bound.
    growth = rss_bytes() - rss_before
    print(f"RSS growth: {growth / 2**20:.1f} MiB")
    assert growth < 200 * 2**20, f"{growth / 2**20:.1f} MiB"


def test_pools_whose_loops_ended_are_let_go_by_a_long_lived_node() -> None:
    # The usual end of a pool: its loop shuts down. A node that outlives
    # many loops must not keep their pools (and their reply caches).
    node = Node()

    async def once(i: int) -> None:
        pool = node.pool("p")

        @pool.handler
        async def echo(msg: int, ctx: Context) -> int:
            return msg

        assert await node.ask("p", i, timeout=5) == i

    for i in range(50):
        asyncio.run(once(i))
    gc.collect()
    assert len(node._pools) == 0
    node.close()


async def test_an_idle_slot_holds_nothing_of_its_last_request() -> None:
    # Before: while waiting for its next request, a slot's task kept the
    # last one's job in its locals: the future its handler first awaited
    # (with its result) and its context (its variables' values).
    variable: contextvars.ContextVar[object] = contextvars.ContextVar("variable")

    class Big:
        pass

    refs: dict[str, weakref.ref[Big]] = {}
    async with Node() as node:
        pool = node.pool("p", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            loop = asyncio.get_running_loop()
            awaited: asyncio.Future[Big] = loop.create_future()
            result, value = Big(), Big()
            refs["result"], refs["variable"] = weakref.ref(result), weakref.ref(value)
            variable.set(value)
            loop.call_soon(awaited.set_result, result)
            del result, value
            await awaited
            return "done"

        assert await node.ask("p", 1, timeout=5) == "done"
        await asyncio.sleep(0.05)
        gc.collect()
        assert {name: ref() is None for name, ref in refs.items()} == {
            "result": True,
            "variable": True,
        }


class _Reply:
    """A reply whose copies are counted: alive while anything holds it."""

    alive = 0

    def __init__(self) -> None:
        _Reply.alive += 1

    def __del__(self) -> None:
        _Reply.alive -= 1


async def test_replies_past_their_ttl_are_let_go_while_the_pool_is_idle() -> None:
    # The reply cache applied its TTL only on the pool's next request, and
    # an object the core let go of on the runtime's thread waited for the
    # next run of a loop's driver: 3,000 100 kB replies stayed alive 5 s
    # past a 0.5 s TTL in a review's run.
    _Reply.alive = 0
    async with Node() as node:
        pool = node.pool("ttl", reply_ttl=0.1)

        @pool.handler
        async def answer(msg: int, ctx: Context) -> _Reply:
            return _Reply()

        for i in range(50):
            del_me = await node.ask("ttl", i, timeout=5)
            del del_me
        gc.collect()
        assert _Reply.alive == 50, "the cache holds the replies"
        deadline = time.monotonic() + 20
        while _Reply.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            gc.collect()
        assert _Reply.alive == 0
        assert pool.stats()["dedup_terminal"] == 0


def test_payloads_a_node_cancels_as_it_closes_are_let_go_at_once() -> None:
    # A close cancels what its pools hold, and the payloads went to the
    # graveyard of dropped objects, emptied only by a loop's driver: with
    # no ask after the close, they stayed (5,000 in a review's run).
    _Reply.alive = 0

    async def main() -> None:
        node = Node(dlq_capacity=0, circuit_breaker=False)
        pool = node.pool("stuck", concurrency=1)

        @pool.handler
        async def wait(msg: _Reply, ctx: Context) -> None:
            await asyncio.sleep(3600)

        for _ in range(20):
            with contextlib.suppress(askpool.AskTimeoutError):
                await node.ask("stuck", _Reply(), timeout=0.01)
        node.close()
        gc.collect()
        # The one its handler still runs with stays until the loop ends.
        assert _Reply.alive <= 1, f"{_Reply.alive} payloads alive after the close"

    asyncio.run(main())
