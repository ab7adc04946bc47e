package askpool

import askpool.ffi.CancelCause
import askpool.ffi.Fault
import askpool.ffi.HostHandler
import askpool.ffi.RequestInfo
import askpool.ffi.requestFail
import askpool.ffi.requestInfo
import askpool.ffi.requestProgress
import askpool.ffi.requestReplyBytes
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.launch
import java.util.concurrent.ConcurrentHashMap
import kotlin.coroutines.ContinuationInterceptor
import kotlin.coroutines.CoroutineContext
import kotlin.coroutines.EmptyCoroutineContext

/**
 * A pool's handler: a suspend function of the message and its context.
 * Its return value is the reply (returned by reference); an exception
 * fails the ask: an [AskException] whose code is just a message
 * (`Unavailable`, `InvalidArgument`, `DecodeFailure`, ...) keeps its code;
 * any other exception, one describing an ask (`AskTimeout`, `NoRoute`, ...)
 * included, becomes [AskException.HandlerFailed] with the class name and
 * message, the rule every binding shares. A `CancellationException` after
 * the request's cancel is the worker's cancel (`AskCancelled(WORKER)`).
 */
fun interface Handler {
    suspend fun handle(msg: Any?, ctx: RequestContext): Any?
}

/** What a handler knows about the request it runs. */
class RequestContext internal constructor(private val request: Long) {
    @Volatile private var cancelledFlag = false

    /** Made on the first [cancelled] call only: most handlers never wait for a cancel. */
    @Volatile private var cancelSignal: CompletableDeferred<Unit>? = null

    @Volatile private var infoRead = false
    private var info: RequestInfo? = null

    /** The handler's coroutine, once it started. */
    @Volatile internal var job: Job? = null

    /** Cancelled before [job] was set: the coroutine cancels itself. */
    @Volatile internal var cancelPending = false

    /**
     * Read from the native request on first use (most handlers never ask),
     * so only while it runs: first read after the handler ended, the ids
     * are gone, and saying so beats an empty id.
     */
    private fun info(): RequestInfo {
        if (!infoRead) {
            synchronized(this) {
                if (!infoRead) {
                    info = requestInfo(request)
                    infoRead = true
                }
            }
        }
        return info ?: throw AskException.FailedPrecondition(
            "the request's ids are read after its handler ended: read them while it runs",
        )
    }

    /** The request's ids and attempt; read them while the handler runs (else `FailedPrecondition`). */
    val requestId: String get() = info().requestId
    val correlationId: String get() = info().correlationId

    /** The causation id the ask or tell carried ([AskOptions.causationId], [TellOptions.causationId]); empty if none. */
    val causationId: String get() = info().causationId
    val attempt: Int get() = info().attempt.toInt()

    /** Whether the request was cancelled (by its caller, a timeout, shutdown), or its pool closed. */
    val isCancelled: Boolean get() = cancelledFlag

    /** Suspends until the request is cancelled. */
    suspend fun cancelled() {
        val signal = cancelSignal ?: synchronized(this) {
            cancelSignal ?: CompletableDeferred<Unit>().also { cancelSignal = it }
        }
        // The flag is written before the signal is read (markCancelled) and
        // the signal before the flag is read (here): one of them sees the other.
        if (cancelledFlag) signal.complete(Unit)
        signal.await()
    }

    /**
     * Reports progress to the caller (a `PARTIAL` stage): [fraction] is
     * clamped to 0..1 (by the core, as in every binding).
     * @throws AskException.InvalidArgument [fraction] is NaN or infinite, or
     *   [note] is past the bound of a report (4096 UTF-8 bytes).
     */
    fun progress(fraction: Float, note: String = "") {
        if (!fraction.isFinite()) {
            throw AskException.InvalidArgument("progress must be a fraction from 0 to 1, got $fraction")
        }
        requestProgress(request, fraction, validText(note))?.let { throw AskException.of(it) }
    }

