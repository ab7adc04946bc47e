package askpool

import askpool.ffi.NativeNode
import askpool.ffi.Payload
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.ensureActive
import kotlinx.coroutines.suspendCancellableCoroutine
import java.util.concurrent.ConcurrentHashMap
import kotlin.coroutines.ContinuationInterceptor

/**
 * A caller of asks and a host of worker pools, on the askpool runtime.
 *
 * ```
 * Node().use { node ->
 *     node.pool("upper", PoolOptions(concurrency = 4)) { msg, _ -> (msg as String).uppercase() }
 *     val reply = node.ask("upper", "hi", AskOptions(timeout = 5.seconds))
 * }
 * ```
 * Objects pass by reference (`===` on the other side); a `ByteArray`
 * crosses as bytes, at most [NodeOptions.maxPayloadBytes] of them (only a
 * `ByteArray` is sized).
 *
 * Once [close]d, every call throws [AskException.Unavailable] (as an ask of
 * a closed node fails), except [close] itself, [stats] (nothing is in
 * flight any more) and [AskHandle.cancel] (nothing left to cancel).
 */
class Node(options: NodeOptions = NodeOptions()) : AutoCloseable {
    init {
        JvmThreads.ensure()
    }

    internal val completions = Completions()
    internal val native = NativeNode(
        askpool.ffi.NodeOptions(
            defaultTimeoutMs = millis(options.defaultTimeout).toULong(),
            maxAttempts = options.maxAttempts.toUInt(),
            trackStages = options.trackStages,
            dlqCapacity = options.dlqCapacity.toULong(),
            circuitBreaker = options.circuitBreaker,
            maxPayloadBytes = options.maxPayloadBytes?.toULong(),
        ),
        completions,
    )
    private val id = native.id()

    /**
     * Shuts the native node down once this node is unreachable and was not
     * [close]d: the native side keeps every open node in a table (its hot
     * path looks nodes up by id), so a node dropped without `close` was
     * never freed. A node with a pool stays reachable through the pool's
     * handler, which the native side holds, so only idle nodes are cleaned.
     */
    private val cleanup = CLEANER.register(this, NativeShutdown(native))

    init {
        Hot.start()
    }
    private val poolIds = ConcurrentHashMap<String, Long>()
    private val pools = ConcurrentHashMap<String, Pool>()

    /** Closed pools whose handlers still run: this node's close cancels them too. */
    private val lingering = ConcurrentHashMap.newKeySet<Pool>()

    internal fun linger(pool: Pool) {
        lingering.add(pool)
        // Added after this node's close went over them.
        if (closed) pool.cancelAll()
    }

    internal fun unlinger(pool: Pool) {
        lingering.remove(pool)
    }

    @Volatile internal var closed = false
        private set

    /** Throws what an ask of a closed node throws. */
    internal fun checkOpen() {
        if (closed) throw closedError()
    }

    internal fun closedError() = AskException.Unavailable("node closed")

    /**
     * Runs a call of the native node: its errors and panics mapped, and a
     * node closed meanwhile (the generated object then throws an untyped
     * `IllegalStateException`) reported as [AskException.Unavailable].
     */
    internal inline fun <T> call(body: () -> T): T {
        checkOpen()
        return try {
            AskException.native(body)
        } catch (e: IllegalStateException) {
            if (closed) throw closedError()
            throw e
        }
    }

    /** Hosts a pool whose requests run [handler] (see [Handler]). */
    fun pool(name: String, options: PoolOptions = PoolOptions(), handler: Handler): Pool {
        checkOpen()
        val pool = Pool(this, name, options, handler)
        Pool.register(pool)
        try {
            call { native.createPool(name, pool.nativeOptions(), pool, pool.id) }
        } catch (e: Throwable) {
            Pool.forget(pool)
            throw e
        }
        pools[name] = pool
        // A close that ran meanwhile did not see this pool.
        if (closed && pools.remove(name, pool)) {
            Pool.forget(pool)
            pool.cancelAll()
            throw closedError()
        }
        return pool
    }

