package askpool

import askpool.ffi.AskListener
import askpool.ffi.Failure
import askpool.ffi.Stage
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicLong

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

    fun register(completion: Completion, stages: Boolean = false): Long {
        val token = tokens.getAndIncrement()
        waiting[token] = completion
        if (stages) streams[token] = completion
        return token
    }

    /** Fails an ask the runtime never took (nothing will be reported for it). */
    fun failNow(token: Long, error: AskException) {
        streams.remove(token)
        waiting.remove(token)?.fail(error)
    }

    /** Asks started and not yet reported (in every node). */
    fun size() = waiting.size + streams.size

    override fun onReplyBytes(token: Long, data: ByteArray) {
        JvmThreads.stayAttached()
        waiting.remove(token)?.complete(data)
    }

    override fun onTold(token: Long) {
        JvmThreads.stayAttached()
        waiting.remove(token)?.complete(null)
    }

    override fun onFailure(token: Long, failure: Failure) {
        JvmThreads.stayAttached()
        waiting.remove(token)?.fail(AskException.of(failure))
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
        private val waiting = ConcurrentHashMap<Long, Completion>()
        private val streams = ConcurrentHashMap<Long, Completion>()
        private val tokens = AtomicLong(1)

        /** A host-object reply (its object, or why it could not be looked up). */
        fun reply(token: Long, value: Any?, missing: AskException?) {
            val completion = waiting.remove(token) ?: return
            if (missing != null) completion.fail(missing) else completion.complete(value)
        }
    }
}
