package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineStart
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.nio.file.Path
import kotlin.time.Duration.Companion.hours

/** `Promises.await` ends with its caller: a cancelled await or a closed store leaves no wait behind. */
class PromiseWaitTest {
    private suspend fun noWaits() =
        eventually("promise waits still running: ${askpool.ffi.promiseWaitsInFlight()}") {
            askpool.ffi.promiseWaitsInFlight() == 0uL
        }

    @Test
    fun `a store closed under a pending await wakes it with Closed`(@TempDir dir: Path) = runBlocking {
        for (p in listOf(Promises.memory(), Promises.open(dir.resolve("p.db")))) {
            p.create("pending", timeout = 1.hours)
            val waiter = async { runCatching { p.await("pending") }.exceptionOrNull() }
            eventually("the await started") { askpool.ffi.promiseWaitsInFlight() > 0uL }
            p.close()
            val e = withTimeout(5_000) { waiter.await() }
            assertTrue(e is PromiseException.Closed, "await after close: $e")
            noWaits()
        }
    }

    @Test
    fun `cancelled awaits stop waiting in the library`() = runBlocking {
        Promises.memory().use { p ->
            p.create("pending", timeout = 1.hours)
            val waiters = List(50) { launch(start = CoroutineStart.UNDISPATCHED) { p.await("pending") } }
            eventually("the awaits started") { askpool.ffi.promiseWaitsInFlight() >= 50uL }
            waiters.forEach { it.cancelAndJoin() }
            // Each one would poll the store until the promise's timeout, an hour from now.
            noWaits()
            // The promise is untouched, and a new await still sees it settle.
            val again = async { p.await("pending") }
            delay(20)
            p.resolve("pending", byteArrayOf(7))
            assertEquals(PromiseState.RESOLVED, withTimeout(5_000) { again.await() }.state)
        }
        noWaits()
    }

    @Test
    fun `an await of an id that is not Unicode is InvalidArgument, as every call's`() = runBlocking {
        Promises.memory().use { p ->
            val bad = "order-\uD800"
            assertThrows(PromiseException.InvalidArgument::class.java) { p.get(bad) }
            val e = runCatching { withTimeout(5_000) { p.await(bad) } }.exceptionOrNull()
            assertTrue(e is PromiseException.InvalidArgument, "await: $e")
        }
    }

    @Test
    fun `cancelled awaitDurable calls leave no waiter behind`() = runBlocking {
        Promises.memory().use { p ->
            Node().use { node ->
                node.pool("stuck") { _, _ -> awaitCancellation() }
                val d = node.askDurable(p, "stuck", byteArrayOf(1))
                val before = node.stats().awaitedOutcomes
                repeat(20) {
                    launch(start = CoroutineStart.UNDISPATCHED) { node.awaitDurable(p, d.id) }.cancelAndJoin()
                }
                // Each waited (a task and a waiter) until the ask's end, 30 s
                // from now. The count is the process's: an earlier test's
                // waiter may end meanwhile.
                eventually("waiters left: ${node.stats().awaitedOutcomes - before}") {
                    node.stats().awaitedOutcomes <= before
                }
            }
        }
    }

    @Test
    fun `a durable ask awaited again after a cancelled await gets its reply`() = runBlocking {
        Promises.memory().use { p ->
            Node().use { node ->
                val gate = CompletableDeferred<Unit>()
                node.pool("gated") { m, _ ->
                    gate.await()
                    m
                }
                val d = node.askDurable(p, "gated", byteArrayOf(7))
                val first = launch(start = CoroutineStart.UNDISPATCHED) { d.await() }
                first.cancelAndJoin()
                gate.complete(Unit)
                assertArrayEquals(byteArrayOf(7), withTimeout(10_000) { d.await() })
                assertEquals(PromiseState.RESOLVED, p.get(d.id).state)
            }
        }
    }
}
