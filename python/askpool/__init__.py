"""askpool: a reliable ask (request/reply) between callers and worker pools,
asyncio-native, with the protocol (ids, retries, acks, dedup, timeouts,
cancellation) in Rust.

    async with askpool.Node() as node:
        pool = node.pool("echo", concurrency=4)

        @pool.handler
        async def echo(msg, ctx):
            return msg

        reply = await node.ask("echo", "hi", timeout=5)
"""

import atexit as _atexit
import os as _os

from . import _dispatch, _native
from ._errors import (
    AskCancelledError,
    AskpoolError,
    AskTimeoutError,
    BufferFullError,
    DeadlineExceededError,
    DecodeFailureError,
    FailedPreconditionError,
    HandlerError,
    InternalError,
    InvalidArgumentError,
    NoRouteError,
    NoRunningLoopError,
    OversizePayloadError,
    PayloadMismatchError,
    PermissionDeniedError,
    UnavailableError,
    ValidationError,
    from_native,
)
from ._node import AskHandle, DeadLetter, DurableHandle, Node, Pool, StageEvent
from ._promises import Promise, Promises
from ._stats import NodeStats, PoolStats

_native.register_error_factory(from_native)
# A fork's child has none of the extension's threads: it starts its own
# runtime, and Nodes made before the fork refuse work there.
_os.register_at_fork(after_in_child=_native._after_fork_in_child)
# Once the interpreter finalizes, a thread must not take the GIL back from
# a blocking ask_sync (CPython would end it by an unwinding that aborts the
# process): told here, before finalization starts.
_atexit.register(_native._interpreter_exiting)
_native.register_dispatch(_dispatch.failure)

#: What a handler receives as its second argument.
Context = _native.Context

__all__ = [
    "AskCancelledError",
    "AskHandle",
    "AskTimeoutError",
    "AskpoolError",
    "BufferFullError",
    "Context",
    "DeadLetter",
    "DeadlineExceededError",
    "DurableHandle",
    "DecodeFailureError",
    "FailedPreconditionError",
    "HandlerError",
    "InternalError",
    "InvalidArgumentError",
    "Node",
    "NodeStats",
    "NoRouteError",
    "NoRunningLoopError",
    "OversizePayloadError",
    "PayloadMismatchError",
    "PermissionDeniedError",
    "Pool",
    "Promise",
    "Promises",
    "PoolStats",
    "StageEvent",
    "UnavailableError",
    "ValidationError",
]
