package askpool

/**
 * Objects kept under a `Long` handle this table picks, for the per-ask
 * bookkeeping (the handle table, the waiting completions). A
 * `ConcurrentHashMap<Long, _>` costs a boxed key, a node and a shared
 * counter update (`addCount`) per put and per remove; here a handle is an
 * array slot, reused through a free list, so a put or a remove allocates
 * nothing and touches no cache line shared by all threads.
 *
 * The slots are split in stripes, each behind its own lock; a thread puts
 * into the stripe of its id, so two threads rarely meet on a lock. A handle
 * is `generation << 32 | index << STRIPE_BITS | stripe`: a slot's generation
 * changes when it is freed, so a stale handle finds nothing instead of the
 * slot's next object, and no handle is 0 (generations start at 1).
 */
internal class Slots<T : Any> {
    private class Stripe {
        var values = arrayOfNulls<Any>(INITIAL)
        var generations = IntArray(INITIAL) { 1 }
        var free = IntArray(INITIAL)
        var freeCount = 0
        /** Slots ever handed out (the rest of the arrays is untouched). */
        var used = 0
        var size = 0

        /** Empties slot [i] (if it holds a value) for reuse; returns the value. */
        fun free(i: Int): Any? {
            val value = values[i] ?: return null
            values[i] = null
            // Generations stay in 1..Int.MAX_VALUE: handles are positive and never 0.
            val generation = generations[i]
            generations[i] = if (generation == Int.MAX_VALUE) 1 else generation + 1
            free[freeCount++] = i
            size--
            return value
        }

        fun grow() {
            val n = values.size * 2
            values = values.copyOf(n)
            val g = generations.copyOf(n)
            g.fill(1, generations.size, n)
            generations = g
            free = free.copyOf(n)
        }
    }

    private val stripes = Array(STRIPES) { Stripe() }

    @Suppress("DEPRECATION") // Thread.threadId() is JDK 19+.
    fun put(value: T): Long {
        val s = Thread.currentThread().id.toInt() and MASK
        val stripe = stripes[s]
        synchronized(stripe) {
            val i = if (stripe.freeCount > 0) {
                stripe.free[--stripe.freeCount]
            } else {
                if (stripe.used == stripe.values.size) stripe.grow()
                stripe.used++
            }
            stripe.values[i] = value
            stripe.size++
            return (stripe.generations[i].toLong() shl 32) or (i.toLong() shl STRIPE_BITS) or s.toLong()
        }
    }

    /** The value under [handle], or null if there is none (never was, or taken). */
    @Suppress("UNCHECKED_CAST")
    fun get(handle: Long): T? = at(handle) { stripe, i -> stripe.values[i] as T? }

    /** Removes and returns the value under [handle] (null if there is none). */
    @Suppress("UNCHECKED_CAST")
    fun take(handle: Long): T? = at(handle) { stripe, i -> stripe.free(i) as T? }

    /** Runs [body] on the slot of [handle] under its stripe's lock, if the handle is current. */
    private inline fun <R> at(handle: Long, body: (Stripe, Int) -> R?): R? {
        val stripe = stripes[handle.toInt() and MASK]
        val i = handle.toInt() ushr STRIPE_BITS
        val generation = (handle ushr 32).toInt()
        synchronized(stripe) {
            if (i >= stripe.used || stripe.generations[i] != generation) return null
            return body(stripe, i)
        }
    }

    /** Values held right now. */
    fun size(): Int = stripes.sumOf { synchronized(it) { it.size } }

    private companion object {
        const val STRIPE_BITS = 4
        const val STRIPES = 1 shl STRIPE_BITS
        const val MASK = STRIPES - 1
        const val INITIAL = 64
    }
}

/**
 * The requests a pool's handler runs, by the runtime's request token (never
 * 0): striped by token, each stripe an open-addressed table behind its own
 * lock. No boxing, no node per entry, no shared counter. A cancel that comes
 * before its request started leaves a mark the start then finds.
 */
