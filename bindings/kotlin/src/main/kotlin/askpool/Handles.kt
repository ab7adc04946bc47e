package askpool

/**
 * The JVM side of "objects pass directly": an object given to `ask` (or
 * returned by a handler) stays here and Rust carries its handle, so the
 * other side gets the very same reference. Rust decides when a handle is
 * released (it may keep the object for retries, its reply cache or the
 * DLQ); released handles are drained in batches.
 */
object HandleTable {
    init {
        JvmThreads.ensure()
    }

    private val objects = Slots<Any>()

    /** Objects put since the last drain by [put], across threads. */
    private val sincePut = java.util.concurrent.atomic.AtomicLong()

    /**
     * Handle 0 stands for `null`. Every [DRAIN_EVERY] puts also drain: the
     * plain ask drains as the native side asks it to, but a program that
     * only sends, tells, replays or asks with options would otherwise keep
     * every finished ask's objects until its node closes.
     */
    internal fun put(obj: Any?): Long {
        if (obj == null) return 0
        if (sincePut.incrementAndGet() % DRAIN_EVERY == 0L) drainQuietly()
        return objects.put(obj)
    }

    /** A drain on an ask's way: a failure there is not the ask's (the next drain retries). */
    internal fun drainQuietly() {
        try {
            drain()
        } catch (e: AskException) {
            e.printStackTrace()
        }
    }

    private const val DRAIN_EVERY = 256L

    internal fun get(handle: Long): Any? {
        if (handle == 0L) return null
        return find(handle) ?: throw AskException.Internal("host handle $handle is not in the handle table")
    }

    /** The object under a non-zero [handle], or null if it was let go. */
    internal fun find(handle: Long): Any? = objects.get(handle)

    /**
     * Drops the object under [handle], put for a call that failed before
     * Rust took the handle on. Also safe if Rust took it and released it
     * again: the drain that comes for it then finds the slot's generation
     * changed, and drops nothing.
     */
    internal fun forget(handle: Long) {
        if (handle != 0L) objects.take(handle)
    }

    /** Drops the objects Rust no longer holds. */
    fun drain() = Hot.drainReleased { objects.take(it) }

    /** Objects held for Rust right now (after a [drain]). */
    fun size(): Int {
        drain()
        return objects.size()
    }

    /** Objects held right now, without a drain first (for tests). */
    internal fun heldWithoutDrain(): Int = objects.size()

    /** Handles Rust holds right now (0 once every ask, cache and letter is gone). */
    fun nativeRefs(): Long = askpool.ffi.liveHostRefs()
}
