"""Durable promises and durable asks, including a restart across two
processes sharing one SQLite file."""

from __future__ import annotations

import asyncio
import math
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import askpool
from askpool import Context, Node, Promises


@pytest.fixture(params=["memory", "sqlite"])
def promises(request: pytest.FixtureRequest, tmp_path: Path) -> Promises:
    if request.param == "memory":
        return Promises.memory()
    return Promises.open(tmp_path / "promises.db")


def test_create_get_and_settle(promises: Promises) -> None:
    p = promises.create("order-1", timeout=60, param=b"in", key="c1", tags={"k": "v"})
    assert (p.id, p.state, p.param, p.value, p.tags) == ("order-1", "pending", b"in", None, {"k": "v"})
    assert not p.settled
    # An idempotent create: the same key gives the same promise back.
    assert promises.create("order-1", timeout=60, param=b"in", key="c1") == p
    with pytest.raises(askpool.FailedPreconditionError):
        promises.create("order-1", timeout=60, key="another")
    done = promises.resolve("order-1", b"out", key="r1")
    assert (done.state, done.value, done.settled) == ("resolved", b"out", True)
    assert done.settled_at is not None
    # The same completion key replays; any other completion is refused.
    assert promises.resolve("order-1", b"out", key="r1") == done
    with pytest.raises(askpool.FailedPreconditionError):
        promises.reject("order-1", b"no")
    assert promises.get("order-1") == done


def test_reject_cancel_and_unknown_ids(promises: Promises) -> None:
    promises.create("a", timeout=60)
    promises.create("b", timeout=60)
    assert promises.reject("a", b"why").state == "rejected"
    assert promises.cancel("b").state == "canceled"
    with pytest.raises(askpool.InvalidArgumentError):
        promises.get("missing")
    with pytest.raises(askpool.InvalidArgumentError):
        promises.resolve("missing")
    with pytest.raises(askpool.InvalidArgumentError):
        promises.create("c", timeout=-1)


def test_a_pending_promise_times_out(promises: Promises) -> None:
    promises.create("short", timeout=0)
    assert promises.get("short").state == "timedout"


def test_prune_deletes_settled_promises_past_the_retention(promises: Promises) -> None:
    for id in ("done-1", "done-2", "open"):
        promises.create(id, timeout=60)
    promises.resolve("done-1", b"one")
    promises.reject("done-2", b"two")
    time.sleep(0.02)
    assert promises.prune(0) == 2
    with pytest.raises(askpool.InvalidArgumentError):
        promises.get("done-1")
    assert promises.get("open").state == "pending"
    # Settled within the retention: kept.
    promises.resolve("open", b"later")
    assert promises.prune(3600) == 0
    assert promises.get("open").state == "resolved"
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(askpool.InvalidArgumentError):
            promises.prune(bad)


async def test_wait_returns_once_settled(promises: Promises) -> None:
    promises.create("w", timeout=60)

    async def settle_later() -> None:
        await asyncio.sleep(0.05)
        promises.resolve("w", b"done")

    task = asyncio.ensure_future(settle_later())
    settled = await promises.wait("w", timeout=5)
    await task
    assert (settled.state, settled.value) == ("resolved", b"done")
    promises.create("never", timeout=60)
    with pytest.raises(askpool.AskTimeoutError):
        await promises.wait("never", timeout=0.05)


async def test_wait_wakes_on_a_completion_in_this_process_without_blocking_the_loop(
    promises: Promises,
) -> None:
    promises.create("soon", timeout=60)
    ticks = 0

    async def count() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    counter = asyncio.ensure_future(count())
    # A poll of a minute: only the completion's own wake-up can end the
    # wait in time.
    waiting = asyncio.ensure_future(promises.wait("soon", poll=60))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    before = ticks
    await asyncio.sleep(0.05)
    # The loop runs other tasks while the wait is pending.
    assert ticks > before
    promises.resolve("soon", b"now")
    settled = await asyncio.wait_for(waiting, 5)
    counter.cancel()
    assert (settled.state, settled.value) == ("resolved", b"now")
    assert promises._native._waits() == 0