    /** Cancels the handler's coroutine, or has it cancel itself once it starts. */
    internal fun cancelJob() {
        cancelPending = true
        job?.cancel()
    }

    /**
     * The request itself was cancelled (its caller, a timeout, shutdown),
     * before or while its handler runs: the handler's coroutine is
     * cancelled, now or as it starts. Waking [cancelled] and cancelling the
     * job run the handler's code in place (an unconfined waiter, an
     * `invokeOnCancellation`), and this is called on a library thread: that
     * part runs off it, or a blocking handler would stall every ask's timers.
     */
    internal fun cancelRequest() {
        cancelledFlag = true
        cancelPending = true
        JvmThreads.offLibraryThread(null) {
            markCancelled()
            job?.cancel()
        }
    }

    internal fun markCancelled() {
        cancelledFlag = true
        cancelSignal?.complete(Unit)
    }
}

/** A pool hosted by a [Node]. */
class Pool internal constructor(
    private val node: Node,
    val name: String,
    private val options: PoolOptions,
    private val handler: Handler,
) : HostHandler, AutoCloseable {
    private val running = RequestTable()

    /**
     * Where handlers are launched: a scope without a Job, so a handler's
     * coroutine is no child to attach and detach (that bookkeeping on one
     * shared parent cost more than the rest of the launch). [cancelAll]
     * cancels them instead when the node closes.
     */
    private val handlers = object : CoroutineScope {
        override val coroutineContext: CoroutineContext = options.dispatcher
    }

    @Volatile private var closed = false

    /**
     * Tells the running handlers that their pool closed ([RequestContext.isCancelled],
     * [RequestContext.cancelled]) without cancelling their coroutines: a
     * reply they still give reaches its caller.
     */
    internal fun tellClosed() {
        // Set before the running ones are read: a handler starting now
        // either is among them or sees the flag ([start]).
        told = true
        synchronized(lingerLock) {
            if (running.size() > 0) linger()
        }
        running.forEach { it.markCancelled() }
    }

    /** Closed ([tellClosed]): every handler starting from now on is told. */
    @Volatile private var told = false

    /**
     * Whether the node holds this closed pool (it let go of it at the
     * close) while handlers of it still run, for its own close to cancel
     * them. Guarded by [lingerLock].
     */
    private var lingering = false
    private val lingerLock = Any()

    private fun linger() {
        if (!lingering) {
            lingering = true
            node.linger(this)
        }
    }

    /** After a closed pool's request was recorded: it is told, and held by the node while it runs. */
    private fun startClosed(context: RequestContext) {
        context.markCancelled()
        synchronized(lingerLock) { linger() }
        // Checked after the node holds it: a node close either cancels it
        // or ran before this check.
        if (node.closed) context.cancelPending = true
    }

    /** After a closed pool's request finished: the node lets go of the pool once none runs. */
    private fun finishClosed() {
        synchronized(lingerLock) {
            if (lingering && running.size() == 0) {
                lingering = false
                node.unlinger(this)
            }
        }
    }

    /** Cancels every running handler and any that starts from now on. */
    internal fun cancelAll() {
        closed = true
        running.forEach { it.cancelJob() }
    }

    internal fun nativeOptions() = askpool.ffi.PoolOptions(
        concurrency = options.concurrency.toUInt(),
        maxInFlight = options.maxInFlight.toULong(),
        dedupCapacity = options.dedupCapacity.toULong(),
        dedupTtlMs = options.dedupTtl.inWholeMilliseconds.toULong(),
        processingTimeoutMs = options.processingTimeout?.let { millis(it).toULong() },
    )

    /** Requests this pool's handler is running. */
    fun running(): Int = running.size()

    /** Running requests and cancels waiting for their request's start (for tests). */
    internal fun requestEntries(): Int = running.entries()

    /**
     * This pool's counters (its entry of [Node.stats]).
     * @throws AskException.FailedPrecondition once it or its node is closed.
     */
    fun stats(): PoolStats {
        val stats = node.stats()
        // Checked after the read: a pool the node still holds now was this
        // one when its counters were read. Its name alone may be a newer
        // pool's, made after this one closed.
        if (!node.hosts(this)) throw AskException.FailedPrecondition("pool $name is closed")
        return stats.pools.firstOrNull { it.name == name }
            ?: throw AskException.FailedPrecondition("pool $name is closed")
    }

    /**
     * Stops the pool: new asks get `NoRoute`, queued ones are cancelled.
     * Nothing if it is closed already, or its node is (which closed it).
     */
    override fun close() = node.closePool(this)

    internal val id = ids.getAndIncrement()

    internal companion object {
        private val ids = java.util.concurrent.atomic.AtomicLong(1)
        private val byId = ConcurrentHashMap<Long, Pool>()

        fun register(pool: Pool) {
            byId[pool.id] = pool
        }

        fun forget(pool: Pool) {
            byId.remove(pool.id)
        }

        /** Whether the pool under [poolId] runs its handlers on [here]. */
        fun runsOn(poolId: Long, here: ContinuationInterceptor?): Boolean =
            here != null && byId[poolId]?.options?.dispatcher === here

        /** Pools registered (made and not yet closed), in every node. */
        fun registered(): Int = byId.size

        /**
         * A request with a host object (or why it could not be looked up).
         * [here] is the dispatcher of the thread taking it on, if that thread
         * may run the handler itself (see [start]).
         */
        fun dispatch(poolId: Long, request: Long, msg: Any?, missing: AskException?, here: ContinuationInterceptor?) {
            val pool = byId[poolId]
            if (pool == null) {
                // Its pool closed before the handler could start it.
                requestFail(request, Fault.AskCancelled(CancelCause.SHUTDOWN))
                return
            }
            if (missing != null) {
                requestFail(request, missing.toFault())
                return
            }
            pool.start(request, msg, here)
        }
    }

    override fun handleBytes(request: Long, data: ByteArray) {
        JvmThreads.stayAttached()
        start(request, data)
    }

    override fun cancelled(request: Long) {
        JvmThreads.stayAttached()
        // Null if the request has not started (its start finds the cancel),
        // or has been answered already (the runtime no longer knows it).
        running.cancel(request) { requestInfo(it) != null }?.cancelRequest()
    }

    /**
     * What a [CancellationException] out of a handler means. A cancel of
     * the request itself (its caller, a timeout, shutdown: the handler's
     * job was cancelled, [RequestContext.cancelPending]) or a plain
     * `CancellationException` the handler threw to give up is a worker-side
     * cancel. Its pool's close is none ([RequestContext.isCancelled] says
     * so, but a reply still reaches the caller). Any other one is a failure
     * of the handler: a `withTimeout` that expired inside it
     * (`TimeoutCancellationException`), a cancelled scope or job it waited
     * on: [AskException.HandlerFailed] with its class name and message.
     */
    private fun cancelFault(e: CancellationException, context: RequestContext, job: Job?): Fault =
        if (job?.isCancelled == true || context.cancelPending ||
            e.javaClass == CancellationException::class.java
        ) {
            Fault.AskCancelled(CancelCause.WORKER)
        } else {
            Fault.HandlerFailed(e.javaClass.name, AskException.messageOf(e))
        }

    /**
     * Fails [request] with [fault]. Whatever describing the handler's
     * throw does (a `message` getter that throws, an error on the way), the
     * request is answered: unanswered, its caller would wait for its timeout
     * and the pool's worker, its message with it, would be held for good.
     */
    private inline fun fail(request: Long, fault: () -> Fault) {
        val f = try {
            fault()
        } catch (t: Throwable) {
            Fault.Internal("the handler's exception could not be described: ${t.javaClass.name}")
        }
        try {
            requestFail(request, f)
        } catch (t: Throwable) {
            // The fault itself was refused (say, a panic on its way): the
            // request still gets an answer.
            requestFail(request, Fault.Internal("the handler's failure could not be sent: ${t.javaClass.name}"))
        }
    }

    /** [request] was answered: it leaves the running ones. */
    private fun finished(request: Long) {
        running.finish(request)
        if (told) finishClosed()
    }

    /**
     * Runs the handler on the pool's dispatcher. A thread already running on
     * that dispatcher ([here]) starts it at once, without a dispatch: it got
     * the request from a hot call, so its own work waits on this reply.
     */
    internal fun start(request: Long, msg: Any?, here: ContinuationInterceptor? = null) {
        val context = RequestContext(request)
        // A cancel that came first cancels the handler as one that comes
        // while it runs does (not only its flag: it would run to its end).
        if (running.start(request, context)) context.cancelRequest()
        // Checked after the start is recorded: a cancelAll either sees this
        // request or ran before this check.
        if (closed) context.cancelPending = true
        if (told) startClosed(context)
        // ATOMIC / UNDISPATCHED: a request cancelled before its coroutine ran
        // still runs the block, so it still replies (the runtime waits for
        // that reply).
        val start = if (here != null && here === options.dispatcher) CoroutineStart.UNDISPATCHED else CoroutineStart.ATOMIC
        // Set once the handler's block runs: it then answers, whatever
        // happens. A dispatcher that refuses the block (Dispatchers.Main with
        // no main module, a shut-down executor) never runs it, and the
        // request is answered here instead: unanswered, its caller would wait
        // for its timeout and the pool's worker be held for good.
        val ran = java.util.concurrent.atomic.AtomicBoolean(false)
        val refused = { t: Throwable? ->
            if (ran.compareAndSet(false, true)) {
                fail(request) {
                    Fault.Internal(
                        "the pool's dispatcher did not run the handler" +
                            (t?.let { ": ${it.javaClass.name}: ${AskException.messageOf(it)}" } ?: ""),
                    )
                }
                finished(request)
            }
        }
        val job = try {
            launchHandler(request, msg, context, start, ran, whereToLaunch())
        } catch (t: Throwable) {
            refused(t)
            return
        }
        job.invokeOnCompletion { cause -> if (!ran.get()) refused(cause) }
    }

    /**
     * A dispatcher that does not dispatch (`Dispatchers.Unconfined`) runs
     * the handler where it is launched: on a library thread (a runtime
     * thread's [handleBytes], the event thread), that would block every
     * ask's timers with it. There it starts on `Dispatchers.IO` instead,
     * where a handler may block, as [JvmThreads.offLibraryThread] moves a
     * caller's code.
     */
    private fun whereToLaunch(): CoroutineContext =
        if (JvmThreads.onLibraryThread() && !JvmThreads.dispatches(handlers.coroutineContext)) {
            Dispatchers.IO
        } else {
            EmptyCoroutineContext
        }

    private fun launchHandler(
        request: Long,
        msg: Any?,
        context: RequestContext,
        start: CoroutineStart,
        ran: java.util.concurrent.atomic.AtomicBoolean,
        where: CoroutineContext,
    ): Job =
        handlers.launch(where, start) {
            if (!ran.compareAndSet(false, true)) return@launch
            context.job = coroutineContext[Job]
            // A cancel that came between registration and now found no job.
            if (context.cancelPending) context.job?.cancel()
            try {
                when (val reply = handler.handle(msg, context)) {
                    is ByteArray -> requestReplyBytes(request, reply)
                    else -> Hot.reply(request, HandleTable.put(reply), coroutineContext[ContinuationInterceptor])
                }
            } catch (e: CancellationException) {
                fail(request) { cancelFault(e, context, coroutineContext[Job]) }
            } catch (e: Throwable) {
                fail(request) { AskException.fromHandler(e) }
            } finally {
                finished(request)
            }
        }
}
