package askpool

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotSame
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.time.Duration.Companion.seconds

class AskTest {
    class Order(val id: Int)
    class Receipt(val order: Order)

    @Test
    fun `objects pass by reference both ways`() = runBlocking {
        Node().use { node ->
            val seen = CompletableDeferred<Any?>()
            val reply = Receipt(Order(0))
            node.pool("orders") { msg, _ ->
                seen.complete(msg)
                reply
            }
            val order = Order(7)
            val got = node.ask("orders", order, AskOptions(timeout = 5.seconds))
            assertSame(order, seen.await())
            assertSame(reply, got)
        }
    }

    @Test
    fun `byte arrays cross as bytes`() = runBlocking {
        Node().use { node ->
            node.pool("rev") { msg, _ -> (msg as ByteArray).reversedArray() }
            val sent = byteArrayOf(1, 2, 3, 4)
            val got = node.ask("rev", sent) as ByteArray
            assertArrayEquals(byteArrayOf(4, 3, 2, 1), got)
            assertNotSame(sent, got)
        }
    }

    @Test
    fun `null messages and replies`() = runBlocking {
        Node().use { node ->
            node.pool("nothing") { msg, _ -> assertNull(msg); null }
            assertNull(node.ask("nothing", null))
        }
    }

    @Test
    fun `the handle carries the request id and streams the stages`() = runBlocking {
        Node().use { node ->
            node.pool("slow") { msg, ctx ->
                ctx.progress(0.5f, "half")
                kotlinx.coroutines.delay(20)
                "${ctx.requestId}:$msg"
            }
            val handle = node.send("slow", "x", AskOptions(timeout = 5.seconds))
            assertTrue(Regex("[0-9a-f]{32}").matches(handle.requestId), handle.requestId)
            assertEquals("${handle.requestId}:x", handle.await())
            val stages = withTimeout(5_000) { handle.stages.toList() }.map { it.stage }
            assertEquals("SENT", stages.first())
            assertEquals("FULFILLED", stages.last())
            assertTrue("PARTIAL" in stages, stages.toString())
            // One collection, as in Python and Node: a second one would
            // split the events with the first.
            val again = failure { handle.stages.toList() }
            assertTrue(again is AskException.InvalidArgument, again.toString())
        }
    }

    @Test
    fun `a reused request id is answered from the reply cache with the same object`() = runBlocking {
        Node().use { node ->
            var runs = 0
            node.pool("once") { _, _ -> runs++; Any() }
            val first = node.send("once", "a")
            val again = AskOptions(requestId = first.requestId)
            val reply = first.await()
            assertSame(reply, node.ask("once", "a", again))
            assertSame(reply, node.ask("once", "a", again))
            assertEquals(1, runs)
        }
    }

    @Test
    fun `preferred worker and correlation id options are accepted`() = runBlocking {
        Node().use { node ->
            node.pool("p", PoolOptions(concurrency = 2)) { _, ctx -> ctx.correlationId }
            val corr = "0123456789abcdef0123456789abcdef"
            val got = node.ask("p", 1, AskOptions(preferredWorker = "w1", correlationId = corr))
            assertEquals(corr, got)
        }
    }

    @Test
    fun `tell is accepted once per request id`() = runBlocking {
        Node().use { node ->
            val runs = java.util.concurrent.atomic.AtomicInteger()
            val ran = CompletableDeferred<Any?>()
            node.pool("log") { msg, _ -> runs.incrementAndGet(); ran.complete(msg); null }
            val msg = Order(1)
            val id = node.tell("log", msg)
            assertSame(msg, withTimeout(5_000) { ran.await() })
            assertEquals(id, node.tell("log", msg, TellOptions(requestId = id)))
            kotlinx.coroutines.delay(50)
            assertEquals(1, runs.get())
        }
    }

    @Test
    fun `cancelling the caller cancels the handler`() = runBlocking {
        Node().use { node ->
            val started = CompletableDeferred<RequestContext>()
            val handlerSaw = CompletableDeferred<Boolean>()
            node.pool("wait") { _, ctx ->
                started.complete(ctx)
                try {
                    awaitCancellation()
                } finally {
                    handlerSaw.complete(ctx.isCancelled)
                }
            }
            val caller = async { node.ask("wait", "x", AskOptions(timeout = 30.seconds)) }
            withTimeout(5_000) { started.await() }
            caller.cancel()
            assertTrue(withTimeout(5_000) { handlerSaw.await() })
            assertTrue(caller.isCancelled)
        }
    }

    @Test
    fun `a handle cancel fails the ask with AskCancelled`() = runBlocking {
        Node().use { node ->
            val started = CompletableDeferred<RequestContext>()
            node.pool("wait") { _, ctx -> started.complete(ctx); ctx.cancelled(); "late" }
            val handle = node.send("wait", "x")
            val ctx = withTimeout(5_000) { started.await() }
            handle.cancel()
            val e = runCatching { handle.await() }.exceptionOrNull()
            assertTrue(e is AskException.AskCancelled, e.toString())
            assertEquals(CancelReason.CALLER, (e as AskException.AskCancelled).reason)
            withTimeout(5_000) { ctx.cancelled() }
            assertTrue(ctx.isCancelled)
        }
    }

    @Test
    fun `a handler running when its pool closes still gives its reply`() = runBlocking {
        // A pool's close does not interrupt a running handler: the reply it
        // gives reaches its caller (Rust's Pool::close, as in Python and
        // Node). The close reached the host as the request's cancel, whose
        // coroutine was cancelled: the caller got AskCancelled instead.
        Node().use { node ->
            val started = CompletableDeferred<RequestContext>()
            val release = CompletableDeferred<Unit>()
            val pool = node.pool("closing") { _, ctx ->
                started.complete(ctx)
                release.await()
                if (ctx.isCancelled) "done, told of the close" else "done"
            }
            val caller = async { runCatching { node.ask("closing", "x", AskOptions(timeout = 30.seconds)) } }
            val ctx = withTimeout(5_000) { started.await() }
            pool.close()
            // The close reaches the handler's context from the runtime's
            // thread: wait for it rather than for a fixed time.
            eventually("the handler told of the close") { ctx.isCancelled }
            release.complete(Unit)
            val reply = withTimeout(5_000) { caller.await() }
            assertEquals("done, told of the close", reply.getOrNull(), reply.toString())
        }
    }

    @Test
    fun `a worker-side cancel reaches the caller`() = runBlocking {
        Node().use { node ->
            node.pool("quit") { _, _ -> throw CancellationException("worker gave up") }
            val e = runCatching { node.ask("quit", "x") }.exceptionOrNull()
            assertTrue(e is AskException.AskCancelled, e.toString())
            assertEquals(CancelReason.WORKER, (e as AskException.AskCancelled).reason)
        }
    }
}