    /**
     * Closes [pool] (see [Pool.close]) and lets go of it: kept until the
     * node closed, every pool closed and made again stayed reachable.
     * Nothing if it was closed already (its name may be another pool's now).
     */
    internal fun closePool(pool: Pool) {
        // A closed node closed its pools: closing one again is nothing, in
        // whatever order a `use` block or a container closes them.
        if (closed) return
        // One close at a time: two closes of the same pool both passing the
        // check below, the second's native close would close a pool of the
        // same name made between them.
        synchronized(closingPool) {
            if (pools[pool.name] !== pool) return
            call { native.closePool(pool.name) }
            pools.remove(pool.name, pool)
        }
        Pool.forget(pool)
        pool.tellClosed()
    }

    private val closingPool = Any()

    /** Whether [pool] is the open pool of its name here. */
    internal fun hosts(pool: Pool): Boolean = pools[pool.name] === pool

    /** Cancels the ask under [token]; nothing to do once the node is closed. Never throws. */
    internal fun cancelAsk(token: Long) {
        if (closed) return
        try {
            AskException.native { native.cancel(token) }
        } catch (e: Throwable) {
            // Closed meanwhile: every ask already failed. Anything else is
            // reported, not thrown: this runs in cancellation handlers.
            if (!closed) e.printStackTrace()
        }
    }

    /**
     * Asks [pool] and suspends until the reply. Cancelling the calling
     * coroutine cancels the ask (the protocol cancel reaches the handler).
     * @throws AskException how the ask failed.
     */
    suspend fun ask(pool: String, msg: Any?, options: AskOptions = AskOptions()): Any? {
        // A cancelled caller sends nothing (its handler would run for nobody).
        currentCoroutineContext().ensureActive()
        // Bytes never take the fast path (it carries a handle only): they
        // cross as bytes, sized against [NodeOptions.maxPayloadBytes].
        // Through a handle nobody else sees: no stage record is kept for it
        // (one kept would wait for the handle's collection to be let go).
        if (!options.simple || msg is ByteArray) return start(pool, msg, options, stages = false).await()
        checkOpen()
        // A name the native side gives no id (past its bound, or no pool
        // name at all) is asked by name.
        val poolId = poolIdOf(pool)
        if (poolId < 0) return start(pool, msg, options, stages = false).await()
        val timeoutMs = options.timeout?.let { millis(it) } ?: 0
        return suspendCancellableCoroutine { cont ->
            val token = completions.register(cont)
            // The reply may arrive within this call (the handler ran on this
            // thread): then `cont` is resumed before this block returns and
            // the caller does not suspend at all.
            val here = cont.context[ContinuationInterceptor]
            if (startHot(poolId, msg, timeoutMs, token, 0, null, here) != null) return@suspendCancellableCoroutine
            // Also when `cont` was cancelled meanwhile: a caller cancelled
            // while its handler ran above gets the handler called at once. A
            // caller whose reply came within the call has nothing to cancel.
            if (!cont.isCompleted || cont.isCancelled) cont.invokeOnCancellation { cancelAsk(token) }
        }
    }

    /** The id the native side gives [pool] for the hot path; -1 for none. */
    private fun poolIdOf(pool: String): Long =
        poolIds[pool] ?: call { native.poolId(pool) }.also { if (it >= 0) poolIds[pool] = it }

    /**
     * Starts an ask of [msg] (a tell with [Hot.ONE_WAY]) under [token], whose
     * waiter is registered, as a hot call: a generated call and a callback
     * for the outcome cost as much as thirty asks. Returns null, or the
     * error the waiter was failed with (nothing more will be reported).
     */
    private fun startHot(
        poolId: Long, msg: Any?, timeoutMs: Long, token: Long, flags: Long,
        started: Hot.Started?, here: ContinuationInterceptor?,
    ): AskException? {
        val pendingReleases = try {
            Hot.ask(id, poolId, HandleTable.put(msg), timeoutMs, token, flags, started, here)
        } catch (e: Throwable) {
            // The ask may have started: its waiter fails here, once
            // (whichever of this and a reply takes it first wins), and
            // the cancel makes the runtime forget it.
            val error = e as? AskException ?: AskException.Internal(e.toString())
            completions.failNow(token, error)
            cancelAsk(token)
            return error
        }
        when (pendingReleases) {
            Hot.CLOSED -> return closedError().also { completions.failNow(token, it) }
            Hot.PANICKED -> {
                val error = AskException.Internal("panic in askpool (ask); see stderr")
                completions.failNow(token, error)
                cancelAsk(token)
                return error
            }
        }
        if (pendingReleases >= DRAIN_BATCH) HandleTable.drainQuietly()
        return null
    }

