package askpool

import askpool.ffi.CancelCause
import askpool.ffi.Failure
import askpool.ffi.Fault

/** The error classes of the taxonomy: retry, don't, or dead-letter. */
enum class ErrorClass { TRANSIENT, PERMANENT, POISON }

/**
 * Every way an ask fails, one subclass per code of the askpool taxonomy.
 * [code] is the stable name shared by every binding (`ASK_TIMEOUT`, ...).
 */
sealed class AskException(message: String, val code: String, val errorClass: ErrorClass) :
    RuntimeException(message) {
    class Unavailable(val reason: String, message: String = "unavailable: $reason") :
        AskException(message, "UNAVAILABLE", ErrorClass.TRANSIENT)
    class DeadlineExceeded(message: String = "deadline exceeded") :
        AskException(message, "DEADLINE_EXCEEDED", ErrorClass.TRANSIENT)
    class AskTimeout(val elapsedMs: Long, message: String = "ask timed out after $elapsedMs ms") :
        AskException(message, "ASK_TIMEOUT", ErrorClass.TRANSIENT)
    class BufferFull(val pool: String, val limit: Long, message: String = "pool \"$pool\" is full") :
        AskException(message, "BUFFER_FULL", ErrorClass.TRANSIENT)
    class NoRoute(val pool: String, message: String = "no route to pool \"$pool\"") :
        AskException(message, "NO_ROUTE", ErrorClass.PERMANENT)
    class InvalidArgument(val detail: String, message: String = "invalid argument: $detail") :
        AskException(message, "INVALID_ARGUMENT", ErrorClass.PERMANENT)
    class ValidationError(val detail: String, message: String = "validation failed: $detail") :
        AskException(message, "VALIDATION_ERROR", ErrorClass.PERMANENT)
    class PayloadMismatch(message: String = "request id reused with a different payload") :
        AskException(message, "PAYLOAD_MISMATCH", ErrorClass.PERMANENT)
    class PermissionDenied(val detail: String, message: String = "permission denied: $detail") :
        AskException(message, "PERMISSION_DENIED", ErrorClass.PERMANENT)
    class OversizePayload(val size: Long, val limit: Long, message: String = "payload of $size bytes exceeds $limit") :
        AskException(message, "OVERSIZE_PAYLOAD", ErrorClass.PERMANENT)
    class FailedPrecondition(val detail: String, message: String = "failed precondition: $detail") :
        AskException(message, "FAILED_PRECONDITION", ErrorClass.PERMANENT)
    class DecodeFailure(val detail: String, message: String = "cannot decode message: $detail") :
        AskException(message, "DECODE_FAILURE", ErrorClass.POISON)
    class Internal(val detail: String, message: String = "internal error: $detail") :
        AskException(message, "INTERNAL", ErrorClass.PERMANENT)
    class AskCancelled(val reason: CancelReason, message: String = "ask cancelled: $reason") :
        AskException(message, "ASK_CANCELLED", ErrorClass.PERMANENT)
    /** A handler threw: [typeName] is its exception's class name. */
    class HandlerFailed(val typeName: String, val handlerMessage: String, message: String = "handler failed with $typeName: $handlerMessage") :
        AskException(message, "HANDLER_FAILED", ErrorClass.PERMANENT)

    /** As a fault to send: its text made valid Unicode ([validText]), which the native side requires. */
    internal fun toFault(): Fault = when (this) {
        is Unavailable -> Fault.Unavailable(validText(reason))
        is DeadlineExceeded -> Fault.DeadlineExceeded
        is AskTimeout -> Fault.AskTimeout(elapsedMs.toULong())
        is BufferFull -> Fault.BufferFull(validText(pool), limit.toULong())
        is NoRoute -> Fault.NoRoute(validText(pool))
        is InvalidArgument -> Fault.InvalidArgument(validText(detail))
        is ValidationError -> Fault.ValidationError(validText(detail))
        is PayloadMismatch -> Fault.PayloadMismatch
        is PermissionDenied -> Fault.PermissionDenied(validText(detail))
        is OversizePayload -> Fault.OversizePayload(size.toULong(), limit.toULong())
        is FailedPrecondition -> Fault.FailedPrecondition(validText(detail))
        is DecodeFailure -> Fault.DecodeFailure(validText(detail))
        is Internal -> Fault.Internal(validText(detail))
        is AskCancelled -> Fault.AskCancelled(reason.cause)
        is HandlerFailed -> Fault.HandlerFailed(validText(typeName), validText(handlerMessage))
    }

    internal companion object {
        fun of(failure: Failure): AskException {
            val m = failure.message
            return when (val f = failure.fault) {
                is Fault.Unavailable -> Unavailable(f.reason, m)
                is Fault.DeadlineExceeded -> DeadlineExceeded(m)
                is Fault.AskTimeout -> AskTimeout(f.elapsedMs.toLong(), m)
                is Fault.BufferFull -> BufferFull(f.pool, f.limit.toLong(), m)
                is Fault.NoRoute -> NoRoute(f.pool, m)
                is Fault.InvalidArgument -> InvalidArgument(f.message, m)
                is Fault.ValidationError -> ValidationError(f.message, m)
                is Fault.PayloadMismatch -> PayloadMismatch(m)
                is Fault.PermissionDenied -> PermissionDenied(f.message, m)
                is Fault.OversizePayload -> OversizePayload(f.size.toLong(), f.limit.toLong(), m)
                is Fault.FailedPrecondition -> FailedPrecondition(f.message, m)
                is Fault.DecodeFailure -> DecodeFailure(f.message, m)
                is Fault.Internal -> Internal(f.message, m)
                is Fault.AskCancelled -> AskCancelled(CancelReason.of(f.reason), m)
                is Fault.HandlerFailed -> HandlerFailed(f.typeName, f.message, m)
            }
        }

        /** What a handler's exception becomes for its caller. */
        fun fromHandler(e: Throwable): Fault = when (e) {
            // The mapping every binding shares: a message-only code is kept,
            // one describing an ask (timeout, route, ...) becomes HandlerFailed.
            is AskException -> askpool.ffi.handlerFault(e.toFault(), e.javaClass.name, messageOf(e))
            else -> Fault.HandlerFailed(e.javaClass.name, messageOf(e))
        }

        /**
         * [e]'s message, "" if none, as valid Unicode ([validText]); a
         * `message` getter that throws does not stop the failure.
         */
        fun messageOf(e: Throwable): String = try {
            validText(e.message ?: "")
        } catch (t: Throwable) {
            "(its message threw ${t.javaClass.name})"
        }

        /** Runs a synchronous native call, mapping its errors and panics. */
        inline fun <T> native(call: () -> T): T = try {
            call()
        } catch (e: askpool.ffi.NativeException.Ask) {
            throw of(e.failure)
        } catch (e: askpool.ffi.InternalException) {
            throw Internal(e.message ?: "panic", "internal error: ${e.message}")
        } catch (e: java.nio.charset.CharacterCodingException) {
            throw InvalidArgument(notUnicode(e))
        }
    }
}

