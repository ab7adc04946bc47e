package askpool

import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import kotlin.time.Duration
import kotlin.time.Duration.Companion.minutes
import kotlin.time.Duration.Companion.seconds

data class NodeOptions(
    /** Timeout of an ask that sets none. */
    val defaultTimeout: Duration = 30.seconds,
    /** Total sends of an ask, the first included. */
    val maxAttempts: Int = 4,
    /** Whether asks record their ACK stages ([AskHandle.stages]). */
    val trackStages: Boolean = true,
    val dlqCapacity: Int = 1_000,
    /** A circuit breaker per target pool: failures open it, asks then fail fast (`Unavailable`). */
    val circuitBreaker: Boolean = true,
)

data class PoolOptions(
    /** Requests the pool's handler runs at once. */
    val concurrency: Int = 1,
    /** Admitted, unfinished requests allowed before `BufferFull`. */
    val maxInFlight: Int = 10_000,
    /** Finished requests remembered to answer duplicates. */
    val dedupCapacity: Int = 100_000,
    val dedupTtl: Duration = 2.minutes,
    /** A request still running after this is cancelled (null: the node's). */
    val processingTimeout: Duration? = null,
    /** Where handlers run; the runtime's threads never run host code. */
    val dispatcher: CoroutineDispatcher = Dispatchers.Default,
)

/**
 * The options of one ask.
 *
 * [fingerprint] guards a reused [requestId] against another payload: an
 * ask whose request id was already used with a different fingerprint fails
 * with [AskException.PayloadMismatch] instead of getting the other
 * payload's reply. A `ByteArray` message under a [requestId] is
 * fingerprinted by its own bytes when no [fingerprint] is given; any other
 * JVM object has no bytes to hash (it passes by reference), so give it an
 * explicit [fingerprint] (any bytes that identify its content, e.g. its
 * serialized form or a digest) when you reuse request ids. An ask with a
 * fingerprint reusing an id first used without one fails too (fail
 * closed); an ask without one is not checked.
 */
data class AskOptions(
    val timeout: Duration? = null,
    val preferredWorker: String? = null,
    /** Reuse an id (32 hex digits) to be deduplicated across retries or restarts. */
    val requestId: String? = null,
    val correlationId: String? = null,
    /** The request id (32 hex digits) of the message that caused this ask. */
    val causationId: String? = null,
    /** Bytes identifying the payload, hashed into its fingerprint (see the class doc). */
    val fingerprint: ByteArray? = null,
    val maxAttempts: Int? = null,
) {
    /** Whether the primitive-only fast path can carry these options. */
    internal val simple: Boolean
        get() = preferredWorker == null && requestId == null && correlationId == null &&
            causationId == null && fingerprint == null && maxAttempts == null

    internal fun toArgs(stages: Boolean, oneWay: Boolean) = askpool.ffi.AskArgs(
        timeoutMs = timeout?.inWholeMilliseconds?.toULong(),
        preferredWorker = preferredWorker,
        requestId = requestId,
        correlationId = correlationId,
        causationId = causationId,
        fingerprint = fingerprint,
        maxAttempts = maxAttempts?.toUInt(),
        stages = stages,
        oneWay = oneWay,
    )
}

/**
 * The options of one tell; [fingerprint] as in [AskOptions] (a `ByteArray`
 * message under a [requestId] is fingerprinted by its bytes, any other
 * object needs an explicit one).
 */
data class TellOptions(
    val timeout: Duration? = null,
    val requestId: String? = null,
    /** Bytes identifying the payload, hashed into its fingerprint. */
    val fingerprint: ByteArray? = null,
    val maxAttempts: Int? = null,
) {
    internal fun toArgs() = askpool.ffi.AskArgs(
        timeoutMs = timeout?.inWholeMilliseconds?.toULong(),
        preferredWorker = null,
        requestId = requestId,
        correlationId = null,
        causationId = null,
        fingerprint = fingerprint,
        maxAttempts = maxAttempts?.toUInt(),
        stages = false,
        oneWay = true,
    )
}