    /** Asks and returns at once with the ask's [AskHandle]. */
    fun send(pool: String, msg: Any?, options: AskOptions = AskOptions()): AskHandle =
        start(pool, msg, options, stages = true)

    /** Starts an ask; its stage record is kept for [AskHandle.stages] if [stages]. */
    private fun start(pool: String, msg: Any?, options: AskOptions, stages: Boolean): AskHandle {
        checkOpen()
        checkUnicode(pool, options.preferredWorker, options.requestId, options.correlationId, options.causationId)
        // Before the handle is registered: a node closing now throws here
        // with nothing left waiting for an outcome.
        val poolId = if (options.simple && msg !is ByteArray) poolIdOf(pool) else -1
        val handle = AskHandle(this)
        val token = completions.register(handle)
        handle.token = token
        if (poolId >= 0) {
            val started = Hot.Started()
            val timeoutMs = options.timeout?.let { millis(it) } ?: 0
            startHot(poolId, msg, timeoutMs, token, if (stages) Hot.KEEP_STAGES else 0, started, null)?.let {
                handle.dropStageRecord()
                throw it
            }
            handle.started(started.requestId, started.requestId, started.stagesKept)
        } else {
            val start = askByName(pool, msg, options.toArgs(stages = stages, oneWay = false), token)
            handle.started(start.requestId, start.correlationId, start.stagesKept)
        }
        return handle
    }

    /**
     * A one-way message: suspends until [pool] accepted it, returns its
     * request id. A duplicate (same request id) is not run again.
     */
    suspend fun tell(pool: String, msg: Any?, options: TellOptions = TellOptions()): String {
        currentCoroutineContext().ensureActive()
        checkOpen()
        checkUnicode(pool, options.requestId, options.correlationId, options.causationId)
        val poolId = if (options.simple && msg !is ByteArray) poolIdOf(pool) else -1
        val started = Hot.Started()
        // Waited for as an ask's reply is (a tell's outcome is a reply of
        // nothing): an AskHandle's completion hopped to Dispatchers.IO.
        suspendCancellableCoroutine { cont ->
            val token = completions.register(cont)
            if (poolId >= 0) {
                val timeoutMs = options.timeout?.let { millis(it) } ?: 0
                // No dispatcher to start the handler on here (as for send):
                // a tell returns once the pool accepted it, never after the
                // handler's first step, which could wait on the caller.
                if (startHot(poolId, msg, timeoutMs, token, Hot.ONE_WAY, started, null) != null) {
                    return@suspendCancellableCoroutine
                }
            } else {
                val args = options.toArgs()
                started.requestId = try {
                    askByName(pool, msg, args, token).requestId
                } catch (e: AskException) {
                    return@suspendCancellableCoroutine // its waiter failed with it
                }
            }
            if (!cont.isCompleted || cont.isCancelled) cont.invokeOnCancellation { cancelAsk(token) }
        }
        return started.requestId
    }

    /**
     * The dead-letter queue, oldest first. A letter dropped while this call
     * returns (the queue full, a purge, a replay) may have lost its object
     * before it is looked up here (the native list does not hold it): it
     * is left out, as a listing made just after the drop would.
     */
    fun deadLetters(): List<DeadLetter> = call { native.deadLetters() }.mapNotNull { DeadLetter.of(it) }

    /**
     * Takes a dead letter out and asks it again with its ids; suspends until
     * the reply (a tell's letter is told again, as a tell: null once its pool
     * accepted it). Cancelling the calling coroutine (a `withTimeout` around
     * it included) gives the letter up, as [AskHandle.cancel] does: to wait
     * a while and keep it, see [replayDeadLetterHandle].
     */
    suspend fun replayDeadLetter(requestId: String): Any? {
        currentCoroutineContext().ensureActive()
        return replayDeadLetterHandle(requestId).await()
    }

