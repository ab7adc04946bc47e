package askpool

import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/** Numeric options out of range are rejected on every path. */
class OptionsTest {
    @Test
    fun `out-of-range numeric options are InvalidArgument`() {
        invalid("node defaultTimeout < 0") { NodeOptions(defaultTimeout = (-1).seconds) }
        invalid("node defaultTimeout 0") { NodeOptions(defaultTimeout = Duration.ZERO) }
        invalid("node maxAttempts 0") { NodeOptions(maxAttempts = 0) }
        invalid("node maxAttempts < 0") { NodeOptions(maxAttempts = -1) }
        invalid("node dlqCapacity < 0") { NodeOptions(dlqCapacity = -1) }
        invalid("node maxPayloadBytes < 0") { NodeOptions(maxPayloadBytes = -1) }
        invalid("node maxPayloadBytes Long.MIN_VALUE") { NodeOptions(maxPayloadBytes = Long.MIN_VALUE) }
        invalid("concurrency 0") { PoolOptions(concurrency = 0) }
        invalid("concurrency < 0") { PoolOptions(concurrency = -1) }
        invalid("concurrency too big") { PoolOptions(concurrency = PoolOptions.MAX_CONCURRENCY + 1) }
        invalid("maxInFlight 0") { PoolOptions(maxInFlight = 0) }
        invalid("maxInFlight < 0") { PoolOptions(maxInFlight = -5) }
        invalid("dedupCapacity 0") { PoolOptions(dedupCapacity = 0) }
        invalid("dedupCapacity < 0") { PoolOptions(dedupCapacity = -1) }
        invalid("dedupTtl < 0") { PoolOptions(dedupTtl = (-1).milliseconds) }
        invalid("processingTimeout < 0") { PoolOptions(processingTimeout = (-1).milliseconds) }
        invalid("processingTimeout 0") { PoolOptions(processingTimeout = Duration.ZERO) }
        invalid("ask timeout < 0") { AskOptions(timeout = (-1).milliseconds) }
        invalid("ask timeout 0") { AskOptions(timeout = Duration.ZERO) }
        invalid("ask maxAttempts 0") { AskOptions(maxAttempts = 0) }
        invalid("ask maxAttempts < 0") { AskOptions(maxAttempts = -1) }
        invalid("tell timeout < 0") { TellOptions(timeout = (-1).seconds) }
        invalid("tell maxAttempts < 0") { TellOptions(maxAttempts = -3) }
        // The bounds themselves are fine.
        PoolOptions(concurrency = 1)
        PoolOptions(dedupTtl = Duration.ZERO)
        NodeOptions(dlqCapacity = 0)
        NodeOptions(maxPayloadBytes = 0)
        NodeOptions(maxPayloadBytes = null)
        AskOptions(timeout = Duration.INFINITE, maxAttempts = 1)
    }

    @Test
    fun `every path rejects a negative timeout before anything starts`() = runBlocking {
        Node().use { node ->
            val runs = AtomicInteger()
            node.pool("echo") { msg, _ -> runs.incrementAndGet(); msg }
            // The fast path (plain object), the full path (bytes, options), send, tell.
            invalid("fast ask") { runBlocking { node.ask("echo", "x", AskOptions(timeout = (-1).milliseconds)) } }
            invalid("bytes ask") { runBlocking { node.ask("echo", byteArrayOf(1), AskOptions(timeout = (-1).milliseconds)) } }
            invalid("send") { node.send("echo", "x", AskOptions(timeout = (-1).milliseconds, correlationId = null)) }
            invalid("tell") { runBlocking { node.tell("echo", "x", TellOptions(timeout = (-1).milliseconds)) } }
            invalid("pool") { node.pool("p", PoolOptions(concurrency = -1)) { m, _ -> m } }
            assertEquals(0, runs.get())
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
            // A sub-millisecond timeout is 1 ms on both paths, not "none" or 0.
            node.pool("stuck") { _, _ -> awaitCancellation() }
            val fast = failure { node.ask("stuck", "x", AskOptions(timeout = 1.milliseconds / 2)) }
            assertTrue(fast is AskException.AskTimeout, fast.toString())
            val full = failure { node.send("stuck", "x", AskOptions(timeout = 1.milliseconds / 2, maxAttempts = 1)).await() }
            assertTrue(full is AskException.AskTimeout, full.toString())
        }
    }

