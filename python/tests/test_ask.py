"""Round trips, identity, ids, tell, stages, dedup."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator

import pytest

import askpool
from askpool import Context, Node


async def test_round_trip_passes_the_objects_themselves() -> None:
    sent = {"payload": [1, 2, 3]}
    returned = object()
    seen: list[Any] = []
    async with Node() as node:
        pool = node.pool("echo")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            seen.append(msg)
            return returned

        reply = await node.ask("echo", sent, timeout=5)
    assert seen[0] is sent
    assert reply is returned


async def test_handle_is_a_future_with_ids() -> None:
    async with Node() as node:
        pool = node.pool("ids")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return (ctx.request_id, ctx.correlation_id, ctx.pool, ctx.attempt)

        handle_ = node.ask("ids", None, timeout=5)
        assert isinstance(handle_, asyncio.Future)
        assert len(handle_.request_id) == 32
        int(handle_.request_id, 16)
        request_id, correlation_id, pool_name, attempt = await handle_
        assert request_id == handle_.request_id
        # A fresh ask correlates to itself.
        assert correlation_id == handle_.correlation_id == request_id
        assert pool_name == "ids"
        assert attempt == 1


async def test_given_ids_reach_the_handler() -> None:
    rid = "0123456789abcdef0123456789abcdef"
    cid = "fedcba9876543210fedcba9876543210"
    async with Node() as node:
        pool = node.pool("ids")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return (ctx.request_id, ctx.correlation_id, ctx.causation_id)

        got = await node.ask("ids", 1, timeout=5, request_id=rid, correlation_id=cid, causation_id=cid)
        assert got == (rid, cid, cid)


async def test_handlers_that_await_run_concurrently_up_to_the_limit() -> None:
    running = 0
    peak = 0
    async with Node() as node:
        pool = node.pool("slow", concurrency=4)

        @pool.handler
        async def handle(msg: int, ctx: Context) -> int:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1
            return msg * 2

        replies = await asyncio.gather(*(node.ask("slow", i, timeout=10) for i in range(100)))
        assert replies == [i * 2 for i in range(100)]
        assert peak == 4
        stats = node.stats()
        assert stats["pending"] == 0
        assert stats["pools"]["slow"]["handler_runs"] == 100


async def test_preferred_worker_is_accepted() -> None:
    async with Node() as node:
        pool = node.pool("p", concurrency=2)

        @pool.handler
        async def handle(msg: int, ctx: Context) -> tuple[int, str]:
            return msg + 1, ctx.worker_id

        for _ in range(5):
            assert await node.ask("p", 1, timeout=5, preferred_worker="w1") == (2, "w1")
            assert await node.ask("p", 1, timeout=5, preferred_worker="w0") == (2, "w0")
        # A worker that does not exist: any worker of the pool.
        reply, worker = await node.ask("p", 2, timeout=5, preferred_worker="no-such-worker")
        assert (reply, worker in ("w0", "w1")) == (3, True)


async def test_tell_delivers_and_returns_its_request_id() -> None:
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    async with Node() as node:
        pool = node.pool("sink")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> None:
            got.set_result((msg, ctx.request_id))

        request_id = await node.tell("sink", "fire", timeout=5)
        msg, seen_id = await asyncio.wait_for(got, 5)
        assert msg == "fire"
        assert seen_id == request_id


async def test_stages_stream_the_ack_lifecycle_with_progress() -> None:
    async with Node() as node:
        pool = node.pool("work")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> str:
            await asyncio.sleep(0)
            ctx.progress(0.5, "half")
            ctx.progress(0.6, "more")
            await asyncio.sleep(0)
            return "done"

        handle_ = node.ask("work", None, timeout=5)
        events = [e async for e in handle_.stages()]
        assert await handle_ == "done"
    stages = [e.stage for e in events]
    assert stages == ["SENT", "RECEIVED", "READ", "PARTIAL", "PARTIAL", "FULFILLED"]
    partial = events[3]
    assert partial.fraction == 0.5 and partial.note == "half"
    # The number reported, not the nearest float32 (0.6000000238418579).
    assert events[4].fraction == 0.6
    assert all(e.since_sent >= 0 for e in events)


async def test_same_request_id_runs_the_handler_once() -> None:
    runs = 0
    async with Node() as node:
        pool = node.pool("once")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            nonlocal runs
            runs += 1
            return object()

        rid = "00000000000000010000000000000001"
        first = await node.ask("once", 1, timeout=5, request_id=rid)
        second = await node.ask("once", 1, timeout=5, request_id=rid)
        assert runs == 1
        assert second is first
        assert node.stats()["pools"]["once"]["replays"] == 1


async def test_a_handler_can_ask_another_pool() -> None:
    async with Node() as node:
        inner = node.pool("inner")
        outer = node.pool("outer")

        @inner.handler
        async def double(msg: int, ctx: Context) -> int:
            return msg * 2

        @outer.handler
        async def plus_one_doubled(msg: int, ctx: Context) -> int:
            doubled: int = await node.ask("inner", msg, timeout=5)
            return doubled + 1

        assert await node.ask("outer", 20, timeout=5) == 41


def test_version_and_exports() -> None:
    for name in askpool.__all__:
        assert hasattr(askpool, name), name


async def test_stages_are_empty_when_not_tracked() -> None:
    async with Node(track_stages=False) as node:
        pool = node.pool("p")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        handle_ = node.ask("p", 1, timeout=5)
        assert [e async for e in handle_.stages()] == []
        assert await handle_ == 1


async def _identity(msg: Any, ctx: Context) -> Any:
    return msg


async def test_stages_can_be_read_once() -> None:
    async with Node() as node:
        node.pool("p").handler(_identity)
        handle_ = node.ask("p", 1, timeout=5)
        events = handle_.stages()
        # A second stream would take part of the first one's events.
        with pytest.raises(askpool.InvalidArgumentError):
            handle_.stages()
        assert [e.stage async for e in events][-1] == "FULFILLED"
        assert await handle_ == 1


async def test_stages_is_an_async_generator_that_can_be_closed_early() -> None:
    """Typed as what it is (mypy accepts ``aclose`` and ``aclosing``)."""
    async with Node() as node:
        node.pool("p").handler(_identity)
        handle_ = node.ask("p", 1, timeout=5)
        events: AsyncGenerator[askpool.StageEvent, None] = handle_.stages()
        first = await events.__anext__()
        assert first.stage == "SENT"
        await events.aclose()
        assert await handle_ == 1


async def test_a_handler_must_be_async_and_registered_once() -> None:
    async with Node() as node:
        pool = node.pool("p", concurrency=2)

        def not_async(msg: Any, ctx: Context) -> Any:
            return msg

        with pytest.raises(TypeError):
            pool.handler(not_async)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        with pytest.raises(askpool.FailedPreconditionError):
            pool.handler(handle)
        with pytest.raises(askpool.InvalidArgumentError):
            node.pool("q", concurrency=0)
        assert await node.ask("p", "x", timeout=5) == "x"
        stats = pool.stats()
        assert stats["name"] == "p"
        assert stats["admitted"] == 1
        assert stats["in_flight"] == 0


async def test_a_second_pool_with_the_same_name_is_refused() -> None:
    async with Node() as node:
        first = node.pool("dup")
        second = node.pool("dup")

        @first.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        with pytest.raises(askpool.InvalidArgumentError):
            second.handler(handle)


async def test_progress_out_of_range_is_clamped_even_past_a_float32() -> None:
    # The fraction is clamped to [0, 1]; a finite float too large for the
    # core's float32 is clamped too, not refused as "not finite". NaN, the
    # infinities and a note past a report's bound are refused.
    async with Node() as node:
        refused: list[float] = []

        @node.pool("work").handler
        async def handle(msg: Any, ctx: Context) -> None:
            await asyncio.sleep(0)
            # Progress only moves forward: a rising series.
            for fraction in (-1e300, 0.5, 1e300):
                ctx.progress(fraction, "n")
            for bad in (float("nan"), float("inf")):
                with pytest.raises(askpool.InvalidArgumentError):
                    ctx.progress(bad)
                refused.append(bad)
            # A note past a report's bound (4096 UTF-8 bytes: 2 per "é").
            with pytest.raises(askpool.InvalidArgumentError, match="4098 bytes"):
                ctx.progress(1.0, "é" * 2049)
            refused.append(1.0)
            ctx.progress(1.0, "é" * 2048)
            await asyncio.sleep(0)

        handle_ = node.ask("work", None, timeout=5)
        events = [e async for e in handle_.stages()]
        await handle_
    partial = [(e.fraction, len(e.note or "")) for e in events if e.stage == "PARTIAL"]
    assert partial == [(0.0, 1), (0.5, 1), (1.0, 1), (1.0, 2048)]
    assert len(refused) == 3


class _CallableHandler:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, msg: Any, ctx: Context) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        return msg


async def test_an_object_with_an_async_call_is_a_handler() -> None:
    async with Node() as node:
        handler = _CallableHandler()
        assert node.pool("obj").handler(handler) is handler
        payload = object()
        assert await node.ask("obj", payload, timeout=5) is payload
        assert handler.calls == 1
        with pytest.raises(TypeError):
            node.pool("lambda").handler(lambda msg, ctx: handler(msg, ctx))
