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

data class AskOptions(
    val timeout: Duration? = null,
    val preferredWorker: String? = null,
    /** Reuse an id (32 hex digits) to be deduplicated across retries or restarts. */
    val requestId: String? = null,
    val correlationId: String? = null,
    val maxAttempts: Int? = null,
) {
    /** Whether the primitive-only fast path can carry these options. */
    internal val simple: Boolean
        get() = preferredWorker == null && requestId == null && correlationId == null && maxAttempts == null

    internal fun toArgs(stages: Boolean, oneWay: Boolean) = askpool.ffi.AskArgs(
        timeoutMs = timeout?.inWholeMilliseconds?.toULong(),
        preferredWorker = preferredWorker,
        requestId = requestId,
        correlationId = correlationId,
        maxAttempts = maxAttempts?.toUInt(),
        stages = stages,
        oneWay = oneWay,
    )
}

data class TellOptions(
    val timeout: Duration? = null,
    val requestId: String? = null,
    val maxAttempts: Int? = null,
)
