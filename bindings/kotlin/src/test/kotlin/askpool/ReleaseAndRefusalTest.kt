package askpool

import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.coroutines.CoroutineContext
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/**
 * Objects of finished asks are let go on every way of asking, not only the
 * plain ask's; a request whose handler the pool's dispatcher will not run
 * is answered at once.
 */
class ReleaseAndRefusalTest {
    private class Big(val data: IntArray = IntArray(16))

    /** A tiny reply cache, so that finished asks' objects are released at once. */
    private val releasing = PoolOptions(dedupCapacity = 1, dedupTtl = 1.milliseconds)

    @Test
    fun `asks with options, sends and tells release their objects as they go`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("echo", releasing) { _, _ -> "ok" }
            node.pool("sink", releasing) { _, _ -> null }
            HandleTable.drain()
            val before = HandleTable.heldWithoutDrain()
            repeat(2_000) {
                node.ask("echo", Big(), AskOptions(correlationId = "0123456789abcdef0123456789abcdef"))
                node.send("echo", Big()).await()
                node.tell("sink", Big())
            }
            // Drained along the way, not only at a close or a size(): about
            // one batch can be left over, not the 8,000 objects put.
            val held = HandleTable.heldWithoutDrain() - before
            assertTrue(held < 1_000, "the handle table still holds $held objects of finished asks")
        }
    }

    @Test
    fun `replies the cache lets go at their TTL leave the table with no ask after them`() = runBlocking {
        Node().use { node ->
            node.pool("echo", PoolOptions(dedupTtl = 100.milliseconds)) { _, _ -> Big() }
            // Settled first: an earlier test's objects leaving the table
            // during this one would be counted against this one's.
            eventually("the table settled: ${HandleTable.heldWithoutDrain()} held") {
                HandleTable.drain()
                HandleTable.heldWithoutDrain() == 0
            }
            val before = HandleTable.heldWithoutDrain()
            repeat(50) { node.ask("echo", Big()) }
            assertTrue(HandleTable.heldWithoutDrain() - before >= 50, "the cache holds the replies")
            // Nothing asks or drains from here on: the pool's sweep lets the
            // replies go at their TTL, and the event thread drains when idle.
            val deadline = System.nanoTime() + 20.seconds.inWholeNanoseconds
            while (HandleTable.heldWithoutDrain() > before && System.nanoTime() < deadline) {
                kotlinx.coroutines.delay(20)
            }
            assertEquals(before, HandleTable.heldWithoutDrain(), "objects of replies past their TTL")
        }
    }

    /** A dispatcher that runs nothing (as Dispatchers.Main with no main module). */
    private object Refusing : CoroutineDispatcher() {
        override fun dispatch(context: CoroutineContext, block: Runnable) {
            throw IllegalStateException("this dispatcher runs nothing")
        }
    }

    @Test
    fun `a handler the pool's dispatcher refuses is answered at once, and the pool goes on`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            val pool = node.pool("refused", PoolOptions(dispatcher = Refusing)) { m, _ -> m }
            repeat(3) {
                val started = System.nanoTime()
                val outcome = runCatching { node.ask("refused", "obj", AskOptions(timeout = 10.seconds)) }
                val error = outcome.exceptionOrNull()
                assertTrue(error is AskException.Internal, "got $outcome")
                assertTrue("did not run the handler" in error!!.message.orEmpty(), error.message)
                assertTrue(System.nanoTime() - started < 5_000_000_000L, "answered only at the timeout")
            }
            eventually("the request left the pool") { pool.running() == 0 }
            assertEquals(0L, node.stats().pending)
        }
    }
}
