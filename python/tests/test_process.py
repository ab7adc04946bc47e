"""The process around a Node: a fork's child, and the interpreter's exit
with a thread still blocked in ``ask_sync``. Each runs in a child process,
whose end (its exit code, what it printed) is what is checked."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest


def _run(script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as where:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script).replace("# HOST\n", _HOST)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=where,  # not python/: `-c` would import the sources, not the wheel
        )


#: A Node whose pool "p" is served by a daemon thread's event loop; its
#: handler sleeps SLEEP seconds, then answers with the message. `_run` puts
#: it in a script in place of a `# HOST` line.
_HOST = """
node = askpool.Node()
ready = threading.Event()

def host():
    async def main():
        pool = node.pool("p")

        @pool.handler
        async def handle(msg, ctx):
            await asyncio.sleep(SLEEP)
            return msg

        ready.set()
        await asyncio.sleep(100)

    asyncio.run(main())

threading.Thread(target=host, daemon=True).start()
"""


def test_asyncio_run_ends_when_a_handler_takes_its_shutdown_cancel_back() -> None:
    # asyncio.run cancels the tasks left at its end, a slot's task among
    # them while its handler runs; a handler that catches that cancel and
    # returns (or whose wait_for swallows it) ends its request. Before
    # 3.11, whose tasks count no cancels, the slot's task then waited for a
    # next request, and asyncio.run for it, for good.
    done = _run(
        """
        import asyncio, askpool

        async def main():
            node = askpool.Node()
            await node.__aenter__()
            started = asyncio.Event()

            @node.pool("p").handler
            async def handle(msg, ctx):
                started.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    return "took the cancel back"

            asyncio.ensure_future(node.ask("p", 1, timeout=60))
            await started.wait()

        asyncio.run(main())
        print("asyncio.run returned", flush=True)
        """,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "asyncio.run returned" in done.stdout


def test_exit_with_a_daemon_thread_in_ask_sync_is_clean() -> None:
    # Before: taking the GIL back during finalization made CPython end the
    # thread by an unwinding that aborted the process ("FATAL: exception
    # not rethrown", exit code 134), at every exit.
    done = _run(
        """
        import asyncio, threading, time, askpool
        SLEEP = 100
        # HOST
        ready.wait()
        threading.Thread(target=lambda: node.ask_sync("p", 1, timeout=60), daemon=True).start()
        time.sleep(0.3)
        # The thread is in its ask, waiting, as the process exits.
        print("pending", node.stats()["pending"], flush=True)
        print("main thread returns", flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pending 1" in done.stdout, done.stdout
    assert "main thread returns" in done.stdout
    assert "FATAL" not in done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_fork_child_makes_its_own_node_and_refuses_the_parents() -> None:
    # Before: the child had none of the runtime's threads, so no timer
    # fired there: an ask with a 1 s timeout waited for good, in a new
    # Node as in the parent's.
    done = _run(
        """
        import asyncio, os, time, askpool

        node = askpool.Node()

        async def serve(n):
            pool = n.pool("p")

            @pool.handler
            async def handle(msg, ctx):
                if msg == "slow":
                    await asyncio.sleep(100)
                return msg

            return pool

        async def parent():
            await serve(node)
            assert await node.ask("p", 1, timeout=2) == 1

        asyncio.run(parent())
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                async def child():
                    try:
                        await node.ask("p", 2, timeout=1)
                    except askpool.FailedPreconditionError as e:
                        print("old node refused:", e, flush=True)
                    try:
                        await serve(node)
                    except askpool.FailedPreconditionError:
                        print("old node pool refused", flush=True)
                    fresh = askpool.Node()
                    await serve(fresh)
                    print("new node ->", await fresh.ask("p", 3, timeout=2), flush=True)
                    started = time.monotonic()
                    try:
                        await fresh.ask("p", "slow", timeout=1)
                    except askpool.AskTimeoutError:
                        print("timed out after", round(time.monotonic() - started), "s", flush=True)
                    fresh.close()

                asyncio.run(child())
                code = 0
            finally:
                os._exit(code)
        for _ in range(300):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                print("child exit", os.waitstatus_to_exitcode(status), flush=True)
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            print("child hung", flush=True)

        async def again():
            await serve(node)
            return await node.ask("p", 4, timeout=2)

        assert asyncio.run(again()) == 4
        print("parent still asks", flush=True)
        """
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "this Node was made before os.fork(); make a new Node" in out, out
    assert "old node pool refused" in out, out
    assert "new node -> 3" in out, out
    assert "timed out after 1 s" in out, out
    assert "child exit 0" in out, out
    assert "parent still asks" in out, out


def test_ask_sync_from_an_exit_hook_still_answers() -> None:
    # atexit hooks run last registered first: one registered before askpool
    # was imported runs after askpool's own hook. Its ask_sync, in the main
    # thread, must still be answered (a first fix parked every thread once
    # the interpreter was exiting, and the process never exited).
    done = _run(
        """
        import atexit, asyncio, threading

        def goodbye():
            print("atexit ->", node.ask_sync("p", "bye", timeout=5), flush=True)

        atexit.register(goodbye)
        import askpool

        SLEEP = 0
        # HOST
        ready.wait()
        print("during ->", node.ask_sync("p", "hi", timeout=5), flush=True)
        """,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "during -> hi" in done.stdout
    assert "atexit -> bye" in done.stdout, done.stdout + done.stderr
