"""Every error class of the taxonomy, raised the Python way."""

from __future__ import annotations

import asyncio
import copy
import enum
import gc
import os
import pickle
import threading
import time
from typing import Any, Awaitable, Callable, Optional

import pytest

import askpool
from askpool import Context, Node, _dispatch, _native
from askpool._errors import ERRORS, from_native

BUILTIN = {
    "UNAVAILABLE": ConnectionError,
    "DEADLINE_EXCEEDED": TimeoutError,
    "ASK_TIMEOUT": TimeoutError,
    "BUFFER_FULL": RuntimeError,
    "NO_ROUTE": LookupError,
    "INVALID_ARGUMENT": ValueError,
    "VALIDATION_ERROR": ValueError,
    "PAYLOAD_MISMATCH": ValueError,
    "PERMISSION_DENIED": PermissionError,
    "OVERSIZE_PAYLOAD": ValueError,
    "FAILED_PRECONDITION": RuntimeError,
    "DECODE_FAILURE": ValueError,
    "INTERNAL": RuntimeError,
    "ASK_CANCELLED": RuntimeError,
    "HANDLER_FAILED": RuntimeError,
}


@pytest.mark.parametrize("code", sorted(BUILTIN))
def test_every_code_maps_to_a_class_that_subclasses_its_builtin(code: str) -> None:
    exc = from_native(code, "text", "KeyError", "detail")
    assert type(exc) is ERRORS[code]
    assert isinstance(exc, askpool.AskpoolError)
    assert isinstance(exc, BUILTIN[code])
    assert exc.code == code
    assert str(exc) == "text"


def test_transient_codes_are_marked() -> None:
    transient = {c for c, cls in ERRORS.items() if cls.transient}
    assert transient == {"UNAVAILABLE", "DEADLINE_EXCEEDED", "ASK_TIMEOUT", "BUFFER_FULL"}


def test_every_code_has_its_error_class() -> None:
    # DESIGN section 6: each code is Transient (retry), Permanent (don't) or
    # Poison (to the dead-letter queue), as in every binding.
    classes = {c: cls.error_class for c, cls in ERRORS.items()}
    transient = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "ASK_TIMEOUT", "BUFFER_FULL"}
    assert {c for c, k in classes.items() if k == "TRANSIENT"} == transient
    assert {c for c, k in classes.items() if k == "POISON"} == {"DECODE_FAILURE"}
    assert {c for c, k in classes.items() if k == "PERMANENT"} == set(ERRORS) - transient - {
        "DECODE_FAILURE"
    }
    assert from_native("DECODE_FAILURE", "text", None, None).error_class == "POISON"
    assert all(cls.transient == (cls.error_class == "TRANSIENT") for cls in ERRORS.values())


async def test_unknown_pool_is_no_route_a_lookup_error() -> None:
    async with Node() as node:
        with pytest.raises(askpool.NoRouteError) as info:
            await node.ask("nowhere", 1, timeout=1)
        assert isinstance(info.value, LookupError)
        assert "nowhere" in str(info.value)


async def test_handler_exception_reaches_the_caller_with_type_and_message() -> None:
    async with Node() as node:
        pool = node.pool("bad")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            raise KeyError("missing thing")

        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("bad", 1, timeout=5)
        assert info.value.type_name == "KeyError"
        assert info.value.message == "'missing thing'"
        assert isinstance(info.value, RuntimeError)


async def test_handler_exception_after_an_await() -> None:
    async with Node() as node:
        pool = node.pool("bad")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            raise ZeroDivisionError("later")

        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("bad", 1, timeout=5)
        assert (info.value.type_name, info.value.message) == ("ZeroDivisionError", "later")


async def test_text_utf8_cannot_carry_is_cleaned_up_not_lost() -> None:
    # A str may hold lone surrogates ("\ud800", surrogateescape'd bytes);
    # UTF-8 cannot. A handler's error still arrives with its type and
    # message, and a progress note does not fail the handler.
    async with Node() as node:
        pool = node.pool("odd")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg == "note":
                ctx.progress(0.5, "half \udcff way")
                return "noted"
            if msg == "later":
                await asyncio.sleep(0)
            raise ValueError("bad \ud800 input")

        for when in ("now", "later"):
            with pytest.raises(askpool.HandlerError) as info:
                await node.ask("odd", when, timeout=5)
            assert (info.value.type_name, info.value.message) == ("ValueError", "bad \ufffd input"), when
        handle_ = node.ask("odd", "note", timeout=5)
        events = [e async for e in handle_.stages()]
        assert await handle_ == "noted"
        assert [e.note for e in events if e.stage == "PARTIAL"] == ["half \ufffd way"]


