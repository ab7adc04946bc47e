package askpool

import askpool.ffi.CancelCause
import askpool.ffi.Fault
import askpool.ffi.HostHandler
import askpool.ffi.requestFail
import askpool.ffi.requestInfo
import askpool.ffi.requestProgress
import askpool.ffi.requestReply
import askpool.ffi.requestReplyBytes
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.Job
import kotlinx.coroutines.launch
import java.util.concurrent.ConcurrentHashMap

/**
 * A pool's handler: a suspend function of the message and its context.
 * Its return value is the reply (returned by reference); an exception
 * fails the ask ([AskException] subclasses keep their code, anything else
 * becomes [AskException.HandlerFailed] with the class name and message).
 */
fun interface Handler {
    suspend fun handle(msg: Any?, ctx: RequestContext): Any?
}

/** What a handler knows about the request it runs. */
class RequestContext internal constructor(private val request: Long) {
    private val cancelSignal = CompletableDeferred<Unit>()
    private val info by lazy { requestInfo(request) }

    val requestId: String get() = info?.requestId ?: ""
    val correlationId: String get() = info?.correlationId ?: ""
    val attempt: Int get() = info?.attempt?.toInt() ?: 0

    /** Whether the request was cancelled (by its caller, a timeout, shutdown). */
    val isCancelled: Boolean get() = cancelSignal.isCompleted

    /** Suspends until the request is cancelled. */
    suspend fun cancelled() = cancelSignal.await()

    /** Reports progress to the caller (a `PARTIAL` stage). */
    fun progress(fraction: Float, note: String = "") = requestProgress(request, fraction, note)

    internal fun markCancelled() {
        cancelSignal.complete(Unit)
    }
}

/** A pool hosted by a [Node]. */
class Pool internal constructor(
    private val node: Node,
    val name: String,
    private val options: PoolOptions,
    private val handler: Handler,
) : HostHandler {
    private class Running(val context: RequestContext) {
        @Volatile var job: Job? = null
    }

    private val running = ConcurrentHashMap<Long, Running>()

    internal fun nativeOptions() = askpool.ffi.PoolOptions(
        concurrency = options.concurrency.toUInt(),
        maxInFlight = options.maxInFlight.toULong(),
        dedupCapacity = options.dedupCapacity.toULong(),
        dedupTtlMs = options.dedupTtl.inWholeMilliseconds.toULong(),
        processingTimeoutMs = options.processingTimeout?.inWholeMilliseconds?.toULong(),
    )

    /** Requests this pool's handler is running. */
    fun running(): Int = running.size

    /** Stops the pool: new asks get `NoRoute`, queued ones are cancelled. */
    fun close() = node.native.closePool(name)

    override fun handle(request: Long, handle: Long) {
        JvmThreads.stayAttached()
        val msg = try {
            HandleTable.get(handle)
        } catch (e: AskException) {
            requestFail(request, e.toFault())
            return
        }
        start(request, msg)
    }

    override fun handleBytes(request: Long, data: ByteArray) {
        JvmThreads.stayAttached()
        start(request, data)
    }

    override fun cancelled(request: Long) {
        JvmThreads.stayAttached()
        val r = running[request] ?: return
        r.context.markCancelled()
        r.job?.cancel()
    }

    private fun start(request: Long, msg: Any?) {
        val entry = Running(RequestContext(request))
        running[request] = entry
        // ATOMIC: a request cancelled before its coroutine ran still runs the
        // block, so it still replies (the runtime waits for that reply).
        entry.job = node.scope.launch(options.dispatcher, CoroutineStart.ATOMIC) {
            try {
                when (val reply = handler.handle(msg, entry.context)) {
                    is ByteArray -> requestReplyBytes(request, reply)
                    else -> requestReply(request, HandleTable.put(reply))
                }
            } catch (e: CancellationException) {
                requestFail(request, Fault.AskCancelled(CancelCause.WORKER))
            } catch (e: Throwable) {
                requestFail(request, AskException.fromHandler(e))
            } finally {
                running.remove(request)
            }
        }
    }
}