/** Why a string argument that is not valid Unicode is refused. */
private const val NOT_UNICODE = "a string argument is not valid Unicode (an unpaired UTF-16 surrogate)"

/**
 * What a string argument that is not valid Unicode (an unpaired UTF-16
 * surrogate, which UTF-8 cannot carry) is told: the generated code refuses
 * it on its way to the native side, before anything starts.
 */
internal fun notUnicode(e: java.nio.charset.CharacterCodingException): String = "$NOT_UNICODE: $e"

/**
 * Refuses, as [notUnicode] does, a string argument that is not valid
 * Unicode, before a call registers anything (a payload's handle the native
 * side would never take, the generated code refusing the string first).
 */
internal fun checkUnicode(vararg strings: String?) {
    for (s in strings) {
        val valid = s?.let(::validText)
        if (valid !== s) throw AskException.InvalidArgument("$NOT_UNICODE: $valid")
    }
}

/**
 * [s] with every unpaired UTF-16 surrogate replaced by U+FFFD (the same
 * object when it has none): text that only describes (a handler's error
 * message, a progress note) still crosses to the native side, which takes
 * valid Unicode only.
 */
internal fun validText(s: String): String {
    if (s.none { it.isSurrogate() }) return s
    val out = StringBuilder(s.length)
    var replaced = false
    var i = 0
    while (i < s.length) {
        val c = s[i]
        if (c.isHighSurrogate() && i + 1 < s.length && s[i + 1].isLowSurrogate()) {
            out.append(c).append(s[i + 1])
            i += 2
            continue
        }
        if (c.isSurrogate()) {
            out.append('\uFFFD')
            replaced = true
        } else {
            out.append(c)
        }
        i++
    }
    return if (replaced) out.toString() else s
}

/** Who cancelled an ask. */
enum class CancelReason(internal val cause: CancelCause) {
    CALLER(CancelCause.CALLER),
    CALLER_TIMEOUT(CancelCause.CALLER_TIMEOUT),
    WORKER(CancelCause.WORKER),
    PROCESSING_TIMEOUT(CancelCause.PROCESSING_TIMEOUT),
    SHUTDOWN(CancelCause.SHUTDOWN);

    internal companion object {
        fun of(cause: CancelCause) = entries.first { it.cause == cause }
    }
}