async def test_a_name_or_id_utf8_cannot_carry_is_an_invalid_argument() -> None:
    # As in every binding; the extension's conversion raised UnicodeEncodeError.
    async with Node() as node:
        node.pool("p").handler(_echo)
        bad = "p\ud800"
        calls: list[Callable[[], Any]] = [
            lambda: node.pool(bad),
            lambda: node.ask(bad, 1),
            lambda: node.ask("p", 1, correlation_id="\udfff"),
            lambda: node.ask("p", 1, preferred_worker="w\ud800"),
            lambda: node.tell(bad, 1),
            lambda: node.replay_dead_letter("\ud800"),
        ]
        for call in calls:
            with pytest.raises(askpool.InvalidArgumentError):
                result = call()
                if isinstance(result, Awaitable):
                    await result
        assert node.stats()["pending"] == 0
        assert await node.ask("p", 2, timeout=5) == 2


async def test_a_reraised_inner_error_reads_its_code_once() -> None:
    # An inner ask's error re-raised as is: its text already says
    # "unavailable: ...", and the caller read the code twice.
    async with Node() as node:
        inventory = node.pool("inventory")
        outer = node.pool("outer")

        @inventory.handler
        async def down(msg: Any, ctx: Context) -> Any:
            raise askpool.UnavailableError("inventory is down")

        @outer.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return await node.ask("inventory", msg, timeout=5)

        with pytest.raises(askpool.UnavailableError) as inner:
            await node.ask("inventory", 1, timeout=5)
        assert str(inner.value) == "unavailable: inventory is down"
        with pytest.raises(askpool.UnavailableError) as info:
            await node.ask("outer", 1, timeout=5)
        assert str(info.value) == "unavailable: inventory is down"


def _loop_reports() -> list[dict[str, Any]]:
    """What the running loop's exception handler is given from now on."""
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
    return reported


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


@pytest.mark.parametrize("awaits", [False, True])
async def test_an_exception_whose_str_raises_still_names_its_type(awaits: bool) -> None:
    reported = _loop_reports()
    async with Node() as node:
        pool = node.pool("odd")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if awaits:
                await asyncio.sleep(0)
            raise _UnprintableError()

        for _ in range(2):
            with pytest.raises(askpool.HandlerError) as info:
                await node.ask("odd", 1, timeout=5)
            assert info.value.type_name == "_UnprintableError"
            assert "str() failed" in info.value.message
        await asyncio.sleep(0.05)
        assert node.stats()["pools"]["odd"]["in_flight"] == 0
    # Answered, so nothing for the loop to report ("Task exception was
    # never retrieved").
    assert reported == []


@pytest.mark.parametrize("awaits", [False, True])
@pytest.mark.parametrize("exc_type", [GeneratorExit, BaseException])
async def test_a_handler_raising_a_base_exception_is_answered_and_not_reported(
    awaits: bool, exc_type: type[BaseException]
) -> None:
    reported = _loop_reports()
    async with Node() as node:
        pool = node.pool("base")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if awaits:
                await asyncio.sleep(0)
            raise exc_type("odd")

        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("base", 1, timeout=5)
        assert info.value.type_name == exc_type.__name__
        with pytest.raises(askpool.HandlerError):
            await node.ask("base", 2, timeout=5)
        await asyncio.sleep(0.05)
    assert reported == []


class _StrExits(Exception):
    def __str__(self) -> str:
        raise SystemExit(3)


class _CodeExits(askpool.AskpoolError):
    @property
    def code(self) -> str:  # type: ignore[override]  # read-only over an attribute
        raise SystemExit(3)


class _ExitingText(str):
    def isascii(self) -> bool:
        raise SystemExit(3)


class _StrGivesExitingText(Exception):
    def __str__(self) -> str:
        return _ExitingText("over quota")


