"""The wrapper's own scheduling of a handler's step after a bare `yield` and
of its caller's wake-up at that turn (`_native._soon`): straight onto an
asyncio loop's ready queue, as `call_soon` would put it there; through
`call_soon` on a loop in debug mode or one that schedules its own way."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import time
import weakref
from typing import Any, Optional

import pytest

from askpool import Context, Node, _native

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


async def _awaits_once(msg: Any, ctx: Optional[Context]) -> Any:
    await asyncio.sleep(0)
    return msg


async def _queued_after_an_ask(node: Node) -> list[Any]:
    """What an ask whose handler awaits once left on the loop's ready queue
    (its handler's next step), and that the ask is answered."""
    loop = asyncio.get_running_loop()
    node.pool("p").handler(_awaits_once)
    assert await node.ask("p", 0, timeout=10) == 0
    handle = node.ask("p", 1, timeout=10)
    queued = list(loop._ready)  # type: ignore[attr-defined]
    assert await handle == 1
    return queued


async def test_an_asyncio_loop_gets_the_handlers_next_step_on_its_ready_queue() -> None:
    async with Node() as node:
        queued = await _queued_after_an_ask(node)
    assert any(isinstance(h, _native.Soon) for h in queued), queued


async def test_a_loop_in_debug_mode_gets_call_soon() -> None:
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    try:
        async with Node() as node:
            queued = await _queued_after_an_ask(node)
    finally:
        loop.set_debug(False)
    assert not any(isinstance(h, _native.Soon) for h in queued), queued
    assert any(isinstance(h, asyncio.Handle) for h in queued), queued


async def test_a_handle_queued_before_debug_mode_was_turned_on_runs_in_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Debug mode names each slow callback (here every one) by its handle's
    # `_callback`.
    loop = asyncio.get_running_loop()
    ran: list[Any] = []
    slow = loop.slow_callback_duration
    _native._soon(loop, ran.append, "ran", None)
    loop.set_debug(True)
    loop.slow_callback_duration = 0.0
    try:
        with caplog.at_level("WARNING", logger="asyncio"):
            await asyncio.sleep(0)
    finally:
        loop.set_debug(False)
        loop.slow_callback_duration = slow
    assert ran == ["ran"]
    assert any("Executing <askpool Soon" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


async def test_debug_mode_turned_on_with_a_handle_queued_reports_errors_as_usual(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The default exception handler reads the running handle's
    # `_source_traceback` in debug mode.
    loop = asyncio.get_running_loop()

    def report(_: Any) -> None:
        loop.call_exception_handler({"message": "reported by a callback"})

    _native._soon(loop, report, None, None)
    loop.set_debug(True)
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            await asyncio.sleep(0)
    finally:
        loop.set_debug(False)
    messages = [r.getMessage() for r in caplog.records]
    assert "reported by a callback" in messages, messages
    assert not any("Exception in default exception handler" in m for m in messages), messages


async def test_a_tool_that_wraps_handle_run_sees_the_handlers_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As slow-callback monitors do (aiodebug, Logfire): `asyncio.Handle._run`
    # replaced, every callback goes through `call_soon`'s handles.
    seen: list[str] = []
    run = asyncio.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        started = time.perf_counter()
        run(handle)
        if time.perf_counter() - started > 0.05:
            seen.append(repr(handle))

    async def slow_step(msg: Any, ctx: Optional[Context]) -> Any:
        await asyncio.sleep(0)
        if msg:
            time.sleep(0.1)
        return msg

    monkeypatch.setattr(asyncio.Handle, "_run", timed)
    async with Node() as node:
        node.pool("p").handler(slow_step)
        # (The slot's first request goes on in its new task's first step.)
        assert await node.ask("p", 0, timeout=10) == 0
        assert await node.ask("p", 1, timeout=10) == 1
    assert any("Slot._step" in h for h in seen), seen


def test_a_loop_dropped_unclosed_with_a_handle_queued_is_collected() -> None:
    loop = asyncio.new_event_loop()

    def queue_then_stop() -> None:
        _native._soon(loop, lambda _: None, loop, None)
        loop.stop()

    loop.call_soon(queue_then_stop)
    loop.run_forever()
    assert any(isinstance(h, _native.Soon) for h in loop._ready)  # type: ignore[attr-defined]
    dropped = weakref.ref(loop)
    del loop
    with pytest.warns(ResourceWarning):
        gc.collect()
    assert dropped() is None


def test_loop_classes_are_not_kept_alive() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        _native._soon(loop, lambda _: None, None, None)
        await asyncio.sleep(0)

    kept: list[weakref.ref[type]] = []
    for n in range(20):
        kind = type(f"Loop{n}", (asyncio.SelectorEventLoop,), {})
        loop = kind()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
        kept.append(weakref.ref(kind))
        del kind, loop
    gc.collect()
    # (The last class met is remembered, for the next call.)
    assert sum(k() is not None for k in kept) <= 1


class _CountingLoop(asyncio.SelectorEventLoop):
    """A loop that schedules its own way: every callback through its
    `call_soon`."""

    scheduled = 0

    def call_soon(  # type: ignore[override]
        self, callback: Any, *args: Any, context: Optional[contextvars.Context] = None
    ) -> asyncio.Handle:
        self.scheduled += 1
        return super().call_soon(callback, *args, context=context)


def test_a_loop_whose_call_soon_is_its_own_gets_every_callback_through_it() -> None:
    loop = _CountingLoop()

    async def main() -> list[Any]:
        async with Node() as node:
            return await _queued_after_an_ask(node)

    try:
        queued = loop.run_until_complete(main())
    finally:
        loop.close()
    assert not any(isinstance(h, _native.Soon) for h in queued), queued
    assert loop.scheduled >= 2


async def test_a_callback_runs_in_its_context_and_its_exception_goes_to_the_handler() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    ran: list[str] = []

    def fails(arg: str) -> None:
        ran.append(f"{arg} {_var.get()}")
        raise ValueError("in a callback")

    context = contextvars.copy_context()
    context.run(_var.set, "its own")
    try:
        _native._soon(loop, fails, "ran in", context)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert ran == ["ran in its own"]
    assert _var.get() == "unset"
    [report] = reported
    assert report["message"].startswith("Exception in callback")
    assert isinstance(report["exception"], ValueError)
    assert isinstance(report["handle"], _native.Soon)


@pytest.mark.parametrize("leaves", [SystemExit, KeyboardInterrupt])
def test_system_exit_and_keyboard_interrupt_in_a_callback_leave_the_loop(
    leaves: type[BaseException],
) -> None:
    loop = asyncio.new_event_loop()

    def stop(_: Any) -> None:
        raise leaves()

    async def main() -> None:
        _native._soon(loop, stop, None, None)
        await asyncio.sleep(1)

    try:
        with pytest.raises(leaves):
            loop.run_until_complete(main())
    finally:
        loop.close()
