"""Type stubs of the extension module (bindings/python)."""

import asyncio
import contextvars
from typing import Any, Callable, Optional, final

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Context",
    "LoopDriver",
    "NativeAsk",
    "NativeDurable",
    "NativeNode",
    "NativePool",
    "NativePromises",
    "NativeWait",
    "Reply",
    "register_dispatch",
    "register_error_factory",
    "_panic",
    "_live_pools",
    "_release_freed_memory",
    "_panic_in_next_dispatch",
    "_send_through_method",
    "_send_in",
    "_step_as",
    "_soon",
    "Soon",
    "_cancel_standing",
    "_after_fork_in_child",
    "_interpreter_exiting",
]

DEFAULT_MAX_PAYLOAD_BYTES: int

def register_error_factory(
    factory: Callable[[str, str, Optional[str], Optional[str]], BaseException],
) -> None: ...
def register_dispatch(
    failure: Callable[[BaseException], Optional[tuple[str, str, Optional[str]]]],
) -> None: ...
def _panic(message: str) -> None: ...
def _live_pools() -> int: ...
def _release_freed_memory() -> None: ...
def _panic_in_next_dispatch(message: str) -> None: ...
def _send_through_method(on: bool) -> None: ...
def _cancel_standing(task: asyncio.Task[Any]) -> bool: ...
def _send_in(context: contextvars.Context, coro: Any, value: Any) -> tuple[bool, Any]: ...
def _step_as(
    event_loop: asyncio.AbstractEventLoop,
    task: asyncio.Task[Any],
    coro: Any,
    reply: Reply,
) -> tuple[bool, Any]: ...
def _soon(
    event_loop: asyncio.AbstractEventLoop,
    callback: Callable[[Any], object],
    arg: Any,
    context: Optional[contextvars.Context],
) -> None: ...
@final
class Soon:
    _cancelled: bool
    _callback: Any
    def _run(self) -> None: ...

def _after_fork_in_child() -> None: ...
def _interpreter_exiting() -> None: ...

@final
class LoopDriver:
    def __new__(cls) -> LoopDriver: ...
    def fileno(self) -> int: ...
    def drain(self) -> None: ...
    def release(self) -> None: ...
    def close(self) -> None: ...
    def queued(self) -> int: ...
    def live(self) -> int: ...

@final
class Context:
    @property
    def request_id(self) -> str: ...
    @property
    def correlation_id(self) -> str: ...
    @property
    def causation_id(self) -> Optional[str]: ...
    @property
    def pool(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def cancelled(self) -> bool: ...
    def progress(self, fraction: float, note: Optional[str] = None) -> None: ...
    def wait_cancelled(self) -> asyncio.Future[None]: ...

@final
class Reply:
    def ok(self, value: Any) -> None: ...
    def error(self, type_name: str, message: str, code: Optional[str] = None) -> None: ...
    def cancelled(self) -> None: ...

@final
class NativeAsk:
    @property
    def request_id(self) -> str: ...
    @property
    def correlation_id(self) -> str: ...
    def cancel(self) -> None: ...
    def next_stage(self, driver: LoopDriver, target: asyncio.Future[Any]) -> None: ...

@final
class NativeDurable:
    @property
    def id(self) -> str: ...
    def next_stage(self, driver: LoopDriver, target: asyncio.Future[Any]) -> None: ...

@final
class NativePool:
    @property
    def name(self) -> str: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...

@final
class NativeNode:
    def __new__(
        cls,
        default_timeout: Optional[float] = None,
        dlq_capacity: Optional[int] = None,
        track_stages: bool = True,
        circuit_breaker: bool = True,
        max_payload_bytes: Optional[int] = ...,
    ) -> NativeNode: ...
    @property
    def caller_id(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def ask(
        self,
        driver: LoopDriver,
        target: asyncio.Future[Any],
        pool: str,
        msg: Any,
        timeout: Optional[float] = None,
        options: Optional[
            tuple[Optional[str], Optional[str], Optional[str], Optional[str], Optional[int]]
        ] = None,
    ) -> NativeAsk: ...
    def ask_sync(
        self,
        pool: str,
        msg: Any,
        timeout: Optional[float] = None,
        options: Optional[
            tuple[Optional[str], Optional[str], Optional[str], Optional[str], Optional[int]]
        ] = None,
    ) -> Any: ...
    def tell(
        self,
        driver: LoopDriver,
        target: asyncio.Future[str],
        pool: str,
        msg: Any,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
        correlation_id: Optional[str] = None,
        causation_id: Optional[str] = None,
    ) -> None: ...
    def pool(
        self,
        driver: LoopDriver,
        name: str,
        new_slot: Callable[[], Any],
        concurrency: int,
        max_in_flight: Optional[int] = None,
        reply_cache: Optional[int] = None,
        reply_ttl: Optional[float] = None,
    ) -> NativePool: ...
    def stats(self) -> dict[str, Any]: ...
    def ask_durable(
        self,
        driver: LoopDriver,
        target: asyncio.Future[Any],
        promises: NativePromises,
        pool: str,
        msg: Any,
        request_id: Optional[str] = None,
    ) -> NativeDurable: ...
    def await_durable(
        self,
        driver: LoopDriver,
        target: asyncio.Future[Any],
        promises: NativePromises,
        id: str,
    ) -> NativeDurable: ...
    def dead_letters(
        self,
    ) -> list[tuple[str, str, str, Any, Any, int, str, str]]: ...
    def replay_dead_letter(
        self, driver: LoopDriver, target: asyncio.Future[Any], request_id: str
    ) -> NativeAsk: ...
    def purge_dead_letters(self) -> int: ...
    def shutdown(self) -> None: ...

_PromiseTuple = tuple[
    str, str, bytes, Optional[bytes], int, dict[str, str], int, Optional[int]
]

@final
class NativePromises:
    @staticmethod
    def sqlite(path: str, durable_timeout: float = 3600.0) -> NativePromises: ...
    @staticmethod
    def memory() -> NativePromises: ...
    def create(
        self,
        id: str,
        timeout: float,
        param: bytes = ...,
        key: Optional[str] = None,
        strict: bool = False,
        tags: Optional[dict[str, str]] = None,
    ) -> _PromiseTuple: ...
    def get(self, id: str) -> _PromiseTuple: ...
    def complete(
        self, id: str, how: str, value: bytes = ..., key: Optional[str] = None
    ) -> _PromiseTuple: ...
    def prune(self, older_than: float) -> int: ...
    def wait(
        self,
        driver: LoopDriver,
        target: asyncio.Future[Optional[_PromiseTuple]],
        id: str,
        timeout: Optional[float] = None,
        poll: float = 0.01,
    ) -> NativeWait: ...
    def _waits(self) -> int: ...

@final
class NativeWait:
    def cancel(self) -> None: ...