internal class RequestTable {
    private class Stripe {
        var keys = LongArray(INITIAL)
        var values = arrayOfNulls<Any>(INITIAL)
        var entries = 0
        /** Entries that are running requests (the rest are early cancels). */
        var running = 0

        fun slot(key: Long): Int {
            val mask = keys.size - 1
            var i = mix(key) and mask
            while (true) {
                val k = keys[i]
                if (k == key || k == 0L) return i
                i = (i + 1) and mask
            }
        }

        fun get(key: Long): Any? {
            val i = slot(key)
            return if (keys[i] == 0L) null else values[i]
        }

        fun put(key: Long, value: Any) {
            if ((entries + 1) * 2 > keys.size) rehash(keys.size * 2)
            val i = slot(key)
            if (keys[i] == 0L) entries++
            keys[i] = key
            values[i] = value
        }

        fun remove(key: Long): Any? {
            var i = slot(key)
            if (keys[i] == 0L) return null
            val old = values[i]
            entries--
            // Backward-shift deletion: no tombstones, probes stay short.
            val mask = keys.size - 1
            var j = i
            while (true) {
                j = (j + 1) and mask
                val k = keys[j]
                if (k == 0L) break
                val home = mix(k) and mask
                // k moves back to the hole at i unless its home lies cyclically in (i, j].
                val stays = if (i <= j) home in (i + 1)..j else home > i || home <= j
                if (!stays) {
                    keys[i] = k
                    values[i] = values[j]
                    i = j
                }
            }
            keys[i] = 0L
            values[i] = null
            return old
        }

        private fun rehash(n: Int) {
            val oldKeys = keys
            val oldValues = values
            keys = LongArray(n)
            values = arrayOfNulls(n)
            for (i in oldKeys.indices) {
                val k = oldKeys[i]
                if (k != 0L) {
                    val j = slot(k)
                    keys[j] = k
                    values[j] = oldValues[i]
                }
            }
        }
    }

    private val stripes = Array(STRIPES) { Stripe() }

    private fun stripe(key: Long) = stripes[(mix(key) ushr 24) and MASK]

    /** Records a started request; true if its cancel came first. */
    fun start(request: Long, context: RequestContext): Boolean {
        val s = stripe(request)
        synchronized(s) {
            val early = s.get(request) === CANCELLED_EARLY
            s.put(request, context)
            s.running++
            return early
        }
    }

    /**
     * The running request to cancel, or null. A cancel for a request not in
     * the table is kept for its start only while [unanswered] says the
     * runtime still waits for that request's answer: a cancel that crossed
     * the handler's reply (and its [finish]) would otherwise stay here for
     * good, one entry per such race.
     */
    fun cancel(request: Long, unanswered: (Long) -> Boolean): RequestContext? {
        val s = stripe(request)
        synchronized(s) {
            val context = s.get(request)
            if (context == null && unanswered(request)) s.put(request, CANCELLED_EARLY)
            return context as? RequestContext
        }
    }

    /** Entries held: running requests and cancels waiting for their start. */
    fun entries(): Int = stripes.sumOf { synchronized(it) { it.entries } }

    fun finish(request: Long) {
        val s = stripe(request)
        synchronized(s) {
            if (s.remove(request) is RequestContext) s.running--
        }
    }

    /** Runs [action] on every running request (outside the locks). */
    fun forEach(action: (RequestContext) -> Unit) {
        val all = ArrayList<RequestContext>()
        for (s in stripes) synchronized(s) { s.values.filterIsInstanceTo(all) }
        all.forEach(action)
    }

    /** Requests running now. */
    fun size(): Int = stripes.sumOf { synchronized(it) { it.running } }

    private companion object {
        const val STRIPES = 16
        const val MASK = STRIPES - 1
        const val INITIAL = 16
        val CANCELLED_EARLY = Any()

        fun mix(key: Long): Int {
            val h = key * -7046029254386353131L // 0x9E3779B97F4A7C15
            return (h xor (h ushr 32)).toInt() and Int.MAX_VALUE
        }
    }
}
