"""The per-ask shortcuts keep the semantics: the loop check without
`_get_running_loop`, the cached pool name, the optional-argument tuple, and a
handler's first step run inline, as its slot's task."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import askpool
from askpool import Context, Node


def _echo_pool(node: Node, name: str) -> None:
    @node.pool(name).handler
    async def handle(msg: Any, ctx: Context) -> Any:
        return msg


async def test_values_that_stop_iteration_would_wrap_come_back_themselves(send_path: str) -> None:
    # A coroutine's return value travels in `StopIteration.args`; a tuple or
    # an exception instance there is the special case.
    values: list[Any] = [(1, 2), (), ValueError("returned, not raised"), None, StopIteration(3)]
    async with Node() as node:
        pool = node.pool("values")

        @pool.handler
        async def handle(msg: int, ctx: Context) -> Any:
            return values[msg]

        for i, value in enumerate(values):
            assert (await node.ask("values", i, timeout=5)) is value


async def test_a_handler_raising_before_and_after_awaiting(send_path: str) -> None:
    async with Node() as node:
        pool = node.pool("raises")

        @pool.handler
        async def handle(msg: bool, ctx: Context) -> None:
            if msg:
                await asyncio.sleep(0)
            raise KeyError("nope")

        for awaits in (False, True):
            with pytest.raises(askpool.HandlerError) as info:
                await node.ask("raises", awaits, timeout=5)
            assert info.value.type_name == "KeyError"


async def test_asks_alternating_between_pools_reach_each() -> None:
    async with Node() as node:
        for name in ("a", "b"):
            pool = node.pool(name)

            @pool.handler
            async def handle(msg: int, ctx: Context) -> tuple[str, int]:
                return (ctx.pool, msg)

        # Equal names made as distinct str objects, and interned ones.
        names = ["a", "b", "".join(["a"]), "".join(["b"])]
        got = await asyncio.gather(*(node.ask(names[i % 4], i, timeout=5) for i in range(40)))
        assert got == [("ab"[i % 2], i) for i in range(40)]
        with pytest.raises(askpool.NoRouteError):
            await node.ask("c", 0, timeout=5)
        assert await node.ask("a", 1, timeout=5) == ("a", 1)


def test_one_node_on_loops_one_after_the_other() -> None:
    node = Node()

    async def host_and_ask(offset: int) -> list[int]:
        pool = node.pool(f"p{offset}")

        @pool.handler
        async def handle(msg: int, ctx: Context) -> int:
            return msg + offset

        return list(await asyncio.gather(*(node.ask(f"p{offset}", i, timeout=5) for i in range(10))))

    try:
        assert asyncio.run(host_and_ask(100)) == [i + 100 for i in range(10)]
        # The first loop has stopped: its cached driver must not be used.
        assert asyncio.run(host_and_ask(200)) == [i + 200 for i in range(10)]
    finally:
        node.close()


async def test_a_thread_without_a_loop_is_refused_after_asks_on_a_loop() -> None:
    async with Node() as node:
        _echo_pool(node, "p")
        assert await node.ask("p", 1, timeout=5) == 1
        errors: list[BaseException] = []

        def no_loop() -> None:
            try:
                node.ask("p", 2, timeout=5)
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                errors.append(e)

        thread = threading.Thread(target=no_loop)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], askpool.NoRunningLoopError)


async def test_rare_options_are_all_passed() -> None:
    request_id = "0123456789abcdef0123456789abcdef"
    correlation_id = "fedcba9876543210fedcba9876543210"
    causation_id = "00112233445566778899aabbccddeeff"
    async with Node() as node:
        pool = node.pool("opts")

        @pool.handler
        async def handle(msg: int, ctx: Context) -> tuple[str, str, Any]:
            return (ctx.request_id, ctx.correlation_id, ctx.causation_id)

        got = await node.ask(
            "opts",
            1,
            timeout=5,
            preferred_worker="w0",
            request_id=request_id,
            correlation_id=correlation_id,
            causation_id=causation_id,
            fingerprint=7,
        )
        assert got == (request_id, correlation_id, causation_id)
        with pytest.raises(askpool.InvalidArgumentError):
            node.ask("opts", 1, causation_id="not hex")


class _RecordingFuture(asyncio.Future[Any]):
    results: list[Any] = []

    def set_result(self, result: Any) -> None:
        _RecordingFuture.results.append(result)
        super().set_result(result)


class _RecordingLoop(asyncio.SelectorEventLoop):
    def create_future(self) -> asyncio.Future[Any]:
        return _RecordingFuture(loop=self)


def test_a_loop_future_that_overrides_set_result_is_called_through_it() -> None:
    # The extension completes plain futures through asyncio.Future's own
    # method; one whose class overrides it must still see the call.
    async def main() -> str:
        async with Node() as node:
            _echo_pool(node, "p")
            assert await node.ask("p", 1, timeout=5) == 1
            return await node.tell("p", 2, timeout=5)

    loop = _RecordingLoop()
    try:
        request_id = loop.run_until_complete(main())
    finally:
        loop.close()
    assert _RecordingFuture.results == [request_id]
