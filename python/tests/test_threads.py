"""The extension used from threads that come and go: the allocator it links
must not tie itself to the first thread that used it."""

from __future__ import annotations

import subprocess
import sys
import tempfile

# Run in a child: the failure this guards against is the process dying.
# A failure in a thread only prints its traceback: the child counts the
# asks answered, and ends at once, non-zero, on any exception in a thread.
CHILD = """
import asyncio, os, threading

answered = 0

def fail(args):
    threading.__excepthook__(args)
    os._exit(3)

threading.excepthook = fail

def work(i):
    global answered
    import askpool

    async def main():
        global answered
        async with askpool.Node() as node:
            pool = node.pool("p")

            @pool.handler
            async def echo(msg, ctx):
                return msg

            for _ in range(20):
                assert await node.ask("p", i) == i
                answered += 1

    asyncio.run(main())

for i in range(30):
    t = threading.Thread(target=work, args=(i,))
    t.start()
    t.join()
print("done", answered)
"""


def test_first_use_from_short_lived_threads_does_not_crash() -> None:
    with tempfile.TemporaryDirectory() as where:
        out = subprocess.run(
            [sys.executable, "-c", CHILD],
            capture_output=True,
            text=True,
            timeout=300,
            # Not python/: `-c` would import the sources, not the wheel (the
            # child then failed in every thread, unseen before it counted).
            cwd=where,
        )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == "done 600"
