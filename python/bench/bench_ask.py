"""The `python` bench suite (`cargo xtask bench python [--quick]`).

askpool's ask against a pure-asyncio ask (a Queue to a worker task and a
Future back, no protocol at all), in one process, interleaved trial by trial
(A B, B A, ...), reported as the median of per-trial ratios in the
askpool-benchkit JSON schema.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import askpool
from askpool import Context, Node

ISSUE = 6


async def echo(msg: Any, ctx: Optional[Context]) -> Any:
    return msg


class PureAsyncio:
    """The baseline: a Queue to one worker task, a Future back."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.worker = asyncio.ensure_future(self._work())

    async def _work(self) -> None:
        while True:
            msg, fut = await self.queue.get()
            fut.set_result(await echo(msg, None))

    def ask(self, msg: Any) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.queue.put_nowait((msg, fut))
        return fut

    def close(self) -> None:
        self.worker.cancel()


Run = Callable[[int], Awaitable[None]]


def round_trip(ask: Callable[[Any], Awaitable[Any]]) -> Run:
    async def run(n: int) -> None:
        for i in range(n):
            if await ask(i) != i:
                raise AssertionError("wrong reply")

    return run


def in_flight(ask: Callable[[Any], Awaitable[Any]], width: int) -> Run:
    async def run(n: int) -> None:
        for _ in range(max(1, n // width)):
            replies = await asyncio.gather(*(ask(i) for i in range(width)))
            if len(replies) != width:
                raise AssertionError("lost replies")

    return run


async def timed(run: Run, n: int, ops: int) -> float:
    gc.collect()
    start = time.perf_counter_ns()
    await run(n)
    return (time.perf_counter_ns() - start) / ops


def comparison(
    workload: str, ours_name: str, ours: list[float], base_name: str, base: list[float], note: Optional[str]
) -> dict[str, Any]:
    ratios = [a / b for a, b in zip(ours, base)]
    return {
        "workload": workload,
        "askpool": ours_name,
        "askpool_ns": statistics.median(ours),
        "baseline": base_name,
        "baseline_ns": statistics.median(base),
        "ratio": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "trials": len(ratios),
        "unit": "time",
        "target": {"op": "<=", "value": 1.0, "issue": ISSUE},
        "floor": None,
        "note": note,
    }


async def interleaved(
    trials: int, ours: Run, base: Run, n: int, ops: int
) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    await ours(max(1, n // 10))  # warm-up
    await base(max(1, n // 10))
    for t in range(trials):
        if t % 2 == 0:
            a.append(await timed(ours, n, ops))
            b.append(await timed(base, n, ops))
        else:
            b.append(await timed(base, n, ops))
            a.append(await timed(ours, n, ops))
    return a, b


async def main(quick: bool, out: Optional[Path]) -> None:
    trials = 7 if quick else 9
    rt_n = 5_000 if quick else 20_000
    width = 1_000
    fl_n = 20_000 if quick else 100_000
    base = PureAsyncio()
    results: list[dict[str, Any]] = []
    async with Node() as node:
        pool = node.pool("echo", concurrency=1)
        pool.handler(echo)

        def ours_ask(msg: Any) -> Awaitable[Any]:
            return node.ask("echo", msg, timeout=30)

        a, b = await interleaved(trials, round_trip(ours_ask), round_trip(base.ask), rt_n, rt_n)
        results.append(
            comparison(
                "python: ask round trip (one at a time)",
                "await node.ask()",
                a,
                "asyncio Queue + Future",
                b,
                None,
            )
        )
        a, b = await interleaved(
            trials, in_flight(ours_ask, width), in_flight(base.ask, width), fl_n, fl_n
        )
        results.append(
            comparison(
                "python: 1,000 asks in flight (gather)",
                "gather(node.ask() x1000)",
                a,
                "gather(asyncio Queue + Future x1000)",
                b,
                NOTE_IN_FLIGHT,
            )
        )
        assert node.stats()["pending"] == 0
    base.close()
    suite = {
        "suite": "python",
        "quick": quick,
        "comparisons": results,
        "floors": [],
        "facts": [
            ["python", sys.version.split()[0]],
            ["platform", platform.platform()],
            ["askpool package", str(Path(askpool.__file__).parent)],
            ["round trip asks per trial", str(rt_n)],
            ["in-flight asks per trial", str(fl_n)],
        ],
    }
    for c in results:
        verdict = "met" if c["ratio"] <= 1.0 else "MISSED"
        print(
            f"RATIO {c['workload']:<48} {c['ratio']:>6.2f}x ({c['min']:.2f}..{c['max']:.2f}, "
            f"{c['trials']} trials) {c['askpool_ns']:.0f} ns vs {c['baseline_ns']:.0f} ns  "
            f"target <= 1.0 (issue {ISSUE}): {verdict}"
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(suite, indent=2))
        print(f"results written to {out}")


#: Where the time goes in the in-flight workload (perf, 2 cores at load 8-10,
#: 2026-11-23, reply cache at its 100,000 cap as in most of a run), CPU per
#: ask, measured in one process against the baseline's ~5 us:
#: - a Future that is already done, gathered: 0.77x of the baseline, and with
#:   `Node.ask`'s Python wrapper 0.87x. Both sides pay this; it leaves the
#:   extension about 0.13x (~0.7 us) for the whole ask;
#: - the extension takes ~1.8x: core protocol (admission, ACK tracker and
#:   stages, clock reads, breaker, routing, channels, their allocations) ~24%
#:   of askpool's CPU, the dedup reply cache ~12% (its eviction walk at the
#:   cap; ~6% below it), binding glue ~19% (pyo3 arguments, FutureTask, the
#:   worker slot, set_result, freeing the ask), handler coroutine ~3%.
#: Starting the asks of one loop tick in a batch (one flush per tick instead
#: of running each at once) measured slower (3.1-3.4x against 2.7-3.0x), the
#: 1,000 asks' state no longer fitting the caches.
NOTE_IN_FLIGHT: Optional[str] = (
    "missed: a done Future gathered costs 0.77x of the baseline (0.87x with the "
    "Node.ask wrapper), leaving ~0.13x (~0.7 us) for the extension, which takes "
    "~1.8x: core protocol ~24% of askpool's CPU, dedup reply cache ~12% (eviction "
    "at the 100k cap), binding glue ~19%, handler coroutine ~3%; batching the "
    "asks of a tick measured slower"
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.out))
