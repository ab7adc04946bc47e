package askpool

import com.sun.jna.Memory
import com.sun.jna.Native
import com.sun.jna.Pointer
import java.nio.ByteOrder
import java.nio.LongBuffer
import kotlin.coroutines.ContinuationInterceptor

/**
 * The calls every ask makes, bound with JNA direct mapping and plain
 * integers. A uniffi-generated call or callback builds JNA `Structure`s for
 * its call status, which costs tens of microseconds per crossing (the
 * `kotlin` bench records it as a floor); these cost well under one. The
 * semantics are those of the generated `nodeAsk` / `requestReply`.
 *
 * Both return what they set off on the Rust side (bindings/uniffi
 * `exec.rs`): a request for a pool of this JVM whose worker was idle, the
 * reply to an ask of this JVM. This thread takes them on at once, without
 * the runtime's or the event thread's hand-off; everything else still comes
 * through the event thread.
 */
internal object Hot {
    init {
        JvmThreads.ensure()
        askpool.ffi.uniffiEnsureInitialized()
        Native.register(Hot::class.java, "askpool_uniffi")
    }

    @JvmStatic external fun askpool_hot_ask(
        node: Long, pool: Long, handle: Long, timeoutMs: Long, token: Long, flags: Long, buf: Pointer, cap: Int,
    ): Long
    @JvmStatic external fun askpool_hot_reply(request: Long, handle: Long, buf: Pointer, cap: Int): Int
    @JvmStatic external fun askpool_hot_release(): Int
    @JvmStatic external fun askpool_hot_probe(x: Long): Long
    @JvmStatic external fun askpool_hot_wait(buf: Pointer, cap: Int, timeoutMs: Int): Int
    @JvmStatic external fun askpool_hot_take_released(buf: Pointer, cap: Int): Int
    @JvmStatic external fun askpool_hot_stages_free(token: Long): Int

    /** [ask]'s result when the node is closed (nothing will be reported). */
    const val CLOSED = -1L

    /** What a hot call returns when it panicked (the panic was caught). */
    const val PANICKED = -2L

    private const val KIND_REPLY = 1L
    private const val KIND_HANDLE = 2L

    /** [ask]'s flags: a tell (done when the pool accepts it). */
    const val ONE_WAY = 1L

    /** [ask]'s flags: keep the ask's stage record for `openStages`. */
    const val KEEP_STAGES = 2L

    /** Words a hot call writes before its events (see [Started]). */
    private const val HEADER = 4

    /** In a hot call's event kind: Rust holds the object until [askpool_hot_release]. */
    private const val HELD = 0x100L
    private const val CAP = 256

    /** Events one hot call returns at most (the rest go to the event thread). */
    private const val HOT_CAP = 32

    /** Per thread: the buffer hot calls write to, and what this thread is doing. */
    private class Inbox {
        private var memory: Memory? = null

        /** [buf] as longs, read without a JNI call each (valid once [buf] was used). */
        lateinit var longs: LongBuffer

        /** Made on first use: runtime threads that only call back never need one. */
        val buf: Memory
            get() = memory ?: Memory((HEADER + HOT_CAP * 4L) * 8).also {
                memory = it
                longs = it.getByteBuffer(0, it.size()).order(ByteOrder.nativeOrder()).asLongBuffer()
            }

        /** In a hot call: a callback arriving now comes from this JVM thread, not a runtime one. */
        var inCall = false

        /** Taking on events: requests that arrive meanwhile wait in [later]. */
        var taking = false
        val later = ArrayDeque<Request>()

        /** A hot call's events, copied out of [buf]; reused unless a take nests. */
        val words = LongArray(HOT_CAP * 4)
        val objects = arrayOfNulls<Any?>(HOT_CAP)
        val missing = arrayOfNulls<AskException>(HOT_CAP)
        var copying = false
    }

    private class Request(val pool: Long, val request: Long, val msg: Any?, val missing: AskException?)