@pytest.mark.parametrize("awaits", [False, True])
@pytest.mark.parametrize(
    "raised, answer",
    [
        (SystemExit, ("SystemExit", "")),
        (_StrExits, ("_StrExits", "<str() failed: SystemExit>")),
        (_CodeExits, ("_CodeExits", "")),
    ],
    ids=["raised", "from-str", "from-code"],
)
def test_system_exit_in_a_handler_leaves_the_loop_as_in_any_task(
    awaits: bool, raised: type[BaseException], answer: tuple[str, str]
) -> None:
    # asyncio lets SystemExit and KeyboardInterrupt out of a task and out of
    # the loop; a handler's does the same whether or not it awaited (after
    # its caller got its answer), instead of becoming a reply and nothing
    # else. SystemExit stands for KeyboardInterrupt, which pytest traps.
    # "from-str", "from-code": one raised while the handler's error is
    # described (a Ctrl-C striking in its __str__ or its code property),
    # which was taken for that part's failure and lost.
    answered: list[askpool.HandlerError] = []

    async def main() -> None:
        async with Node() as node:
            pool = node.pool("quits")

            @pool.handler
            async def handle(msg: Any, ctx: Context) -> Any:
                if awaits:
                    await asyncio.sleep(0)
                raise raised()

            try:
                await node.ask("quits", 1, timeout=5)
            except askpool.HandlerError as e:
                answered.append(e)
            await asyncio.sleep(1)

    with pytest.raises(SystemExit):
        asyncio.run(main())
    if not awaits:
        # Answered at once, inside `ask`: the caller saw its answer first
        # (after an await, the exit leaves the loop before the caller runs).
        assert [(e.type_name, e.message) for e in answered] == [answer]


async def test_handler_raising_a_taxonomy_error_keeps_its_code() -> None:
    async with Node() as node:
        pool = node.pool("strict")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            raise askpool.ValidationError("age must be positive")

        with pytest.raises(askpool.ValidationError) as info:
            await node.ask("strict", {"age": -1}, timeout=5)
        assert isinstance(info.value, ValueError)
        assert "age must be positive" in str(info.value)