    @Test
    fun `an oversize ByteArray fails with OversizePayload and is never sent`() = runBlocking {
        Node(NodeOptions(maxPayloadBytes = 1_000)).use { node ->
            val runs = AtomicInteger()
            node.pool("size") { msg, _ -> runs.incrementAndGet(); (msg as ByteArray).size }
            val big = ByteArray(1_001)
            fun oversize(what: String, e: AskException) {
                assertTrue(e is AskException.OversizePayload, "$what: $e")
                e as AskException.OversizePayload
                assertEquals(1_001L, e.size, what)
                assertEquals(1_000L, e.limit, what)
                assertEquals("OVERSIZE_PAYLOAD", e.code, what)
            }
            // A plain ask, one with options (its bytes fingerprinted), send, tells.
            oversize("ask", failure { node.ask("size", big) })
            oversize(
                "ask with options",
                failure { node.ask("size", big, AskOptions(requestId = "00000000000000000000000000000d01", maxAttempts = 1)) },
            )
            oversize("send", failure { node.send("size", big).await() })
            oversize("tell", failure { node.tell("size", big) })
            oversize("tell with options", failure { node.tell("size", big, TellOptions(requestId = "00000000000000000000000000000d02")) })
            assertEquals(0, runs.get())
            // The refused asks' stage streams end on the runtime's threads.
            eventually("no outcome awaited") { node.stats().awaitedOutcomes == 0L }
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
            assertEquals(0L, node.stats().pending)
            // Exactly at the limit: sent, on every path.
            val atLimit = ByteArray(1_000)
            assertEquals(1_000, node.ask("size", atLimit))
            assertEquals(1_000, node.send("size", atLimit).await())
            node.tell("size", atLimit)
            eventually("the tell ran") { runs.get() == 3 }
            // Other objects are not sized: a long string passes by reference.
            node.pool("echo") { msg, _ -> msg }
            val text = "x".repeat(10_000)
            assertSame(text, node.ask("echo", text))
            assertEquals(3, runs.get())
            eventually("no outcome awaited") { node.stats().awaitedOutcomes == 0L }
        }
    }

    @Test
    fun `the default payload bound is the runtime's and null lifts it`() = runBlocking {
        val limit = NodeOptions.DEFAULT_MAX_PAYLOAD_BYTES
        assertEquals(16L * 1024 * 1024, limit)
        assertEquals(limit, NodeOptions().maxPayloadBytes)
        val big = ByteArray(limit.toInt() + 1)
        Node().use { node ->
            val runs = AtomicInteger()
            node.pool("size") { msg, _ -> runs.incrementAndGet(); (msg as ByteArray).size }
            val e = failure { node.ask("size", big) }
            assertTrue(e is AskException.OversizePayload, e.toString())
            assertEquals(limit + 1, (e as AskException.OversizePayload).size)
            assertEquals(limit, e.limit)
            val t = failure { node.tell("size", big) }
            assertTrue(t is AskException.OversizePayload, t.toString())
            assertEquals(0, runs.get())
        }
        Node(NodeOptions(maxPayloadBytes = null)).use { node ->
            val runs = AtomicInteger()
            node.pool("size") { msg, _ -> runs.incrementAndGet(); (msg as ByteArray).size }
            assertEquals(big.size, node.ask("size", big))
            node.tell("size", big)
            eventually("the tell ran") { runs.get() == 2 }
            eventually("no outcome awaited") { node.stats().awaitedOutcomes == 0L }
        }
    }

    @Test
    fun `a durable ask is checked against the payload bound by its encoded message`() = runBlocking {
        Promises.memory().use { p ->
            Node(NodeOptions(maxPayloadBytes = 4)).use { node ->
                node.pool("echo") { m, _ -> m }
                val e = runCatching { node.askDurable(p, "echo", ByteArray(10)) }.exceptionOrNull()
                assertTrue(e is AskException.OversizePayload, "$e")
                assertArrayEquals(byteArrayOf(1), node.askDurable(p, "echo", byteArrayOf(1)).await())
            }
        }
    }
}
