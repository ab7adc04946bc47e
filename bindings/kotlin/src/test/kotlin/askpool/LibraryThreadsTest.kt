package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.suspendCancellableCoroutine
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.withTimeoutOrNull
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration.Companion.hours
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/**
 * The library's threads (the runtime's, `askpool-events`) never run host
 * code: a handler or caller blocking one would stall every ask's timers.
 * Code that runs in place where it is resumed or launched (an unconfined
 * dispatcher) is moved off them.
 */
class LibraryThreadsTest {
    /** Asks with options start through the generated call: their requests come through the event thread. */
    private val viaEvents = AskOptions(timeout = 10.seconds, correlationId = "000000000000000000000000000000aa")

    /** A thread the library made or attached (a runtime thread, or one JNA attached for a callback). */
    private fun native(t: Thread) = t.name.startsWith("askpool") || t.name.startsWith("Thread-")

    /**
     * Whether this thread is one of the library's, judged by its name, not
     * by [JvmThreads.onLibraryThread] (the flag the code under test decides by).
     */
    private fun onNative() = native(Thread.currentThread())

    @Test
    fun `an unconfined pool's handler never runs on a library thread`() = runBlocking {
        Node().use { node ->
            val onLibrary = AtomicInteger()
            val ran = AtomicInteger()
            val seen = java.util.concurrent.ConcurrentHashMap.newKeySet<String>()
            node.pool("unconfined", PoolOptions(dispatcher = Dispatchers.Unconfined)) { _, _ ->
                ran.incrementAndGet()
                seen.add(Thread.currentThread().name)
                if (onNative()) onLibrary.incrementAndGet()
                byteArrayOf(0)
            }
            withContext(Dispatchers.IO) {
                repeat(20) {
                    // Bytes reach the pool on a runtime thread (handleBytes), an
                    // object asked with options on the event thread.
                    node.ask("unconfined", byteArrayOf(1), viaEvents)
                    node.ask("unconfined", "x", viaEvents)
                }
            }
            assertEquals(40, ran.get())
            assertEquals(0, onLibrary.get(), "handlers run on a library thread: $seen")
        }
    }

    @Test
    fun `an unconfined pool's blocking handlers do not stall other asks' timers`() = runBlocking {
        Node().use { node ->
            val release = CountDownLatch(1)
            val blocking = AtomicInteger()
            // As many as the runtime has threads: run on them, they stopped every timer.
            val n = askpool.ffi.runtimeWorkerThreads().toInt()
            node.pool("blocking", PoolOptions(concurrency = n, dispatcher = Dispatchers.Unconfined)) { _, _ ->
                blocking.incrementAndGet()
                release.await()
                byteArrayOf(0)
            }
            node.pool("stuck") { _, _ -> awaitCancellation() }
            try {
                val blockers = List(n) { node.send("blocking", byteArrayOf(1)) }
                val timedOut = withTimeoutOrNull(20.seconds) {
                    eventually("every handler blocks") { blocking.get() == n }
                    try {
                        node.ask("stuck", "x", AskOptions(timeout = 100.milliseconds))
                    } catch (e: AskException) {
                        e
                    }
                }
                assertTrue(timedOut is AskException.AskTimeout, "a 100 ms ask while handlers block: $timedOut (null: none in 20 s)")
                release.countDown()
                blockers.forEach { it.await() }
            } finally {
                release.countDown()
            }
        }
    }

    @Test
    fun `a handler's cancel wakes its waiters off the library's threads`() = runBlocking {
        Node().use { node ->
            val started = CompletableDeferred<Unit>()
            val waiterOnLibrary = CompletableDeferred<String?>()
            val cleanupOnLibrary = CompletableDeferred<String?>()
            // The thread's name when it is one of the library's, else null.
            fun libraryThread() = Thread.currentThread().name.takeIf { onNative() }
            node.pool("p") { _, ctx ->
                // Unconfined: resumed in place by whatever completes the cancel signal.
                this@runBlocking.launch(Dispatchers.Unconfined) {
                    ctx.cancelled()
                    waiterOnLibrary.complete(libraryThread())
                }
                suspendCancellableCoroutine<Unit> { cont ->
                    // Runs in place on the thread that cancels the handler's job.
                    cont.invokeOnCancellation { cleanupOnLibrary.complete(libraryThread()) }
                    started.complete(Unit)
                }
            }
            val h = node.send("p", "x")
            withTimeout(10.seconds) { started.await() }
            h.cancel()
            assertTrue(failure { h.await() } is AskException.AskCancelled)
            assertEquals(null, withTimeout(10.seconds) { waiterOnLibrary.await() }, "ctx.cancelled() resumed on a library thread")
            assertEquals(null, withTimeout(10.seconds) { cleanupOnLibrary.await() }, "invokeOnCancellation ran on a library thread")
        }
    }

    @Test
    fun `an unconfined Promises await resumes off the library's threads`() = runBlocking {
        Promises.memory().use { p ->
            p.create("x", 1.hours)
            val resumedOn = async(Dispatchers.Unconfined) {
                p.await("x")
                Thread.currentThread()
            }
            eventually("the await started") { askpool.ffi.promiseWaitsInFlight() > 0uL }
            p.resolve("x", byteArrayOf(1))
            val thread = withTimeout(10.seconds) { resumedOn.await() }
            assertFalse(native(thread), "resumed on ${thread.name}")
        }
    }
}
