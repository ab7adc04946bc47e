package askpool

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.time.Duration.Companion.seconds

/** A pool's close racing its handlers' starts and its node's close (review of 72028a8, 8a25ab1). */
class PoolCloseRaceTest {
    @Test
    fun `a handler that starts after its pool's close is told of it`() = runBlocking {
        Node().use { node ->
            val told = CompletableDeferred<Boolean>()
            val pool = node.pool("late-start") { _, ctx -> told.complete(ctx.isCancelled); ByteArray(0) }
            pool.close()
            // A pool worker that took a request just before the close hands
            // it over after it (handleBytes, or an event dispatched late):
            // the handler starts after tellClosed went over the running ones.
            // Started as handleBytes does, but not on a callback thread (that
            // would count as one attached). The request id is none of the
            // runtime's: its reply is dropped.
            pool.start(Long.MAX_VALUE - 7, ByteArray(1))
            assertTrue(withTimeout(5_000) { told.await() }, "the handler was not told its pool closed")
        }
    }

    @Test
    fun `a closed pool's handler still running is cancelled when its node closes`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        val cancelled = CompletableDeferred<Unit>()
        val pool = node.pool("closed-then-node") { _, _ ->
            started.complete(Unit)
            try {
                awaitCancellation()
            } catch (e: CancellationException) {
                cancelled.complete(Unit)
                throw e
            }
        }
        val caller = async { runCatching { node.ask("closed-then-node", "x", AskOptions(timeout = 30.seconds)) } }
        withTimeout(5_000) { started.await() }
        pool.close()
        node.close()
        withTimeout(5_000) { caller.await() }
        withTimeout(5_000) { cancelled.await() }
        eventually("the handler ended: ${pool.running()}") { pool.running() == 0 }
    }

    @Test
    fun `two closes of one pool never close the next pool of its name`() = runBlocking {
        Node().use { node ->
            repeat(400) { i ->
                val old = node.pool("twice") { m, _ -> m }
                val go = java.util.concurrent.CountDownLatch(1)
                val closers = List(2) { Thread { go.await(); old.close() }.apply { start() } }
                go.countDown()
                // Made as soon as the name is free: between the two closes.
                var fresh: Pool? = null
                while (fresh == null) {
                    fresh = try {
                        node.pool("twice") { m, _ -> m }
                    } catch (e: AskException) {
                        null
                    }
                }
                closers.forEach { it.join() }
                assertEquals(i, node.ask("twice", i), "round $i: the new pool was closed")
                fresh.close()
            }
        }
    }

    @Test
    fun `a closed pool's stats are not those of a newer pool of its name`() = runBlocking {
        Node().use { node ->
            val old = node.pool("p") { m, _ -> m }
            old.close()
            val fresh = node.pool("p") { m, _ -> m }
            assertEquals("x", node.ask("p", "x", AskOptions(timeout = 5.seconds)))
            assertEquals(1L, fresh.stats().handlerRuns)
            val e = runCatching { old.stats() }.exceptionOrNull()
            assertTrue(e is AskException.FailedPrecondition, "the closed pool's stats: ${e ?: old.stats()}")
        }
    }
}
