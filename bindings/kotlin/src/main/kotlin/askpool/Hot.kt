package askpool

import com.sun.jna.Memory
import com.sun.jna.Native
import com.sun.jna.Pointer

/**
 * The calls every ask makes, bound with JNA direct mapping and plain
 * integers. A uniffi-generated call or callback builds JNA `Structure`s for
 * its call status, which costs tens of microseconds per crossing (the
 * `kotlin` bench records it as a floor); these cost well under one. The
 * semantics are those of the generated `nodeAsk` / `requestReply`.
 */
internal object Hot {
    init {
        askpool.ffi.uniffiEnsureInitialized()
        Native.register(Hot::class.java, "askpool_uniffi")
    }

    @JvmStatic external fun askpool_hot_ask(node: Long, pool: Long, handle: Long, timeoutMs: Long, token: Long): Long
    @JvmStatic external fun askpool_hot_reply(request: Long, handle: Long): Int
    @JvmStatic external fun askpool_hot_probe(x: Long): Long
    @JvmStatic external fun askpool_hot_wait(buf: Pointer, cap: Int, timeoutMs: Int): Int

    fun ask(node: Long, pool: Long, handle: Long, timeoutMs: Long, token: Long): Long {
        val r = askpool_hot_ask(node, pool, handle, timeoutMs, token)
        if (r == -2L) throw AskException.Internal("panic in askpool (ask); see stderr")
        return r
    }

    fun reply(request: Long, handle: Long) {
        if (askpool_hot_reply(request, handle) == -2) throw AskException.Internal("panic in askpool (reply); see stderr")
    }

    private const val KIND_REPLY = 1L
    private const val KIND_HANDLE = 2L
    private const val CAP = 256

    /**
     * The one thread that takes replies and requests from the runtime. It
     * only looks objects up and hands them to coroutines: it never runs a
     * handler or a caller's code.
     */
    private val events = Thread({
        val buf = Memory(CAP * 4L * 8)
        val words = LongArray(CAP * 4)
        while (true) {
            val n = askpool_hot_wait(buf, CAP, 1_000)
            if (n <= 0) continue
            buf.read(0, words, 0, n * 4)
            for (i in 0 until n) {
                val kind = words[4 * i]
                val a = words[4 * i + 1]
                val b = words[4 * i + 2]
                val handle = words[4 * i + 3]
                try {
                    when (kind) {
                        KIND_REPLY -> Completions.reply(a, handle)
                        KIND_HANDLE -> Pool.dispatch(a, b, handle)
                    }
                } catch (e: Throwable) {
                    // Keep the thread alive whatever one event did.
                    e.printStackTrace()
                }
            }
        }
    }, "askpool-events").apply {
        isDaemon = true
        start()
    }

    fun start() = events.isAlive
}
