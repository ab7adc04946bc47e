package askpool

import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import kotlin.time.Duration
import kotlin.time.Duration.Companion.minutes
import kotlin.time.Duration.Companion.seconds

/**
 * Every numeric option is checked when the options are made: a value out of
 * range throws [AskException.InvalidArgument] (never wraps around into a
 * huge unsigned value on the native side).
 */
data class NodeOptions(
    /** Timeout of an ask that sets none; positive. */
    val defaultTimeout: Duration = 30.seconds,
    /** Total sends of an ask, the first included; at least 1. */
    val maxAttempts: Int = 4,
    /** Whether asks record their ACK stages ([AskHandle.stages]). */
    val trackStages: Boolean = true,
    /** Dead letters kept; at least 0. */
    val dlqCapacity: Int = 1_000,
    /** A circuit breaker per target pool: failures open it, asks then fail fast (`Unavailable`). */
    val circuitBreaker: Boolean = true,
    /**
     * The largest `ByteArray` message an ask or tell may carry, in bytes; at
     * least 0, null lifts the bound. A larger one fails at once with
     * [AskException.OversizePayload] and is not sent (its handler never
     * runs). Only a `ByteArray` has a size: any other JVM object passes by
     * reference and is not checked. A durable ask ([askDurable]) is checked
     * by its encoded message, before its promise is stored.
     * Default [DEFAULT_MAX_PAYLOAD_BYTES], the runtime's.
     */
    val maxPayloadBytes: Long? = DEFAULT_MAX_PAYLOAD_BYTES,
) {
    init {
        requirePositive("defaultTimeout", defaultTimeout)
        requireAtLeast("maxAttempts", maxAttempts.toLong(), 1)
        requireAtLeast("dlqCapacity", dlqCapacity.toLong(), 0)
        maxPayloadBytes?.let { requireAtLeast("maxPayloadBytes", it, 0) }
    }

    companion object {
        init {
            // Before the library loads (this is the first call into it of most programs).
            JvmThreads.ensure()
        }

        /** The default [maxPayloadBytes]: the runtime's, 16 MiB. */
        @JvmField
        val DEFAULT_MAX_PAYLOAD_BYTES: Long = askpool.ffi.defaultMaxPayloadBytes().toLong()
    }
}

data class PoolOptions(
    /** Requests the pool's handler runs at once; 1 to [MAX_CONCURRENCY]. */
    val concurrency: Int = 1,
    /** Admitted, unfinished requests allowed before `BufferFull`; at least 1. */
    val maxInFlight: Int = 10_000,
    /** Finished requests remembered to answer duplicates; at least 1. */
    val dedupCapacity: Int = 100_000,
    /** How long a finished request is remembered; not negative. */
    val dedupTtl: Duration = 2.minutes,
    /** A request still running after this is cancelled (null: the node's); positive. */
    val processingTimeout: Duration? = null,
    /**
     * Where handlers run; the runtime's threads never run host code. A
     * caller already running on this dispatcher starts the handler on its
     * own thread (no dispatch) and gets on only when the handler first
     * suspends: a handler that computes or blocks for long holds that
     * caller, past its timeout too. Give such a pool a dispatcher of its own.
     */
    val dispatcher: CoroutineDispatcher = Dispatchers.Default,
) {
    init {
        requireAtLeast("concurrency", concurrency.toLong(), 1)
        if (concurrency > MAX_CONCURRENCY) {
            throw AskException.InvalidArgument("concurrency must be at most $MAX_CONCURRENCY, not $concurrency")
        }
        requireAtLeast("maxInFlight", maxInFlight.toLong(), 1)
        requireAtLeast("dedupCapacity", dedupCapacity.toLong(), 1)
        if (dedupTtl.isNegative()) throw AskException.InvalidArgument("dedupTtl must not be negative, not $dedupTtl")
        processingTimeout?.let { requirePositive("processingTimeout", it) }
    }

    companion object {
        /** The largest [concurrency] (the runtime's bound). */
        const val MAX_CONCURRENCY = 65_536
    }
}

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
    /** Positive; null: the node's default. */
    val timeout: Duration? = null,
    val preferredWorker: String? = null,
    /** Reuse an id (32 hex digits) to be deduplicated across retries or restarts. */
    val requestId: String? = null,
    val correlationId: String? = null,
    /** The request id (32 hex digits) of the message that caused this ask. */
    val causationId: String? = null,
    /** Bytes identifying the payload, hashed into its fingerprint (see the class doc). */
    val fingerprint: ByteArray? = null,
    /** Total sends, at least 1; null: the node's. */
    val maxAttempts: Int? = null,
) {
    init {
        timeout?.let { requirePositive("timeout", it) }
        maxAttempts?.let { requireAtLeast("maxAttempts", it.toLong(), 1) }
    }

    /** Whether the primitive-only fast path can carry these options. */
    internal val simple: Boolean
        get() = preferredWorker == null && requestId == null && correlationId == null &&
            causationId == null && fingerprint == null && maxAttempts == null

    internal fun toArgs(stages: Boolean, oneWay: Boolean) = askpool.ffi.AskArgs(
        timeoutMs = timeout?.let { millis(it).toULong() },
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
    /** Positive; null: the node's default. */
    val timeout: Duration? = null,
    val requestId: String? = null,
    /** 32 hex digits; the handler reads it as [RequestContext.correlationId]. */
    val correlationId: String? = null,
    /** The request id (32 hex digits) of the message that caused this tell ([RequestContext.causationId]). */
    val causationId: String? = null,
    /** Bytes identifying the payload, hashed into its fingerprint. */
    val fingerprint: ByteArray? = null,
    /** Total sends, at least 1; null: the node's. */
    val maxAttempts: Int? = null,
) {
    init {
        timeout?.let { requirePositive("timeout", it) }
        maxAttempts?.let { requireAtLeast("maxAttempts", it.toLong(), 1) }
    }

    /** Whether the primitive-only fast path can carry these options. */
    internal val simple: Boolean
        get() = requestId == null && correlationId == null && causationId == null &&
            fingerprint == null && maxAttempts == null

    /** The same arguments as an ask with these options, one-way. */
    internal fun toArgs() = AskOptions(
        timeout = timeout,
        requestId = requestId,
        correlationId = correlationId,
        causationId = causationId,
        fingerprint = fingerprint,
        maxAttempts = maxAttempts,
    ).toArgs(stages = false, oneWay = true)
}

/** A positive duration in whole milliseconds, at least 1 (a sub-millisecond timeout is not 0: none). */
internal fun millis(d: Duration): Long = d.inWholeMilliseconds.coerceAtLeast(1)

private fun requirePositive(what: String, d: Duration) {
    if (!d.isPositive()) throw AskException.InvalidArgument("$what must be positive, not $d")
}

private fun requireAtLeast(what: String, value: Long, min: Long) {
    if (value < min) throw AskException.InvalidArgument("$what must be at least $min, not $value")
}
