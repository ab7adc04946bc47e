package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration.Companion.seconds

/** Payload fingerprints (PayloadMismatch) and causation ids. */
class FingerprintTest {
    @Test
    fun `a reused request id with another fingerprint fails with PayloadMismatch`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            val runs = AtomicInteger()
            node.pool("once") { msg, _ -> runs.incrementAndGet(); msg }
            val rid = "00000000000000000000000000000a01"
            val a = "a"
            assertSame(a, node.ask("once", a, AskOptions(requestId = rid, fingerprint = "a".encodeToByteArray())))
            // Same id, same fingerprint: the cached reply, no second run.
            assertSame(a, node.ask("once", "a2", AskOptions(requestId = rid, fingerprint = "a".encodeToByteArray())))
            val e = failure { node.ask("once", "b", AskOptions(requestId = rid, fingerprint = "b".encodeToByteArray())) }
            assertTrue(e is AskException.PayloadMismatch, e.toString())
            assertEquals(1, runs.get())
        }
    }

    @Test
    fun `byte array payloads are fingerprinted without an explicit fingerprint`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            val runs = AtomicInteger()
            node.pool("once") { msg, _ -> runs.incrementAndGet(); msg }
            val rid = "00000000000000000000000000000b01"
            val first = node.ask("once", byteArrayOf(1, 2, 3), AskOptions(requestId = rid)) as ByteArray
            assertEquals(listOf<Byte>(1, 2, 3), first.toList())
            val again = node.ask("once", byteArrayOf(1, 2, 3), AskOptions(requestId = rid)) as ByteArray
            assertEquals(listOf<Byte>(1, 2, 3), again.toList())
            val e = failure { node.ask("once", byteArrayOf(9), AskOptions(requestId = rid)) }
            assertTrue(e is AskException.PayloadMismatch, e.toString())
            // Tells too.
            val tid = "00000000000000000000000000000b02"
            node.tell("once", byteArrayOf(4), TellOptions(requestId = tid))
            val t = failure { node.tell("once", byteArrayOf(5), TellOptions(requestId = tid)) }
            assertTrue(t is AskException.PayloadMismatch, t.toString())
            // A tell ends at its Ack; its handler may still be on its way.
            withTimeout(5.seconds) { while (runs.get() < 2) delay(5) }
            assertEquals(2, runs.get())
        }
    }

    @Test
    fun `a causation id reaches the handler`() = runBlocking {
        Node().use { node ->
            node.pool("echo") { _, ctx -> ctx.causationId }
            val cid = "00000000000000000000000000000c01"
            assertEquals(cid, node.ask("echo", "x", AskOptions(causationId = cid)))
            assertEquals("", node.ask("echo", "x"))
            val e = failure { node.ask("echo", "x", AskOptions(causationId = "nope")) }
            assertTrue(e is AskException.InvalidArgument, e.toString())
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
        }
    }

    @Test
    fun `a tell's causation and correlation ids reach the handler`() = runBlocking {
        Node().use { node ->
            val seen = CompletableDeferred<Pair<String, String>>()
            node.pool("sink") { _, ctx -> seen.complete(ctx.causationId to ctx.correlationId); null }
            val cause = "00000000000000000000000000000c02"
            val corr = "00000000000000000000000000000c03"
            node.tell("sink", "x", TellOptions(causationId = cause, correlationId = corr))
            assertEquals(cause to corr, withTimeout(5.seconds) { seen.await() })
            val e = failure { node.tell("sink", "x", TellOptions(causationId = "nope")) }
            assertTrue(e is AskException.InvalidArgument, e.toString())
            val c = failure { node.tell("sink", "x", TellOptions(correlationId = "nope")) }
            assertTrue(c is AskException.InvalidArgument, c.toString())
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
        }
    }
}
