package askpool

import askpool.ffi.NativePromises
import askpool.ffi.PromiseFault
import askpool.ffi.PromiseRecord
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.withContext
import java.nio.file.Path
import kotlin.time.Duration
import kotlin.time.Duration.Companion.hours
import kotlin.time.Duration.Companion.milliseconds

/** Where a promise is: pending, or settled one of four ways. */
enum class PromiseState { PENDING, RESOLVED, REJECTED, CANCELED, TIMEDOUT }

/** A durable promise as stored; times are Unix milliseconds. */
class DurablePromise internal constructor(r: PromiseRecord) {
    val id: String = r.id
    val state: PromiseState = PromiseState.valueOf(r.state)
    val param: ByteArray = r.param
    val value: ByteArray? = r.value
    val timeoutAt: Long = r.timeoutAt.toLong()
    val createdAt: Long = r.createdAt.toLong()
    val settledAt: Long? = r.settledAt?.toLong()
    /** This answer repeats an earlier call with the same idempotency key. */
    val replayed: Boolean = r.replayed

    override fun toString() = "DurablePromise($id, $state)"
}

/**
 * What a promise-store call fails with. [code] is the store's stable name
 * (`NotFound`, `AlreadySettled`, `Corrupt`, ...), shared with the other bindings.
 */
sealed class PromiseException(message: String, val code: String) : RuntimeException(message) {
    /** No promise has this id. */
    class NotFound(message: String) : PromiseException(message, "NotFound")
    /** The id is taken by a create with another key. */
    class AlreadyExists(message: String) : PromiseException(message, "AlreadyExists")
    /** A refused transition: the promise already settled (another way, or without this key). */
    class AlreadySettled(message: String) : PromiseException(message, "AlreadySettled")
    /** The file is not a usable promise store: corrupt, foreign, or from a newer build. */
    class BadDatabase(message: String, code: String) : PromiseException(message, code)
    /** Another connection holds the file's lock; worth retrying. */
    class Locked(message: String) : PromiseException(message, "Locked")
    class InvalidArgument(message: String) : PromiseException(message, "InvalidArgument")
    /** The store was [Promises.close]d. */
    class Closed(message: String = "promise store closed") : PromiseException(message, "Closed")
    /** Any other storage failure. */
    class Storage(message: String, code: String) : PromiseException(message, code)

    internal companion object {
        fun of(f: PromiseFault.Store): PromiseException {
            val m = f.detail
            return when (f.code) {
                "NotFound" -> NotFound(m)
                "AlreadyExists" -> AlreadyExists(m)
                "AlreadySettled" -> AlreadySettled(m)
                "Corrupt", "Foreign", "NewerVersion" -> BadDatabase(m, f.code)
                "Locked" -> Locked(m)
                "InvalidArgument" -> InvalidArgument(m)
                "Closed" -> Closed(m)
                else -> Storage(m, f.code)
            }
        }

        inline fun <T> native(call: () -> T): T = try {
            call()
        } catch (e: PromiseFault.Store) {
            throw of(e)
        } catch (e: askpool.ffi.InternalException) {
            throw Storage("internal error: ${e.message}", "Internal")
        } catch (e: java.nio.charset.CharacterCodingException) {
            throw InvalidArgument(notUnicode(e))
        }
    }
}

/**
 * A store of durable promises: a SQLite file shared by processes, or
 * memory (tests). Payloads are bytes; see [DurableCodec] for typed values.
 *
 * ```
 * Promises.open("orders.db").use { p ->
 *     p.create("order-7", timeout = 1.hours)
 *     p.resolve("order-7", "paid".encodeToByteArray())
 * }
 * ```
 */
class Promises private constructor(internal val native: NativePromises) : AutoCloseable {
    @Volatile internal var closed = false
        private set

    /**
     * Runs [body] with the native store, held for the call: a store closed
     * before (or while) it runs throws [closedError] instead. The generated
     * code does not check a closed object passed as an argument (a durable
     * ask's store): its freed handle would be used.
     */
    internal inline fun <T> held(closedError: () -> Throwable, body: (NativePromises) -> T): T {
        if (closed) throw closedError()
        return try {
            native.callWithHandle { body(native) }
        } catch (e: IllegalStateException) {
            if (closed) throw closedError()
            throw e
        }
    }