async def test_remote_timeout_is_ask_timeout_a_timeout_error() -> None:
    async with Node() as node:
        pool = node.pool("sleepy")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(10)

        with pytest.raises(askpool.AskTimeoutError) as info:
            await node.ask("sleepy", 1, timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert info.value.transient


async def test_bad_arguments_are_invalid_argument_value_errors() -> None:
    async with Node() as node:
        with pytest.raises(askpool.InvalidArgumentError):
            node.ask("p", 1, request_id="not hex")
        with pytest.raises(askpool.InvalidArgumentError):
            node.ask("p", 1, timeout=-1.0)
        with pytest.raises(ValueError):
            node.ask("p", 1, timeout=float("nan"))
        # Finite, but past what a duration holds: said so.
        with pytest.raises(askpool.InvalidArgumentError, match="seconds is too long"):
            node.ask("p", 1, timeout=1e20)
        # Of the wrong type: the same error, not a TypeError nor a bool
        # taken for one second.
        for odd in (True, "1", [1]):
            with pytest.raises(askpool.InvalidArgumentError, match="timeout"):
                node.ask("p", 1, timeout=odd)  # type: ignore[arg-type]
            with pytest.raises(askpool.InvalidArgumentError, match="timeout"):
                node.tell("p", 1, timeout=odd)  # type: ignore[arg-type]


def test_ask_sync_takes_a_timeout_of_the_right_type_only() -> None:
    node = Node()
    try:
        with pytest.raises(askpool.InvalidArgumentError, match="timeout"):
            node.ask_sync("p", 1, timeout=True)
    finally:
        node.close()


async def test_a_reused_request_id_with_another_payload_is_payload_mismatch() -> None:
    rid = "00000000000000020000000000000002"
    async with Node() as node:
        pool = node.pool("once")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        assert await node.ask("once", "a", timeout=5, request_id=rid, fingerprint=1) == "a"
        with pytest.raises(askpool.PayloadMismatchError) as info:
            await node.ask("once", "b", timeout=5, request_id=rid, fingerprint=2)
        assert isinstance(info.value, ValueError)
        assert node.stats()["pools"]["once"]["handler_runs"] == 1


async def test_a_reused_request_id_with_other_bytes_is_payload_mismatch() -> None:
    # Byte payloads are fingerprinted by their bytes (as in every binding):
    # no `fingerprint` needed for the reuse to be refused.
    async with Node() as node:
        pool = node.pool("once")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        for i, (first, other) in enumerate(
            [(b"a", b"b"), (bytearray(b"a"), bytearray(b"b")), (memoryview(b"a"), memoryview(b"b"))]
        ):
            rid = f"{i + 1:032x}"
            assert await node.ask("once", first, timeout=5, request_id=rid) is first
            # The same bytes again are a duplicate: the cached reply.
            assert await node.ask("once", bytes(first), timeout=5, request_id=rid) is first
            with pytest.raises(askpool.PayloadMismatchError):
                await node.ask("once", other, timeout=5, request_id=rid)
            with pytest.raises(askpool.PayloadMismatchError):
                await asyncio.to_thread(node.ask_sync, "once", other, timeout=5, request_id=rid)
        # A tell's reused id is checked too.
        rid = f"{9:032x}"
        assert await node.tell("once", b"a", request_id=rid) == rid
        with pytest.raises(askpool.PayloadMismatchError):
            await node.tell("once", b"b", request_id=rid)
        assert node.stats()["pools"]["once"]["handler_runs"] == 4


async def test_a_full_pool_refuses_with_buffer_full() -> None:
    release = asyncio.Event()
    async with Node() as node:
        pool = node.pool("tight", concurrency=1, max_in_flight=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await release.wait()
            return msg

        first = node.ask("tight", 1, timeout=5)
        with pytest.raises(askpool.BufferFullError):
            await node.ask("tight", 2, timeout=0.2)
        release.set()
        assert await first == 1


async def test_a_tells_dead_letter_replays_as_a_tell() -> None:
    release = asyncio.Event()
    told: list[Any] = []
    async with Node() as node:
        pool = node.pool("tight", concurrency=1, max_in_flight=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg == "block":
                await release.wait()
            else:
                told.append(msg)
            return "an answer nobody asked for"

        first = node.ask("tight", "block", timeout=5)
        payload = ["told"]
        # Refused until its time ran out: BUFFER_FULL, or the deadline on a
        # loaded machine (both retryable: dead-lettered).
        with pytest.raises((askpool.BufferFullError, askpool.AskTimeoutError)):
            await node.tell("tight", payload, timeout=0.2)
        (letter,) = node.dead_letters()
        assert letter.kind == "TELL"
        release.set()
        await first
        replay = node.replay_dead_letter(letter.request_id)
        assert [event async for event in replay.stages()] == []
        assert await replay == letter.request_id
        assert node.dead_letters() == []
        while not told:
            await asyncio.sleep(0.01)
        assert told[0] is payload


async def test_pending_ask_fails_unavailable_when_the_node_closes() -> None:
    node = Node()
    pool = node.pool("held")

    @pool.handler
    async def handle(msg: Any, ctx: Context) -> Any:
        await asyncio.sleep(10)

    handle_ = node.ask("held", 1, timeout=5)
    await asyncio.sleep(0.01)
    node.close()
    with pytest.raises(askpool.UnavailableError) as info:
        await handle_
    assert isinstance(info.value, ConnectionError)
    assert node.closed


async def test_worker_side_cancel_is_ask_cancelled() -> None:
    async with Node() as node:
        pool = node.pool("quitter")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await asyncio.sleep(0)
            raise asyncio.CancelledError()

        with pytest.raises(askpool.AskCancelledError):
            await node.ask("quitter", 1, timeout=5)


async def test_a_handler_cancelled_before_awaiting_is_ask_cancelled() -> None:
    async with Node() as node:
        pool = node.pool("quitter")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            raise asyncio.CancelledError()

        with pytest.raises(askpool.AskCancelledError):
            await node.ask("quitter", 1, timeout=5)


class _Quota(enum.Enum):
    QUOTA = "QUOTA"


class _EnumCoded(askpool.AskpoolError):
    code = _Quota.QUOTA  # type: ignore[assignment]


class _CodeRaises(askpool.AskpoolError):
    @property
    def code(self) -> str:  # type: ignore[override]  # read-only over an attribute
        raise RuntimeError("no code today")


class _Stop(BaseException):
    pass


class _StrRaisesBase(Exception):
    def __str__(self) -> str:
        raise _Stop()


@pytest.mark.parametrize("awaits", [False, True])
@pytest.mark.parametrize(
    "make, message",
    [
        (_EnumCoded, "over quota"),
        (_CodeRaises, "over quota"),
        (_StrRaisesBase, "<str() failed: _Stop>"),
        (_StrGivesExitingText, "over quota"),
    ],
    ids=["enum-code", "code-raises", "str-raises", "str-subclass-raises"],
)
async def test_an_exception_hard_to_describe_still_answers_and_the_slot_goes_on(
    make: Callable[[str], BaseException], message: str, awaits: bool
) -> None:
    # Before: after an await, describing such an exception raised in the
    # slot's task, which ended holding the request: it and every later
    # request of the slot timed out. Before any await, the caller got an
    # InternalError about a type cast. "str-subclass-raises": a __str__
    # that returns a str subclass whose own methods raise (an exit): its
    # characters are copied without calling them (before, the exit escaped
    # the description: a placeholder message or an InternalError, and the
    # exit lost).
    async with Node() as node:
        pool = node.pool("odd", concurrency=1)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if awaits:
                await asyncio.sleep(0)
            if msg == "raise":
                raise make("over quota")
            return msg

        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("odd", "raise", timeout=2)
        assert (info.value.type_name, info.value.message) == (make.__name__, message)
        for i in range(3):
            assert await node.ask("odd", i, timeout=2) == i


async def test_decode_failure_is_poison_and_lands_in_the_dlq() -> None:
    payload = {"garbled": True}
    runs = 0
    async with Node() as node:
        pool = node.pool("parse")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            nonlocal runs
            runs += 1
            raise askpool.DecodeFailureError("cannot parse")

        handle_ = node.ask("parse", payload, timeout=5)
        with pytest.raises(askpool.DecodeFailureError):
            await handle_
        letters = node.dead_letters()
        assert len(letters) == 1
        letter = letters[0]
        assert letter.request_id == handle_.request_id
        assert letter.payload is payload
        assert letter.reason == "POISON"
        assert letter.kind == "ASK"
        assert letter.pool == "parse"
        assert isinstance(letter.error, askpool.DecodeFailureError)
        assert node.stats()["dlq_depth"] == 1

        # Replayed with its request id: the pool answers from its cache.
        with pytest.raises(askpool.DecodeFailureError):
            await node.replay_dead_letter(letter.request_id)
        assert runs == 1
        assert node.purge_dead_letters() == 1
        assert node.dead_letters() == []
        with pytest.raises(askpool.FailedPreconditionError):
            await node.replay_dead_letter(letter.request_id)


async def test_bad_pool_options_are_invalid_argument_errors() -> None:
    async with Node() as node:
        for options in (
            {"concurrency": 0},
            {"concurrency": -1},
            {"max_in_flight": 0},
            {"max_in_flight": -5},
            {"reply_cache": -1},
            {"reply_ttl": -1.0},
            {"reply_ttl": float("nan")},
        ):
            with pytest.raises(askpool.InvalidArgumentError):
                node.pool("p", **options)
        # Too many workers: refused by the core, not an allocation failure
        # that would abort the process.
        with pytest.raises(askpool.InvalidArgumentError, match="concurrency"):
            node.pool("p", concurrency=2**32).handler(_noop)
        with pytest.raises(askpool.NoRouteError):
            await node.ask("p", 1, timeout=1)


@pytest.mark.parametrize(
    "name, options",
    [
        ("p", {"concurrency": "3"}),
        ("p", {"concurrency": 1.5}),
        ("p", {"concurrency": True}),
        ("p", {"max_in_flight": 2**70}),
        ("p", {"reply_ttl": "1"}),
        ("p", {"reply_ttl": float("inf")}),
        (None, {}),
        (7, {}),
        ("", {}),
        ("x" * 256, {}),
        ("\u00e9" * 128, {}),  # 256 bytes in UTF-8
    ],
)
async def test_bad_pool_names_and_option_types_are_invalid_argument_errors(
    name: Any, options: dict[str, Any]
) -> None:
    async with Node() as node:
        with pytest.raises(askpool.InvalidArgumentError):
            node.pool(name, **options)
        node.pool("x" * 255).handler(_noop)  # the longest name is fine


@pytest.mark.parametrize(
    "options",
    [
        {"dlq_capacity": -1},
        {"dlq_capacity": "9"},
        {"max_payload_bytes": 2**70},
        {"max_payload_bytes": "big"},
        {"default_timeout": -1},
        {"default_timeout": 0},
        {"default_timeout": "5"},
        {"default_timeout": float("nan")},
    ],
)
def test_bad_node_options_are_invalid_argument_errors(options: dict[str, Any]) -> None:
    with pytest.raises(askpool.InvalidArgumentError) as raised:
        Node(**options)
    assert next(iter(options)) in str(raised.value)


async def test_a_panic_in_a_pool_worker_fails_that_request_and_the_pool_goes_on() -> None:
    reports: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reports.append(context))
    async with Node() as node:
        pool = node.pool("p")
        pool.handler(_echo)
        assert await node.ask("p", 0, timeout=5) == 0
        _native._panic_in_next_dispatch("boom")
        with pytest.raises(askpool.InternalError):
            await node.ask("p", 1, timeout=5)
        # The worker slot recovered: the pool answers the next ask.
        assert await node.ask("p", 2, timeout=5) == 2
        assert await asyncio.gather(*(node.ask("p", i, timeout=5) for i in range(10))) == list(range(10))
    assert [r["message"] for r in reports if "boom" in r["message"]], reports
    assert "recovered" in reports[0]["message"]


async def test_an_oversize_byte_payload_is_refused_before_anything_is_sent() -> None:
    runs = 0
    causations: list[Optional[str]] = []

    async def count(msg: Any, ctx: Context) -> Any:
        nonlocal runs
        runs += 1
        causations.append(ctx.causation_id)
        return len(msg)

    async with Node(max_payload_bytes=8) as node:
        node.pool("p").handler(count)
        for big in (b"123456789", bytearray(9), memoryview(b"x" * 9)):
            with pytest.raises(askpool.OversizePayloadError, match="9 bytes"):
                await node.ask("p", big, timeout=5)
            with pytest.raises(askpool.OversizePayloadError):
                await node.tell("p", big)
        assert runs == 0
        assert node.stats()["pending"] == 0
        # A released memoryview cannot be sized or read: refused as bad input,
        # named request id or not (before: asked unsized, or a ValueError).
        released = memoryview(b"x" * 9)
        released.release()
        for request_id in (None, "0" * 31 + "5"):
            with pytest.raises(askpool.InvalidArgumentError, match="memoryview"):
                await node.ask("p", released, timeout=5, request_id=request_id)
        assert runs == 0
        assert node.stats()["pending"] == 0
        assert await node.ask("p", b"12345678", timeout=5) == 8
        # Objects pass by reference and are not sized.
        assert await node.ask("p", "a long string, not bytes", timeout=5) == 24
        cid = "0" * 31 + "7"
        await node.tell("p", b"1", causation_id=cid)
        for _ in range(500):
            if len(causations) == 3:
                break
            await asyncio.sleep(0.01)
        assert causations[-1] == cid
    async with Node(max_payload_bytes=None) as node:
        node.pool("p").handler(count)
        assert await node.ask("p", bytes(20 * 1024 * 1024), timeout=5) == 20 * 1024 * 1024
    with pytest.raises(askpool.InvalidArgumentError):
        Node(max_payload_bytes=-1)


def test_a_pool_leaves_the_node_when_its_event_loop_ends() -> None:
    node = Node()

    async def host() -> Any:
        pool = node.pool("p")
        pool.handler(_echo)
        return await node.ask("p", 1, timeout=5)

    assert asyncio.run(host()) == 1

    async def from_another_loop() -> None:
        # Its workers ran on the loop that ended: asks fail at once instead of
        # queueing for workers that never run again and timing out.
        with pytest.raises(askpool.NoRouteError):
            await node.ask("p", 2, timeout=30)

    asyncio.run(asyncio.wait_for(from_another_loop(), 5))
    node.close()


def test_a_handler_left_running_by_a_closed_loop_is_answered_cancelled() -> None:
    # A loop stopped and closed without cancelling its tasks (run_forever or
    # run_until_complete, then close): its handlers can never run again. Their
    # callers are told (AskCancelledError) instead of waiting out their
    # timeouts, the handlers' `finally` runs, and nothing of them is kept.
    node = Node()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    started = threading.Event()
    cleaned_up: list[bool] = []

    async def host() -> None:
        @node.pool("stuck").handler
        async def handle(msg: Any, ctx: Context) -> Any:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                cleaned_up.append(True)

    asyncio.run_coroutine_threadsafe(host(), loop).result(5)
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            node.ask_sync("stuck", 1, timeout=30)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    asking = threading.Thread(target=caller)
    asking.start()
    try:
        assert started.wait(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        gc.collect()
        asking.join(5)
        assert not asking.is_alive(), "the caller still waits for a handler that cannot run"
        assert len(outcome) == 1 and isinstance(outcome[0], askpool.AskCancelledError), outcome
        assert cleaned_up == [True]
        assert not [s for s in _dispatch._running if s._loop is loop]
    finally:
        node.close()
        asking.join(35)


def test_a_handler_started_by_the_previous_answer_is_answered_when_its_loop_closes() -> None:
    # An answer starts the slot's next request at once, nested in the slot
    # task's step that answered: that request must be tracked like any
    # other, so a loop closed under it still answers its caller.
    node = Node()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    second_started = threading.Event()
    gate: list[asyncio.Event] = []
    cleaned_up: list[int] = []

    async def host() -> None:
        gate.append(asyncio.Event())

        @node.pool("one", concurrency=1).handler
        async def handle(msg: Any, ctx: Context) -> Any:
            try:
                if msg == 1:
                    await gate[0].wait()
                    return "first"
                second_started.set()
                await asyncio.sleep(60)
            finally:
                cleaned_up.append(msg)

    asyncio.run_coroutine_threadsafe(host(), loop).result(5)
    outcomes: dict[int, Any] = {}

    def caller(msg: int) -> None:
        try:
            outcomes[msg] = node.ask_sync("one", msg, timeout=30)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcomes[msg] = e

    first = threading.Thread(target=caller, args=(1,))
    first.start()
    # The second is queued behind the first (one slot).
    while node.stats()["pools"]["one"]["in_flight"] < 1:
        time.sleep(0.01)
    second = threading.Thread(target=caller, args=(2,))
    second.start()
    try:
        while node.stats()["pools"]["one"]["in_flight"] < 2:
            time.sleep(0.01)
        loop.call_soon_threadsafe(gate[0].set)
        assert second_started.wait(5)
        first.join(5)
        assert outcomes.get(1) == "first", outcomes
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        gc.collect()
        second.join(5)
        assert not second.is_alive(), "the caller still waits for a handler that cannot run"
        assert isinstance(outcomes[2], askpool.AskCancelledError), outcomes
        assert cleaned_up == [1, 2]
        assert not [s for s in _dispatch._running if s._loop is loop]
    finally:
        node.close()
        second.join(35)


def test_a_loop_closed_without_shutdown_lets_go_of_its_pools_and_asks_at_once() -> None:
    # run_until_complete, then close, without shutdown_asyncgens(): what the
    # loop hosted and what was in flight on it goes at the close, not at a
    # garbage collection (which may never come: the driver's tasks and the
    # loop's futures hold each other through Rust).
    node = Node()
    fds = len(os.listdir("/proc/self/fd"))
    cleaned: list[int] = []
    try:
        for i in range(20):
            name = f"closing-{i}"

            async def host() -> None:
                @node.pool(name).handler
                async def handle(msg: Any, ctx: Context) -> Any:
                    if msg == "stall":
                        try:
                            await asyncio.sleep(3600)
                        finally:
                            cleaned.append(i)
                    return msg

                assert await node.ask(name, i, timeout=30) == i
                # In flight at the close: an ask nobody awaits, its handler
                # stalled.
                node.ask(name, "stall", timeout=30)
                await asyncio.sleep(0)

            loop = asyncio.new_event_loop()
            loop.run_until_complete(host())
            loop.close()
            stats = node.stats()
            assert name not in stats["pools"], stats["pools"]
            assert stats["pending"] == 0, stats
        assert cleaned == list(range(20))
        # Each closed loop's wake-up socket pair is closed too (the last
        # loop, still referenced here, may keep its own).
        assert len(os.listdir("/proc/self/fd")) - fds <= 2
    finally:
        node.close()


def test_an_ask_to_a_pool_whose_loop_closed_fails_at_once() -> None:
    node = Node()
    loop = asyncio.new_event_loop()

    async def host() -> None:
        @node.pool("gone").handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        assert await node.ask("gone", 1, timeout=5) == 1

    loop.run_until_complete(host())
    loop.close()

    async def later() -> None:
        with pytest.raises(askpool.NoRouteError):
            await node.ask("gone", 2, timeout=30)

    asyncio.run(asyncio.wait_for(later(), 5))
    node.close()


async def _echo(msg: Any, ctx: Context) -> Any:
    return msg


def test_async_api_without_a_running_loop_is_a_clear_error() -> None:
    node = Node()
    with pytest.raises(askpool.NoRunningLoopError) as info:
        node.ask("p", 1)
    assert "ask_sync" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(askpool.NoRunningLoopError):
        node.pool("p").handler(_noop)
    node.close()


async def _noop(msg: Any, ctx: Context) -> None:
    return None


def test_a_rust_panic_is_an_exception_not_an_abort() -> None:
    from askpool import _native

    with pytest.raises(BaseException) as info:
        _native._panic("on purpose")
    assert type(info.value).__name__ == "PanicException"
    assert "on purpose" in str(info.value)
    # The process and the extension carry on.
    node = Node()
    assert len(node.caller_id) > 0
    node.close()


async def test_repeated_timeouts_open_the_circuit_breaker() -> None:
    async with Node() as node:
        pool = node.pool("stuck", concurrency=64)

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            await ctx.wait_cancelled()

        outcomes = await asyncio.gather(
            *(node.ask("stuck", i, timeout=0.01) for i in range(64)), return_exceptions=True
        )
        assert all(isinstance(o, askpool.AskTimeoutError) for o in outcomes)
        with pytest.raises(askpool.UnavailableError) as info:
            await node.ask("stuck", 0, timeout=1)
        assert "circuit open" in str(info.value)


@pytest.mark.parametrize("value", [-1, 2**128, True, "7", 1.5])
async def test_a_fingerprint_out_of_range_or_not_an_int_is_invalid_argument(value: Any) -> None:
    # "an int < 2**128": anything else is refused the way other bad options
    # are, not with an OverflowError or a TypeError naming an internal tuple.
    async with Node() as node:
        with pytest.raises(askpool.InvalidArgumentError, match="fingerprint"):
            node.ask("p", 1, request_id="1" * 32, fingerprint=value)
        with pytest.raises(askpool.InvalidArgumentError, match="fingerprint"):
            await asyncio.to_thread(node.ask_sync, "p", 1, fingerprint=value)
        with pytest.raises(askpool.NoRouteError):  # the largest is fine
            await node.ask("p", 1, timeout=1, fingerprint=2**128 - 1)


@pytest.mark.parametrize(
    "error",
    [
        askpool.HandlerError("handler failed: KeyError: 'k'", "KeyError", "'k'"),
        askpool.AskTimeoutError("ask timed out"),
        askpool.NoRouteError("no route"),
    ],
)
def test_errors_survive_pickle_and_copy(error: askpool.AskpoolError) -> None:
    # Exceptions cross processes pickled (concurrent.futures, multiprocessing).
    for clone in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(clone) is type(error)
        assert clone.args == error.args
        assert str(clone) == str(error)
        if isinstance(error, askpool.HandlerError):
            assert isinstance(clone, askpool.HandlerError)
            assert (clone.type_name, clone.message) == (error.type_name, error.message)


async def test_a_handler_wrapped_by_a_decorator_is_accepted() -> None:
    """A ``functools.wraps`` decorator's sync wrapper of an ``async def``
    type-checks as a handler and runs as one; a wrapper that returns
    something else fails its requests with a TypeError that says so."""
    import functools

    def traced(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(msg: Any, ctx: Context) -> Any:
            return fn(msg, ctx)

        return wrapper

    def broken(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(msg: Any, ctx: Context) -> Any:
            return "not a coroutine"

        return wrapper

    async def echo(msg: Any, ctx: Context) -> Any:
        return msg

    async with Node() as node:
        node.pool("traced").handler(traced(echo))
        assert await node.ask("traced", 7) == 7
        node.pool("broken").handler(broken(echo))
        with pytest.raises(askpool.HandlerError) as info:
            await node.ask("broken", 7)
        assert "TypeError" in str(info.value)
        assert "must return a coroutine" in str(info.value)
        with pytest.raises(TypeError):
            node.pool("sync").handler(lambda msg, ctx: msg)