async def test_wait_finds_a_completion_made_elsewhere_by_polling(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    here = Promises.open(path)
    # Another store on the same file (as another process would open it):
    # its completions do not wake this store's waiters.
    elsewhere = Promises.open(path)
    here.create("remote", timeout=60)
    waiting = asyncio.ensure_future(here.wait("remote", poll=0.01))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    elsewhere.reject("remote", b"no")
    settled = await asyncio.wait_for(waiting, 5)
    assert (settled.state, settled.value) == ("rejected", b"no")


async def test_a_cancelled_wait_leaves_nothing_behind(promises: Promises) -> None:
    promises.create("abandoned", timeout=60)
    waiting = asyncio.ensure_future(promises.wait("abandoned", poll=0.01))
    # The wait registers on the runtime's thread: poll until it has.
    deadline = time.monotonic() + 5
    while promises._native._waits() != 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert promises._native._waits() == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    # The wait stops at once on the runtime's thread.
    deadline = time.monotonic() + 5
    while promises._native._waits() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert promises._native._waits() == 0
    # A timed-out wait too.
    with pytest.raises(askpool.AskTimeoutError):
        await promises.wait("abandoned", timeout=0.02)
    deadline = time.monotonic() + 5
    while promises._native._waits() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert promises._native._waits() == 0
    # The promise is still there to settle and wait for.
    promises.cancel("abandoned")
    assert (await promises.wait("abandoned")).state == "canceled"


async def test_wait_checks_its_arguments(promises: Promises) -> None:
    promises.create("args", timeout=60)
    for bad in (-1.0, math.nan):
        with pytest.raises(askpool.InvalidArgumentError):
            await promises.wait("args", timeout=bad)
        with pytest.raises(askpool.InvalidArgumentError):
            await promises.wait("args", poll=bad)
    with pytest.raises(askpool.InvalidArgumentError):
        await promises.wait("missing")


class GatedUpper:
    """A handler that answers ``msg.upper()`` once ``go`` is set, counting
    its runs."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.runs = 0

    async def __call__(self, msg: str, ctx: Context) -> str:
        await self.go.wait()
        self.runs += 1
        return msg.upper()


async def test_replaying_a_durable_asks_dead_letter_settles_its_promise(
    promises: Promises,
) -> None:
    upper = GatedUpper()
    async with Node(promises=promises) as node:
        node.pool("one", concurrency=1, max_in_flight=1).handler(upper)

        # Holds the pool's only place: the durable ask is refused until its
        # retries run out (about 7 s: it may wait as long as its promise),
        # and dead-lettered with its promise still pending.
        blocker = node.ask("one", "first", timeout=30)
        await asyncio.sleep(0.05)
        durable = node.ask_durable("one", "hi")
        with pytest.raises(askpool.AskpoolError):
            await durable
        assert promises.get(durable.id).state == "pending"
        [letter] = node.dead_letters()
        assert letter.request_id == durable.id
        upper.go.set()
        assert await blocker == "FIRST"
        assert await node.replay_dead_letter(letter.request_id) == "HI"
        settled = promises.get(durable.id)
        assert settled.state == "resolved"
        assert settled.value is not None and pickle.loads(settled.value) == "HI"
        # Awaited again (as after a restart): the stored outcome, no new run.
        assert await node.await_durable(durable.id) == "HI"
        assert upper.runs == 2


def test_a_corrupt_database_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(askpool.AskpoolError) as info:
        Promises.open(path)
    assert "corrupt" in str(info.value)


def test_an_empty_path_is_an_invalid_argument() -> None:
    # SQLite would open a store that vanishes with its connection.
    with pytest.raises(askpool.InvalidArgumentError):
        Promises.open("")
    with pytest.raises(TypeError):
        Promises.open(None)  # type: ignore[arg-type]


async def test_ask_durable_records_the_outcome(promises: Promises) -> None:
    runs = 0
    async with Node(promises=promises) as node:
        pool = node.pool("double")

        @pool.handler
        async def handle(msg: dict[str, int], ctx: Context) -> dict[str, int]:
            nonlocal runs
            runs += 1
            return {"n": msg["n"] * 2}

        handle_ = node.ask_durable("double", {"n": 21})
        assert await handle_ == {"n": 42}
        record = promises.get(handle_.id)
        assert record.state == "resolved"
        # Asked again by id: answered from the promise, the handler not rerun.
        assert await node.await_durable(handle_.id) == {"n": 42}
        assert runs == 1


async def test_a_durable_ask_streams_the_stages_of_its_asks(promises: Promises) -> None:
    async with Node(promises=promises) as node:
        pool = node.pool("work")

        @pool.handler
        async def handle(msg: str, ctx: Context) -> str:
            await asyncio.sleep(0)
            ctx.progress(0.5, "half")
            await asyncio.sleep(0)
            return msg.upper()

        handle_ = node.ask_durable("work", "hi")
        events = [e async for e in handle_.stages()]
        assert await handle_ == "HI"
        assert [e.stage for e in events] == ["SENT", "RECEIVED", "READ", "PARTIAL", "FULFILLED"]
        assert (events[3].fraction, events[3].note) == (0.5, "half")
        with pytest.raises(askpool.InvalidArgumentError):
            handle_.stages()
        # Answered from the store: no ask made, no stages.
        again = node.await_durable(handle_.id.upper())
        assert again.id == handle_.id
        assert [e async for e in again.stages()] == []
        assert await again == "HI"


async def test_a_durable_handle_cancelled_at_once_streams_the_ask_that_goes_on(
    promises: Promises,
) -> None:
    async with Node(promises=promises) as node:
        pool = node.pool("work")
        gate = asyncio.Event()

        @pool.handler
        async def handle(msg: str, ctx: Context) -> str:
            ctx.progress(0.5, "half")
            await gate.wait()
            return msg.upper()

        handle_ = node.ask_durable("work", "hi")
        # The caller stops waiting before the ask started: it goes on,
        # detached, and the handle's stream follows it.
        handle_.cancel()
        gate.set()
        stages = [e.stage async for e in handle_.stages()]
        assert stages == ["SENT", "RECEIVED", "READ", "PARTIAL", "FULFILLED"]
        assert promises.get(handle_.id).state == "resolved"


async def test_a_cancelled_durable_wait_still_settles_the_promise(
    promises: Promises,
) -> None:
    upper = GatedUpper()
    async with Node(promises=promises) as node:
        node.pool("slow").handler(upper)

        handle_ = node.ask_durable("slow", "hi")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(handle_, 0.05)
        upper.go.set()
        # Nobody awaits the ask now; it still runs and records its reply.
        for _ in range(1000):
            if promises.get(handle_.id).state != "pending":
                break
            await asyncio.sleep(0.01)
        assert promises.get(handle_.id).state == "resolved"
        assert await node.await_durable(handle_.id) == "HI"
        assert upper.runs == 1


async def test_a_reply_that_cannot_be_stored_rejects_the_durable_ask(
    promises: Promises,
) -> None:
    runs = 0
    async with Node(promises=promises) as node:
        pool = node.pool("unpicklable")

        @pool.handler
        async def handle(msg: int, ctx: Context) -> Any:
            nonlocal runs
            runs += 1
            return lambda: msg

        handle_ = node.ask_durable("unpicklable", 1)
        with pytest.raises(askpool.DecodeFailureError) as info:
            await handle_
        assert "cannot be stored" in str(info.value)
        assert promises.get(handle_.id).state == "rejected"
        with pytest.raises(askpool.DecodeFailureError) as again:
            await node.await_durable(handle_.id)
        assert "cannot be stored" in str(again.value)
        assert runs == 1


async def test_durable_failures_and_bad_input(promises: Promises) -> None:
    async with Node(promises=promises) as node:
        pool = node.pool("bad")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            raise KeyError("nope")

        handle_ = node.ask_durable("bad", 1)
        with pytest.raises(askpool.HandlerError) as info:
            await handle_
        assert info.value.type_name == "KeyError"
        assert promises.get(handle_.id).state == "rejected"
        # The stored rejection comes back as the same error.
        with pytest.raises(askpool.HandlerError) as again:
            await node.await_durable(handle_.id)
        assert again.value.type_name == "KeyError"

        with pytest.raises(askpool.InvalidArgumentError):
            node.ask_durable("bad", lambda: None)
        with pytest.raises(askpool.InvalidArgumentError):
            node.await_durable("not an id")
    with pytest.raises(askpool.FailedPreconditionError):
        async with Node() as plain:
            plain.ask_durable("bad", 1)


PROCESS = textwrap.dedent(
    """
    import asyncio, sys
    import askpool

    db, runs, mode, request_id = sys.argv[1:5]

    async def main():
        promises = askpool.Promises.open(db)
        async with askpool.Node(promises=promises) as node:
            pool = node.pool("work")

            @pool.handler
            async def work(msg, ctx):
                with open(runs, "a") as f:
                    f.write(f"{mode}\\n")
                if mode == "crash":
                    await asyncio.sleep(60)
                return {"n": msg["n"] * 2}

            if mode in ("ask", "crash"):
                handle = node.ask_durable("work", {"n": 21}, request_id=request_id)
                if mode == "crash":
                    await asyncio.sleep(0.1)
                    import os
                    os._exit(3)
                print(await handle)
            else:
                print(await node.await_durable(request_id))

    asyncio.run(main())
    """
)


def _run(tmp_path: Path, mode: str, request_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROCESS, str(tmp_path / "p.db"), str(tmp_path / "runs"), mode, request_id],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not python/: `-c` would import the sources, not the wheel
    )


def test_a_restarted_process_gets_the_outcome_without_rerunning(tmp_path: Path) -> None:
    rid = "00000000000000aa00000000000000aa"
    first = _run(tmp_path, "ask", rid)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "{'n': 42}"
    second = _run(tmp_path, "await", rid)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "{'n': 42}"
    assert (tmp_path / "runs").read_text().split() == ["ask"]


def test_a_process_that_died_mid_ask_is_resumed_by_the_next(tmp_path: Path) -> None:
    rid = "00000000000000bb00000000000000bb"
    crashed = _run(tmp_path, "crash", rid)
    assert crashed.returncode == 3, crashed.stderr
    resumed = _run(tmp_path, "await", rid)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "{'n': 42}"
    # Started in the crashed process, run again (at least once) by the new one.
    assert (tmp_path / "runs").read_text().split() == ["crash", "await"]
    db = Promises.open(tmp_path / "p.db")
    assert db.get(rid).state == "resolved"


async def test_a_stored_taxonomy_rejection_comes_back_as_the_same_error(
    promises: Promises,
) -> None:
    """A handler's taxonomy error rejects a durable ask; awaiting it again
    (as after a restart) raises the same class with the same message, not
    another one (an ``except ValueError`` must catch both)."""
    async with Node(promises=promises) as node:
        pool = node.pool("strict")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            if msg == "validation":
                raise askpool.ValidationError("bad input")
            if msg == "permission":
                raise askpool.PermissionDeniedError("not yours")
            raise askpool.InvalidArgumentError("no such thing")

        for msg, cls in (
            ("validation", askpool.ValidationError),
            ("permission", askpool.PermissionDeniedError),
            ("argument", askpool.InvalidArgumentError),
        ):
            handle_ = node.ask_durable("strict", msg)
            with pytest.raises(cls) as first:
                await handle_
            assert promises.get(handle_.id).state == "rejected"
            with pytest.raises(cls) as again:
                await node.await_durable(handle_.id)
            assert str(again.value) == str(first.value)


def test_a_durable_timeout_under_a_millisecond_is_refused_at_open(tmp_path: Path) -> None:
    # Every durable ask would time out as it is stored, its handler never run.
    for bad in (0, 0.0004, -1.0, math.nan, math.inf):
        with pytest.raises(askpool.InvalidArgumentError):
            Promises.open(tmp_path / "p.db", durable_timeout=bad)
    assert Promises.open(tmp_path / "p.db", durable_timeout=0.001) is not None


async def test_awaits_given_up_leave_nothing_polling_the_store(promises: Promises) -> None:
    """An await of an id being asked waits in its handle; a caller that
    gives up on it (a timeout around it, a cancelled task) drops that wait,
    as it drops an ask, instead of leaving it to poll the store until the
    promise settles (an hour by default)."""
    upper = GatedUpper()
    async with Node(promises=promises) as node:
        node.pool("slow").handler(upper)
        first = node.ask_durable("slow", "hi")
        await asyncio.sleep(0.01)
        assert node._current is not None
        driver = node._current[1]
        before = driver.live()
        for _ in range(200):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(node.await_durable(first.id), 0.001)
        again = node.ask_durable("slow", "hi", request_id=first.id)
        again.cancel()
        with pytest.raises(asyncio.CancelledError):
            await again
        await asyncio.sleep(0.05)
        assert driver.live() <= before, (before, driver.live())
        upper.go.set()
        assert await first == "HI"
        assert upper.runs == 1


async def test_an_equal_message_that_pickles_differently_is_the_same_request(
    promises: Promises,
) -> None:
    """Pickle is not canonical: equal sets pickle in hash order. Asked again
    under its id with an equal message, a durable ask is the same request;
    with another message it is still a PayloadMismatchError."""
    a, b = {0, 8}, {8, 0}
    assert a == b and pickle.dumps(a) != pickle.dumps(b)
    runs = 0
    async with Node(promises=promises) as node:
        pool = node.pool("p")

        @pool.handler
        async def handle(msg: set[int], ctx: Context) -> list[int]:
            nonlocal runs
            runs += 1
            return sorted(msg)

        rid = "0123456789abcdef0123456789abcdef"
        assert await node.ask_durable("p", a, request_id=rid) == [0, 8]
        assert await node.ask_durable("p", b, request_id=rid) == [0, 8]
        assert runs == 1
        with pytest.raises(askpool.PayloadMismatchError):
            await node.ask_durable("p", {0, 9}, request_id=rid)


async def test_a_durable_ask_runs_its_stored_message(promises: Promises) -> None:
    """The handler gets the message as stored, on its first run as after a
    restart: a change made to the object after the ask does not reach it."""
    seen: list[object] = []
    async with Node(promises=promises) as node:
        pool = node.pool("p")

        @pool.handler
        async def handle(msg: dict[str, int], ctx: Context) -> int:
            seen.append(msg)
            return msg["n"]

        message = {"n": 3}
        asked = node.ask_durable("p", message)
        message["n"] = 4
        assert await asked == 3
        assert seen == [{"n": 3}] and seen[0] is not message


async def test_an_equal_message_of_other_types_is_another_request(promises: Promises) -> None:
    """``1 == True``, but a durable ask of ``{"qty": True}`` under the id of
    ``{"qty": 1}`` is another message: PayloadMismatchError."""
    async with Node(promises=promises) as node:
        pool = node.pool("p")

        @pool.handler
        async def handle(msg: Any, ctx: Context) -> Any:
            return msg

        rid = "0123456789abcdef0123456789abcdee"
        assert await node.ask_durable("p", {"qty": 1}, request_id=rid) == {"qty": 1}
        for other in ({"qty": True}, {"qty": 1.0}):
            with pytest.raises(askpool.PayloadMismatchError):
                await node.ask_durable("p", other, request_id=rid)
