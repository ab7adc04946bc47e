"""The askpool error taxonomy as exceptions that subclass the matching builtins."""

from __future__ import annotations

from typing import Any, Optional


class AskpoolError(Exception):
    """Base of every askpool error; ``code`` is the taxonomy's stable name."""

    code: str = "INTERNAL"
    #: The code's class in the taxonomy: "TRANSIENT" (retry), "PERMANENT"
    #: (don't) or "POISON" (to the dead-letter queue).
    error_class: str = "PERMANENT"
    #: Whether retrying can change the result (the error class is Transient).
    transient: bool = False


class UnavailableError(AskpoolError, ConnectionError):
    code = "UNAVAILABLE"
    error_class = "TRANSIENT"
    transient = True


class DeadlineExceededError(AskpoolError, TimeoutError):
    code = "DEADLINE_EXCEEDED"
    error_class = "TRANSIENT"
    transient = True


class AskTimeoutError(AskpoolError, TimeoutError):
    code = "ASK_TIMEOUT"
    error_class = "TRANSIENT"
    transient = True


class BufferFullError(AskpoolError, RuntimeError):
    code = "BUFFER_FULL"
    error_class = "TRANSIENT"
    transient = True


class NoRouteError(AskpoolError, LookupError):
    code = "NO_ROUTE"


class InvalidArgumentError(AskpoolError, ValueError):
    code = "INVALID_ARGUMENT"


class ValidationError(AskpoolError, ValueError):
    code = "VALIDATION_ERROR"


class PayloadMismatchError(AskpoolError, ValueError):
    code = "PAYLOAD_MISMATCH"


class PermissionDeniedError(AskpoolError, PermissionError):
    code = "PERMISSION_DENIED"


class OversizePayloadError(AskpoolError, ValueError):
    code = "OVERSIZE_PAYLOAD"


class FailedPreconditionError(AskpoolError, RuntimeError):
    code = "FAILED_PRECONDITION"


class DecodeFailureError(AskpoolError, ValueError):
    code = "DECODE_FAILURE"
    error_class = "POISON"


class InternalError(AskpoolError, RuntimeError):
    code = "INTERNAL"


class AskCancelledError(AskpoolError, RuntimeError):
    """The ask was cancelled by the other side (the worker, its pool, a
    shutdown). A caller that cancels its own ask gets ``asyncio.CancelledError``
    instead, as asyncio does."""

    code = "ASK_CANCELLED"


class HandlerError(AskpoolError, RuntimeError):
    """The handler raised: ``type_name`` and ``message`` are the original
    exception's class name and ``str()``."""

    code = "HANDLER_FAILED"

    def __init__(self, text: str, type_name: str, message: str) -> None:
        super().__init__(text)
        self.type_name = type_name
        self.message = message

    def __reduce__(
        self,
    ) -> tuple[type[HandlerError], tuple[str, str, str], dict[str, Any]]:
        # Pickling rebuilds an exception from ``args`` (the text alone) by
        # default, which this ``__init__`` refuses: pickle and copy would fail.
        text = str(self.args[0]) if self.args else ""
        return (type(self), (text, self.type_name, self.message), self.__dict__)


class NoRunningLoopError(AskpoolError, RuntimeError):
    """An async API was called from a thread with no running event loop."""

    code = "FAILED_PRECONDITION"


ERRORS: dict[str, type[AskpoolError]] = {
    cls.code: cls
    for cls in (
        UnavailableError,
        DeadlineExceededError,
        AskTimeoutError,
        BufferFullError,
        NoRouteError,
        InvalidArgumentError,
        ValidationError,
        PayloadMismatchError,
        PermissionDeniedError,
        OversizePayloadError,
        FailedPreconditionError,
        DecodeFailureError,
        InternalError,
        AskCancelledError,
        HandlerError,
    )
}


def from_native(
    code: str, text: str, type_name: Optional[str], handler_message: Optional[str]
) -> AskpoolError:
    """Called by the extension to build the exception for an error code."""
    if code == HandlerError.code:
        return HandlerError(text, type_name or "", handler_message or "")
    return ERRORS.get(code, InternalError)(text)