    /**
     * Handlers one thread starts without a dispatch per batch of events it
     * takes on; the rest are dispatched, so a busy pool's requests do not
     * keep one caller from its own reply for long.
     */
    private const val INLINE_HANDLERS = 16

    private val inboxes = ThreadLocal.withInitial { Inbox() }

    /** Whether this thread is inside a hot call (callbacks then come from a JVM thread). */
    fun inCall(): Boolean = inboxes.get().inCall

    /** What a hot start reports besides its events. */
    class Started {
        /** 32 hex digits. */
        var requestId = ""
        var stagesKept = false
    }

    /**
     * Starts an ask, or a tell ([flags]); returns how many released handles
     * wait to be drained, [CLOSED] if the node is closed, or [PANICKED] (the
     * ask may have started: the caller fails its waiter, then cancels it).
     * [started], if given, gets the ask's id before any event is taken on.
     * [here] is the caller's dispatcher: a request for a pool on that same
     * dispatcher starts on this thread.
     */
    fun ask(
        node: Long, pool: Long, handle: Long, timeoutMs: Long, token: Long, flags: Long,
        started: Started?, here: ContinuationInterceptor?,
    ): Long {
        val inbox = inboxes.get()
        val buf = inbox.buf
        inbox.inCall = true
        val n = try {
            askpool_hot_ask(node, pool, handle, timeoutMs, token, flags, buf, HOT_CAP)
        } finally {
            inbox.inCall = false
        }
        if (n < 0) return n
        val longs = inbox.longs
        val released = longs.get(0)
        // Read now: a handler the events below start may make hot calls
        // of its own on this thread, which reuse the buffer.
        if (started != null) {
            started.requestId = hex(longs.get(1), longs.get(2))
            started.stagesKept = longs.get(3) != 0L
        }
        take(inbox, n.toInt(), here)
        return released
    }

    private val DIGITS = "0123456789abcdef".toCharArray()

    /** A 128-bit id as the core prints it: 32 lowercase hex digits. */
    private fun hex(high: Long, low: Long): String {
        val out = CharArray(32)
        for (i in 0 until 16) {
            val shift = 60 - 4 * i
            out[i] = DIGITS[((high ushr shift) and 15).toInt()]
            out[16 + i] = DIGITS[((low ushr shift) and 15).toInt()]
        }
        return String(out)
    }

    /** Replies to a request; [here] is the handler's dispatcher. */
    fun reply(request: Long, handle: Long, here: ContinuationInterceptor?) {
        val inbox = inboxes.get()
        inbox.inCall = true
        val n = try {
            askpool_hot_reply(request, handle, inbox.buf, HOT_CAP)
        } finally {
            inbox.inCall = false
        }
        if (n == -2) throw AskException.Internal("panic in askpool (reply); see stderr")
        take(inbox, n, here)
    }

