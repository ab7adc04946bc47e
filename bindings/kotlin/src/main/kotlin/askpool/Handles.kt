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

    /** Handle 0 stands for `null`. */
    internal fun put(obj: Any?): Long = if (obj == null) 0 else objects.put(obj)

    internal fun get(handle: Long): Any? {
        if (handle == 0L) return null
        return objects.get(handle) ?: throw AskException.Internal("host handle $handle is not in the handle table")
    }

    /** Drops the objects Rust no longer holds. */
    fun drain() = Hot.drainReleased { objects.take(it) }

    /** Objects held for Rust right now (after a [drain]). */
    fun size(): Int {
        drain()
        return objects.size()
    }

    /** Handles Rust holds right now (0 once every ask, cache and letter is gone). */
    fun nativeRefs(): Long = askpool.ffi.liveHostRefs()
}