    /** Creates a promise pending for [timeout]; with [key] a repeat returns the same promise. */
    fun create(
        id: String,
        timeout: Duration,
        param: ByteArray = ByteArray(0),
        key: String? = null,
    ): DurablePromise = call { it.create(id, param, timeout.millis(), key) }

    /** @throws PromiseException.NotFound */
    fun get(id: String): DurablePromise = call { it.get(id) }

    /** Settles [id] as resolved; with the [key] of an earlier completion, a repeat replays it. */
    fun resolve(id: String, value: ByteArray = ByteArray(0), key: String? = null): DurablePromise =
        call { it.resolve(id, value, key) }

    fun reject(id: String, value: ByteArray = ByteArray(0), key: String? = null): DurablePromise =
        call { it.reject(id, value, key) }

    fun cancel(id: String, value: ByteArray = ByteArray(0), key: String? = null): DurablePromise =
        call { it.cancel(id, value, key) }

    /**
     * Deletes the promises settled more than [olderThan] ago (after timing
     * out the pending ones past their timeout) and returns how many. The
     * store keeps every promise until pruned: call this on a schedule, with
     * a retention period. A pruned durable ask is forgotten: asked again
     * under its id, it runs again.
     * @throws PromiseException.InvalidArgument [olderThan] is negative.
     */
    fun prune(olderThan: Duration): Long =
        store { PromiseException.native { it.prune(olderThan.millis("a retention")) } }.toLong()

    /**
     * Suspends until [id] settles (or times out). Completions by this store
     * wake it at once; another process's are seen by polling. Cancelling
     * the calling coroutine ends the wait; [close] ends it with
     * [PromiseException.Closed].
     */
    suspend fun await(id: String): DurablePromise {
        if (closed) throw PromiseException.Closed()
        return try {
            // The native wait resumes its caller on a runtime thread: an
            // unconfined caller's code would run on there (and JNA could not
            // detach the thread after), so such a caller waits on
            // Dispatchers.IO, where it may block, as an ask's caller does
            // ([JvmThreads.offLibraryThread]).
            val record = if (JvmThreads.dispatches(currentCoroutineContext())) {
                wait(id)
            } else {
                withContext(Dispatchers.IO) { wait(id) }
            }
            DurablePromise(record)
        } catch (e: IllegalStateException) {
            if (closed) throw PromiseException.Closed()
            throw e
        }
    }

    /**
     * Closes the store; every call after throws [PromiseException.Closed],
     * and so does every [await] still waiting. Idempotent.
     */
    override fun close() {
        synchronized(this) {
            if (closed) return
            closed = true
        }
        native.shutdown()
        native.close()
    }

    /** Its errors mapped as every other call's (an id that is not Unicode included). */
    private suspend fun wait(id: String): PromiseRecord = PromiseException.native { native.wait(id) }

    private inline fun <T> store(body: (NativePromises) -> T): T = held({ PromiseException.Closed() }, body)

    private inline fun call(op: (NativePromises) -> PromiseRecord) =
        DurablePromise(store { PromiseException.native { op(it) } })

    companion object {
        init {
            JvmThreads.ensure()
        }

        /**
         * Opens (or creates) the SQLite store at [path]. A durable ask's
         * promise stays pending at most [durableTimeout].
         * @throws PromiseException.BadDatabase the file is no promise store.
         */
        fun open(path: Path, durableTimeout: Duration = 1.hours): Promises =
            Promises(PromiseException.native { NativePromises.open(path.toString(), durableTimeout.durableMillis()) })

        fun open(path: String, durableTimeout: Duration = 1.hours): Promises = open(Path.of(path), durableTimeout)

        /** A store in memory, gone with the process. */
        fun memory(durableTimeout: Duration = 1.hours): Promises =
            Promises(NativePromises.memory(durableTimeout.durableMillis()))

        /** Shorter, every durable ask would time out as it is stored. */
        private fun Duration.durableMillis(): ULong {
            if (this < 1.milliseconds) {
                throw PromiseException.InvalidArgument("durableTimeout must be at least 1 ms: $this")
            }
            return millis("durableTimeout")
        }

        /** As the other bindings and the store refuse bad input: [PromiseException.InvalidArgument]. */
        private fun Duration.millis(what: String = "a timeout"): ULong {
            if (isNegative()) throw PromiseException.InvalidArgument("$what must not be negative: $this")
            return inWholeMilliseconds.toULong()
        }
    }
}
