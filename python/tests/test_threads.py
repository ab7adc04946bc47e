"""The extension used from threads that come and go: the allocator it links
must not tie itself to the first thread that used it."""

from __future__ import annotations

import subprocess
import sys

# Run in a child: the failure this guards against is the process dying.
CHILD = """
import asyncio, threading

def work(i):
    import askpool

    async def main():
        async with askpool.Node() as node:
            pool = node.pool("p")

            @pool.handler
            async def echo(msg, ctx):
                return msg

            for _ in range(20):
                assert await node.ask("p", i) == i

    asyncio.run(main())

for i in range(30):
    t = threading.Thread(target=work, args=(i,))
    t.start()
    t.join()
print("done")
"""


def test_first_use_from_short_lived_threads_does_not_crash() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.strip() == "done"