    /**
     * Takes a dead letter out, asks it again with its ids (its pool may
     * answer from its reply cache without running the handler) and returns
     * at once with the replay's [AskHandle]: its [AskHandle.requestId] and
     * [AskHandle.correlationId] are the letter's, [AskHandle.stages] its
     * ACK lifecycle, [AskHandle.await] its reply (a tell's letter is told
     * again: no stages, and null once its pool accepted it). A replay that fails,
     * however it fails, puts the letter back with its new error; one
     * cancelled ([AskHandle.cancel], or the coroutine awaiting it) gives the
     * letter up. Throws [AskException.FailedPrecondition] if there is no
     * dead letter with that id.
     */
    fun replayDeadLetterHandle(requestId: String): AskHandle {
        checkOpen()
        checkUnicode(requestId)
        val handle = AskHandle(this)
        val token = completions.register(handle)
        handle.token = token
        val start = startOrForget(token) { native.replayDeadLetter(requestId, token) }
        handle.started(start.requestId, start.correlationId, start.stagesKept)
        return handle
    }

    /**
     * Starts an ask or tell of [msg] by [pool]'s name (the generated call),
     * under [token], whose waiter is registered. A call that throws left
     * the message's handle with nobody: refused before it reached the
     * native side (the node closed under it) or let go there again. It is
     * let go here, or the handle table kept the object for good.
     */
    private fun askByName(pool: String, msg: Any?, args: askpool.ffi.AskArgs, token: Long): askpool.ffi.AskStart {
        val payload = payloadOf(msg)
        try {
            return startOrForget(token) { native.askWith(pool, payload, args, token) }
        } catch (e: Throwable) {
            if (payload is Payload.Host) HandleTable.forget(payload.handle)
            throw e
        }
    }

    /**
     * A refused start reports nothing: its waiter must not stay behind,
     * whatever the start threw.
     */
    internal inline fun <T> startOrForget(token: Long, start: () -> T): T = try {
        call(start)
    } catch (e: Throwable) {
        val error = e as? AskException ?: AskException.Internal(e.toString())
        completions.failNow(token, error)
        throw error
    }

    fun purgeDeadLetters(): Int = call { native.purgeDeadLetters() }.toInt()

    /** Once the node is closed: its native counts are 0 (nothing is in flight). */
    fun stats(): NodeStats {
        val s = try {
            call { native.stats() }
        } catch (e: AskException.Unavailable) {
            if (!closed) throw e
            return NodeStats(0, 0, 0, completions.size().toLong(), 0, 0)
        }
        return NodeStats(
            pending = s.pending.toLong(),
            armedTimers = s.armedTimers.toLong(),
            asksInFlight = s.asksInFlight.toLong(),
            awaitedOutcomes = completions.size().toLong(),
            dlqDepth = s.dlqDepth.toLong(),
            timedOutRecords = s.timedOutRecords.toLong(),
            retries = s.retries.toLong(),
            lateOutcomes = s.lateOutcomes.toLong(),
            dlqDropped = s.dlqDropped.toLong(),
            pools = s.pools.map { PoolStats.of(it) },
        )
    }

    /** This node's caller id (16 hex digits): requests are deduplicated per caller id and request id. */
    val callerId: String = native.callerId()

    /** Whether [close] was called. */
    val isClosed: Boolean get() = closed

    /** The thread running the first [close], while it runs. */
    @Volatile private var closer: Thread? = null
    private val closeDone = java.util.concurrent.CountDownLatch(1)

    /**
     * Fails pending asks (`Unavailable`), stops the pools, frees the node.
     * A close while another runs returns once that one is done (its
     * handlers cancelled), except one called from inside it (a handler's
     * cancellation handler): that one returns at once.
     */
    override fun close() {
        val first = synchronized(this) {
            if (closed) {
                false
            } else {
                closed = true
                closer = Thread.currentThread()
                true
            }
        }
        if (!first) {
            if (closer !== Thread.currentThread()) awaitFirstClose()
            return
        }
        try {
            shutDown()
        } finally {
            closer = null
            closeDone.countDown()
        }
    }

    /**
     * Waits for the close that runs on another thread. A close cannot be
     * given up half-way, and an interrupt thrown from it reached the caller
     * as a raw `InterruptedException`: the wait goes on, and the thread's
     * interrupt is set again for its own code to see.
     */
    private fun awaitFirstClose() {
        var interrupted = false
        while (true) {
            try {
                closeDone.await()
                break
            } catch (e: InterruptedException) {
                interrupted = true
            }
        }
        if (interrupted) Thread.currentThread().interrupt()
    }

