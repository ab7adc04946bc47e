package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Runnable
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.coroutines.CoroutineContext
import kotlin.time.Duration.Companion.seconds

/** Which cancellations out of a handler are worker-side cancels. */
class HandlerCancelTest {
    @Test
    fun `a handler's own withTimeout is a handler failure, not a worker cancel`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("slow") { _, _ -> withTimeout(1) { delay(100) } }
            val e = failure { node.ask("slow", "x") }
            assertTrue(e is AskException.HandlerFailed, e.toString())
            assertTrue((e as AskException.HandlerFailed).typeName.contains("TimeoutCancellationException"), e.typeName)
            // The same through the full path.
            val e2 = failure { node.send("slow", "x", AskOptions(timeout = 5.seconds)).await() }
            assertTrue(e2 is AskException.HandlerFailed, e2.toString())
        }
    }

    @Test
    fun `a cancelled job the handler waited on is a handler failure`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("waits") { _, _ ->
                val other = CompletableDeferred<Unit>()
                other.cancel()
                other.await()
            }
            val e = failure { node.ask("waits", "x") }
            assertTrue(e is AskException.HandlerFailed, e.toString())
        }
    }

    @Test
    fun `a handler's own withTimeout after its pool closed is still a handler failure`() = runBlocking {
        Node().use { node ->
            val h = node.closeWhileRunning { ctx ->
                // Told of the close, not cancelled: a reply still reaches the caller.
                assertTrue(ctx.isCancelled)
                withTimeout(1) { delay(10_000) }
            }
            val e = failure { h.await() }
            assertTrue(e is AskException.HandlerFailed, e.toString())
            assertTrue((e as AskException.HandlerFailed).typeName.contains("TimeoutCancellationException"), e.typeName)
        }
    }

    @Test
    fun `cancelled() called after its pool closed returns at once`() = runBlocking {
        // The close marks the running request cancelled before the handler
        // ever waits on `cancelled()` (so no signal existed to complete):
        // the wait must see the mark, not wait for a signal never sent.
        Node().use { node ->
            val h = node.closeWhileRunning { ctx ->
                assertTrue(ctx.isCancelled)
                withTimeout(5.seconds) { ctx.cancelled() }
                "told"
            }
            // A close does not interrupt a handler: its reply still arrives.
            assertEquals("told", withTimeout(10.seconds) { h.await() })
        }
    }

    /**
     * Asks pool "p", whose handler waits until the pool is closed and then
     * runs [after]; returns the ask's handle once the pool is closed.
     */
    private suspend fun Node.closeWhileRunning(after: suspend (RequestContext) -> Any?): AskHandle {
        val started = CompletableDeferred<Unit>()
        val poolClosed = CompletableDeferred<Unit>()
        val pool = pool("p") { _, ctx ->
            started.complete(Unit)
            poolClosed.await()
            after(ctx)
        }
        val h = send("p", "x", AskOptions(timeout = 30.seconds))
        withTimeout(10.seconds) { started.await() }
        pool.close()
        poolClosed.complete(Unit)
        return h
    }

    /** Holds the thread of its first dispatch (the event thread, below) until [gate] opens. */
    private class HoldFirstDispatch : CoroutineDispatcher() {
        val entered = CountDownLatch(1)
        val gate = CountDownLatch(1)
        private val first = AtomicBoolean(true)

        override fun dispatch(context: CoroutineContext, block: Runnable) {
            if (first.compareAndSet(true, false)) {
                entered.countDown()
                gate.await()
            }
            Dispatchers.Default.dispatch(context, block)
        }
    }

    @Test
    fun `a cancel that reaches the pool before its handler started cancels the handler`() = runBlocking {
        Node().use { node ->
            val hold = HoldFirstDispatch()
            node.pool("holder", PoolOptions(dispatcher = hold)) { m, _ -> m }
            val sawCancel = CompletableDeferred<Boolean>()
            val victims = node.pool("victim") { _, ctx ->
                // Never ends unless its coroutine is cancelled.
                try {
                    awaitCancellation()
                } finally {
                    sawCancel.complete(ctx.isCancelled)
                }
            }
            // Asks with options start through the generated call: their
            // requests reach the JVM through the event thread.
            val opts = AskOptions(timeout = 30.seconds, correlationId = "000000000000000000000000000000aa")
            val victim = try {
                val held = node.send("holder", "h", opts)
                withContext(Dispatchers.IO) { hold.entered.await() }
                val victim = node.send("victim", "v", opts)
                // Taken by a worker: its request is on its way to the event
                // thread, which is held by the first dispatch.
                eventually("the victim's request was taken") { victims.stats().handlerRuns == 1L }
                victim.cancel()
                eventually("the cancel reached the pool first") { victims.requestEntries() == 1 }
                hold.gate.countDown()
                assertEquals("h", held.await())
                victim
            } finally {
                hold.gate.countDown()
            }
            assertTrue(failure { victim.await() } is AskException.AskCancelled)
            assertEquals(true, withTimeout(10.seconds) { sawCancel.await() }, "the handler was not cancelled")
        }
    }
}
