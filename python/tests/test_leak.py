"""100,000 asks with timeouts and cancels: nothing stays behind."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import askpool
from askpool import AskHandle, Context, Node

TOTAL = 100_000
BATCH = 1_000


def rss_bytes() -> int:
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
        quick = node.pool("quick", concurrency=8)
        hang = node.pool("hang", concurrency=BATCH)

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
        assert not [o for o in gc.get_objects() if isinstance(o, AskHandle)]
        handler_tasks = [
            t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "_finish"
        ]
        assert handler_tasks == []
        growth = rss_bytes() - warm
        # Bounded caches (reply cache, timeout records, DLQ) may still fill
        # after warm-up; unbounded growth would be ~1 KiB per ask (~90 MiB).
        assert growth < 48 * 1024 * 1024, f"RSS grew {growth / 2**20:.1f} MiB"


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