    /** Takes on the events a hot call returned. */
    private fun take(inbox: Inbox, n: Int, here: ContinuationInterceptor?) {
        if (n <= 0) return
        // Copied out and looked up first: running a handler below makes
        // hot calls that reuse the buffer and release what Rust held. The
        // arrays are the thread's own unless a reply resumed a caller that
        // asks again on this thread (an unconfined caller) while they are
        // in use.
        val nested = inbox.copying
        inbox.copying = true
        val words = if (nested) LongArray(n * 4) else inbox.words
        val objects = if (nested) arrayOfNulls(n) else inbox.objects
        val missing = if (nested) arrayOfNulls(n) else inbox.missing
        try {
            inbox.longs.get(HEADER, words, 0, n * 4)
            var held = false
            for (i in 0 until n) {
                held = held || words[4 * i] and HELD != 0L
                try {
                    objects[i] = HandleTable.get(words[4 * i + 3])
                    missing[i] = null
                } catch (e: AskException) {
                    objects[i] = null
                    missing[i] = e
                }
            }
            // Requests come unheld (Rust keeps a running request's message
            // until it ends): a call that returned only requests needs no
            // release call.
            if (held && askpool_hot_release() == PANICKED.toInt()) {
                System.err.println("askpool: panic in askpool_hot_release (caught); see above")
            }
            for (i in 0 until n) {
                val a = words[4 * i + 1]
                val obj = objects[i]
                val miss = missing[i]
                objects[i] = null // the arrays must not keep objects alive
                missing[i] = null
                when (words[4 * i] and HELD.inv()) {
                    KIND_REPLY -> guarded { Completions.reply(a, obj, miss) }
                    KIND_HANDLE -> if (inbox.taking && !Pool.runsOn(a, here)) {
                        // A nested call (a handler on this thread asked or
                        // replied) whose request would not start inline
                        // anyway: dispatched now, not held for the loop
                        // below. Held, it waited on the handler, which may
                        // be blocked on it (runBlocking on a nested ask).
                        guarded { Pool.dispatch(a, words[4 * i + 2], obj, miss, null) }
                    } else {
                        inbox.later.addLast(Request(a, words[4 * i + 2], obj, miss))
                    }
                }
            }
        } finally {
            if (!nested) inbox.copying = false
        }
        if (inbox.taking) return
        // The outermost take on this thread runs the requests, one after the
        // other: a handler started here that replies may free a worker for
        // the next request, which then waits in `later` instead of nesting.
        inbox.taking = true
        try {
            var budget = INLINE_HANDLERS
            while (true) {
                val r = inbox.later.removeFirstOrNull() ?: break
                val inline = if (budget > 0) here else null
                budget--
                guarded { Pool.dispatch(r.pool, r.request, r.msg, r.missing, inline) }
            }
        } finally {
            inbox.taking = false
        }
    }

    /**
     * Hands every handle Rust released to [free], in batches through this
     * thread's buffer (a direct call: a generated one returning a list costs
     * far more).
     */
    fun drainReleased(free: (Long) -> Unit) {
        val inbox = inboxes.get()
        val buf = inbox.buf
        val handles = LongArray(RELEASE_CAP)
        while (true) {
            val n = askpool_hot_take_released(buf, RELEASE_CAP)
            if (n < 0) throw AskException.Internal("panic in askpool (take_released); see stderr")
            inbox.longs.get(0, handles, 0, n)
            for (i in 0 until n) free(handles[i])
            if (n < RELEASE_CAP) return
        }
    }

    /** Handles one drain call takes at most: what the thread's buffer holds. */
    private const val RELEASE_CAP = 1 + HOT_CAP * 4

    /** One event's failure must not lose the others. */
    private inline fun guarded(body: () -> Unit) {
        try {
            body()
        } catch (e: Throwable) {
            e.printStackTrace()
        }
    }

    /**
     * The one thread that takes replies and requests from the runtime. It
     * only looks objects up and hands them to coroutines: it never runs a
     * handler or a caller's code.
     */
    private val events = Thread({
        JvmThreads.markLibraryThread()
        val buf = Memory(CAP * 4L * 8)
        val words = LongArray(CAP * 4)
        while (true) {
            val n = askpool_hot_wait(buf, CAP, 1_000)
            if (n == PANICKED.toInt()) {
                // Caught on the Rust side; the queue is intact, so wait again.
                System.err.println("askpool: panic in askpool_hot_wait (caught); see above")
                Thread.sleep(10)
                continue
            }
            if (n == 0) {
                // A second with nothing to take: objects Rust let go of
                // meanwhile with no ask to drain them (replies its cache let
                // go at their TTL) leave the table now, not at the next
                // batch of puts.
                HandleTable.drainQuietly()
                continue
            }
            if (n < 0) continue
            buf.read(0, words, 0, n * 4)
            for (i in 0 until n) {
                val kind = words[4 * i]
                val a = words[4 * i + 1]
                val b = words[4 * i + 2]
                val handle = words[4 * i + 3]
                try {
                    val (obj, missing) = try {
                        HandleTable.get(handle) to null
                    } catch (e: AskException) {
                        null to e
                    }
                    when (kind) {
                        KIND_REPLY -> Completions.reply(a, obj, missing)
                        KIND_HANDLE -> Pool.dispatch(a, b, obj, missing, null)
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
