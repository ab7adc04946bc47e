"""Durable promises: records that outlive processes (SQLite by default)."""

from __future__ import annotations

import asyncio
import os
from typing import Any, NamedTuple, Optional, Union

from . import _native


class Promise(NamedTuple):
    """A durable promise as the store holds it (a snapshot: ``get`` it again
    to see later changes)."""

    id: str
    #: "pending", "resolved", "rejected", "canceled" or "timedout".
    state: str
    #: What it was created with.
    param: bytes
    #: What it was settled with; None while pending or once timed out.
    value: Optional[bytes]
    #: Unix milliseconds.
    timeout_at: int
    tags: dict[str, str]
    #: Unix milliseconds.
    created_at: int
    #: Unix milliseconds; None while pending.
    settled_at: Optional[int]

    @property
    def settled(self) -> bool:
        """Whether it is no longer pending (resolved, rejected, canceled or
        timed out)."""
        return self.state != "pending"


class Promises:
    """A promise store: ``Promises.open(path)`` (SQLite, shared by processes
    that open the same file) or ``Promises.memory()``. Pass it to
    ``Node(promises=...)`` for durable asks."""

    def __init__(self, native: _native.NativePromises) -> None:
        self._native = native

    @classmethod
    def open(
        cls, path: Union[str, os.PathLike[str]], *, durable_timeout: float = 3600.0
    ) -> Promises:
        """``durable_timeout``: seconds a durable ask's promise stays pending
        at most; at least 0.001 (``InvalidArgumentError`` otherwise)."""
        return cls(_native.NativePromises.sqlite(os.fspath(path), durable_timeout))

    @classmethod
    def memory(cls) -> Promises:
        """A store in memory, gone with the process (for tests)."""
        return cls(_native.NativePromises.memory())

    def create(
        self,
        id: str,
        *,
        timeout: float,
        param: bytes = b"",
        key: Optional[str] = None,
        strict: bool = False,
        tags: Optional[dict[str, str]] = None,
    ) -> Promise:
        """A promise pending for ``timeout`` seconds. A repeat with the same
        ``key`` returns the existing promise; another key is refused
        (``FailedPreconditionError``)."""
        return Promise(*self._native.create(id, timeout, param, key, strict, tags))

    def get(self, id: str) -> Promise:
        """The promise (``InvalidArgumentError`` if there is none)."""
        return Promise(*self._native.get(id))

    def resolve(self, id: str, value: bytes = b"", *, key: Optional[str] = None) -> Promise:
        """Settles pending promise ``id`` as resolved with ``value`` and
        returns it; its waiters in this process wake at once. See ``cancel``
        for ``key`` and the errors."""
        return Promise(*self._native.complete(id, "resolve", value, key))

    def reject(self, id: str, value: bytes = b"", *, key: Optional[str] = None) -> Promise:
        """Settles pending promise ``id`` as rejected with ``value``, as
        ``resolve`` does."""
        return Promise(*self._native.complete(id, "reject", value, key))

    def cancel(self, id: str, value: bytes = b"", *, key: Optional[str] = None) -> Promise:
        """Settles pending promise ``id`` as canceled with ``value``, as
        ``resolve`` does. A completion with the ``key`` of the one that
        settled the promise returns it unchanged; any other completion of a
        settled promise raises ``FailedPreconditionError``, and an unknown
        ``id`` ``InvalidArgumentError``. A promise past its timeout
        is returned timed out, not settled again."""
        return Promise(*self._native.complete(id, "cancel", value, key))

    def prune(self, older_than: float) -> int:
        """Deletes the promises settled more than ``older_than`` seconds ago
        (after timing out the pending ones past their timeout) and returns
        how many. The store keeps every promise until pruned: call this on a
        schedule, with a retention period. A pruned durable ask is
        forgotten: asked again under its id, it runs again."""
        return self._native.prune(older_than)

    async def wait(
        self, id: str, *, timeout: Optional[float] = None, poll: float = 0.01
    ) -> Promise:
        """Waits until the promise is settled and returns it (timed out, once
        its own timeout passes). A completion through this store (a durable
        ask's outcome included) ends the wait at once; one made elsewhere (by
        another process, or another ``Promises`` on the same file) is found
        by looking at the store every ``poll`` seconds. ``timeout``: seconds
        before ``AskTimeoutError`` (None: no limit). The wait runs off the
        event loop (the loop is never blocked), and cancelling the awaiting
        task ends it. Negative or NaN seconds are ``InvalidArgumentError``;
        so is an unknown ``id``."""
        from ._node import _driver, _running_loop

        loop = _running_loop("Promises.wait")
        target: asyncio.Future[Optional[_native._PromiseTuple]] = loop.create_future()
        native = self._native.wait(_driver(loop), target, id, timeout, poll)
        try:
            record = await target
        finally:
            # Over already, unless the awaiting task was cancelled: then the
            # wait ends here, and the driver lets go of it.
            native.cancel()
        if record is None:
            from ._errors import AskTimeoutError

            raise AskTimeoutError(f"promise {id!r} still pending after {timeout} s")
        return Promise(*record)


def _same_message(stored: Any, asked: Any) -> bool:
    """Whether a durable ask's message ``asked`` is the one ``stored`` under
    its id, whose pickle differs (pickle is not canonical: a set pickles in
    hash order). Of the same types all the way down, not just ``==``:
    ``1 == 1.0 == True`` are three messages."""
    if type(stored) is not type(asked):
        return False
    if isinstance(stored, dict):
        return stored.keys() == asked.keys() and all(
            _same_message(stored[k], asked[k]) for k in stored
        )
    if isinstance(stored, (list, tuple)):
        return len(stored) == len(asked) and all(
            _same_message(a, b) for a, b in zip(stored, asked)
        )
    if isinstance(stored, (set, frozenset)):
        return bool(stored == asked) and {type(x) for x in stored} == {type(x) for x in asked}
    return bool(stored == asked)
