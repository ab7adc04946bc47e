package askpool

import askpool.ffi.AskListener
import askpool.ffi.Failure
import askpool.ffi.Stage
import kotlinx.coroutines.CancellableContinuation
import java.util.concurrent.ConcurrentHashMap
import kotlin.coroutines.resume
import kotlin.coroutines.resumeWithException

/** Where one ask's outcome goes (a suspended caller, an [AskHandle]). */
internal interface Completion {
    fun complete(value: Any?)
    fun fail(error: AskException)
    fun stage(stage: Stage) {}
    fun stagesEnd() {}
}

/**
 * A node's [AskListener]: the runtime reports every outcome here, keyed by
 * the token the ask was started with.
 */
internal class Completions : AskListener {

    fun register(completion: Completion): Long = waiting.put(completion)

    /** An ask whose outcome resumes [cont] directly (no [Completion] object). */
    fun register(cont: CancellableContinuation<Any?>): Long = waiting.put(cont)

    /** Fails an ask the runtime never took (nothing will be reported for it). */
    fun failNow(token: Long, error: AskException) {
        streams.remove(token)
        fail(waiting.take(token), error)
    }

    /** Asks started and not yet reported (in every node). */
    fun size() = waiting.size() + streams.size

    override fun onReplyBytes(token: Long, data: ByteArray) {
        JvmThreads.stayAttached()
        complete(waiting.take(token), data)
    }

    override fun onTold(token: Long) {
        JvmThreads.stayAttached()
        complete(waiting.take(token), null)
    }

    override fun onFailure(token: Long, failure: Failure) {
        JvmThreads.stayAttached()
        fail(waiting.take(token), AskException.of(failure))
    }

    override fun onStage(token: Long, stage: Stage) {
        JvmThreads.stayAttached()
        streams[token]?.stage(stage)
    }

    override fun onStagesEnd(token: Long) {
        JvmThreads.stayAttached()
        streams.remove(token)?.stagesEnd()
    }

    companion object {
        // Process-wide: replies arrive as events that carry only the token.
        // A waiter is a Completion or, for a plain ask, the caller's continuation.
        private val waiting = Slots<Any>()
        private val streams = ConcurrentHashMap<Long, Completion>()

        /** Stage events under [token] go to [completion], until their end. */
        fun openStream(token: Long, completion: Completion) {
            streams[token] = completion
        }

        /** A stream [openStream] opened that will get no events after all. */
        fun closeStream(token: Long) {
            streams.remove(token)
        }

        /** A host-object reply (its object, or why it could not be looked up). */
        fun reply(token: Long, value: Any?, missing: AskException?) {
            val waiter = waiting.take(token) ?: return
            if (missing != null) fail(waiter, missing) else complete(waiter, value)
        }

        @Suppress("UNCHECKED_CAST")
        private fun complete(waiter: Any?, value: Any?) {
            when (waiter) {
                is Completion -> waiter.complete(value)
                is CancellableContinuation<*> ->
                    JvmThreads.offLibraryThread(waiter.context) {
                        (waiter as CancellableContinuation<Any?>).resume(value)
                    }
            }
        }

        private fun fail(waiter: Any?, error: AskException) {
            when (waiter) {
                is Completion -> waiter.fail(error)
                is CancellableContinuation<*> ->
                    JvmThreads.offLibraryThread(waiter.context) { waiter.resumeWithException(error) }
            }
        }
    }
}