    private fun shutDown() {
        cleanup.clean() // native.shutdown(), once
        pools.values.forEach {
            Pool.forget(it)
            it.cancelAll()
        }
        pools.clear()
        // Read after `closed` is set: a closed pool's handler starting now
        // is either here or sees the node closed (Pool.startClosed).
        lingering.forEach { it.cancelAll() }
        lingering.clear()
        native.close()
        HandleTable.drainQuietly()
    }

    /** Holds the native node, never the [Node]: a cleaning action must not reach its object. */
    private class NativeShutdown(private val native: NativeNode) : Runnable {
        override fun run() {
            runCatching { native.shutdown() }
        }
    }

    internal companion object {
        const val DRAIN_BATCH = 256L

        val CLEANER: java.lang.ref.Cleaner = java.lang.ref.Cleaner.create()

        fun payloadOf(msg: Any?): Payload =
            if (msg is ByteArray) Payload.Bytes(msg) else Payload.Host(HandleTable.put(msg))
    }
}

data class NodeStats(
    val pending: Long,
    val armedTimers: Long,
    val asksInFlight: Long,
    /**
     * Outcomes and stage streams the Kotlin side still waits for, in every
     * node of the process (their waiters are one table: an outcome arrives
     * with its token only).
     */
    val awaitedOutcomes: Long,
    val dlqDepth: Long,
    val timedOutRecords: Long,
    /** Request frames re-sent after the first attempt. */
    val retries: Long = 0,
    /** Outcomes that arrived after their ask timed out, reconciled once. */
    val lateOutcomes: Long = 0,
    /** Dead letters dropped because the queue was full. */
    val dlqDropped: Long = 0,
    /** The pools this node hosts. */
    val pools: List<PoolStats> = emptyList(),
)

/** One hosted pool's counters. */
data class PoolStats(
    val name: String,
    val inFlight: Long,
    val queued: Long,
    val admitted: Long,
    val handlerRuns: Long,
    /** Duplicates of a running request, answered with an Ack. */
    val duplicateAcks: Long,
    /** Duplicates of a finished request, answered from the reply cache. */
    val replays: Long,
    /** Replies dropped because their request was cancelled first. */
    val suppressedReplies: Long,
    val rejectedFull: Long,
    val cancels: Long,
    /** Running requests cancelled at their processing timeout. */
    val expired: Long,
    val dedupInProgress: Long,
    val dedupTerminal: Long,
) {
    internal companion object {
        fun of(p: askpool.ffi.NativePoolStats) = PoolStats(
            name = p.name,
            inFlight = p.inFlight.toLong(),
            queued = p.queued.toLong(),
            admitted = p.admitted.toLong(),
            handlerRuns = p.handlerRuns.toLong(),
            duplicateAcks = p.duplicateAcks.toLong(),
            replays = p.replays.toLong(),
            suppressedReplies = p.suppressedReplies.toLong(),
            rejectedFull = p.rejectedFull.toLong(),
            cancels = p.cancels.toLong(),
            expired = p.expired.toLong(),
            dedupInProgress = p.dedupInProgress.toLong(),
            dedupTerminal = p.dedupTerminal.toLong(),
        )
    }
}

data class DeadLetter(
    val requestId: String,
    val correlationId: String,
    val pool: String,
    val payload: Any?,
    val error: AskException,
    val attempts: Int,
    /** `RETRIES_EXHAUSTED` or `POISON`. */
    val reason: String,
    /** `ASK` or `TELL`: what was sent, and what [Node.replayDeadLetter] sends. */
    val kind: String = "ASK",
) {
    internal companion object {
        /** Null if its object was let go meanwhile (see [Node.deadLetters]). */
        fun of(d: askpool.ffi.DeadLetterInfo): DeadLetter? {
            val payload = when (val p = d.payload) {
                // A stale handle finds nothing, never another object (a
                // handle carries its slot's generation).
                is Payload.Host -> if (p.handle == 0L) null else HandleTable.find(p.handle) ?: return null
                is Payload.Bytes -> p.data
            }
            return DeadLetter(
                requestId = d.requestId,
                correlationId = d.correlationId,
                pool = d.pool,
                payload = payload,
                error = AskException.of(d.failure),
                attempts = d.attempts.toInt(),
                reason = d.reason,
                kind = d.kind,
            )
        }
    }
}
