package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.ExecutorCoroutineDispatcher
import kotlinx.coroutines.Runnable
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.launch
import kotlinx.coroutines.newSingleThreadContext
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.AfterEach
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger
import kotlin.coroutines.CoroutineContext
import kotlin.time.Duration.Companion.seconds

/**
 * The hot calls' inline path: a request whose pool worker is idle starts
 * its handler on the asking thread when caller and pool share a
 * dispatcher, and the reply resumes the caller in the same call.
 */
class InlineTest {
    /** A single-thread dispatcher that counts its dispatches. */
    private class Counting(val inner: ExecutorCoroutineDispatcher) : CoroutineDispatcher() {
        val dispatches = AtomicInteger()
        override fun dispatch(context: CoroutineContext, block: Runnable) {
            dispatches.incrementAndGet()
            inner.dispatch(context, block)
        }
    }

    private val threads = mutableListOf<ExecutorCoroutineDispatcher>()

    private fun thread(name: String) = newSingleThreadContext(name).also { threads += it }

    @AfterEach
    fun closeThreads() = threads.forEach { it.close() }

    @Test
    fun `a caller on the pool's dispatcher runs the handler itself and does not suspend`() = runBlocking {
        val here = Counting(thread("inline-caller"))
        Node().use { node ->
            node.pool("echo", PoolOptions(dispatcher = here)) { msg, _ -> Thread.currentThread() to msg }
            val asks = 200
            val before = withContext(here) { here.dispatches.get() }
            withContext(here) {
                val caller = Thread.currentThread()
                repeat(asks) { i ->
                    val order = AskTest.Order(i)
                    val (thread, got) = node.ask("echo", order, AskOptions(timeout = 5.seconds)) as Pair<*, *>
                    assertSame(caller, thread)
                    assertSame(order, got)
                }
            }
            // Dispatched, each ask would cost at least two dispatches (the
            // handler's start, the caller's resume).
            val dispatches = here.dispatches.get() - before
            assertTrue(dispatches < asks / 4, "$dispatches dispatches for $asks asks")
        }
    }

    @Test
    fun `a pool on another dispatcher still runs its handler there`() = runBlocking {
        val poolThread = thread("inline-pool")
        Node().use { node ->
            val expected = withContext(poolThread) { Thread.currentThread() }
            node.pool("where", PoolOptions(dispatcher = poolThread)) { _, _ -> Thread.currentThread() }
            withContext(thread("inline-other")) {
                repeat(50) { assertSame(expected, node.ask("where", it, AskOptions(timeout = 5.seconds))) }
            }
            repeat(50) { assertSame(expected, node.ask("where", it, AskOptions(timeout = 5.seconds))) }
        }
    }

    @Test
    fun `cancelling a caller cancels a handler it started inline`() = runBlocking {
        val here = thread("inline-cancel")
        Node().use { node ->
            val started = CompletableDeferred<RequestContext>()
            val handlerSaw = CompletableDeferred<Boolean>()
            node.pool("wait", PoolOptions(dispatcher = here)) { _, ctx ->
                started.complete(ctx)
                try {
                    awaitCancellation()
                } finally {
                    handlerSaw.complete(ctx.isCancelled)
                }
            }
            val caller = async(here) { node.ask("wait", "x", AskOptions(timeout = 30.seconds)) }
            withTimeout(5_000) { started.await() }
            caller.cancel()
            assertTrue(withTimeout(5_000) { handlerSaw.await() })
            assertTrue(caller.isCancelled)
            assertEquals(0, node.stats().awaitedOutcomes)
        }
    }

    @Test
    fun `a caller cancelled while its handler runs inline still cancels the handler`() = runBlocking {
        val here = thread("inline-race")
        Node().use { node ->
            val caller = CompletableDeferred<kotlinx.coroutines.Job>()
            val handlerSaw = CompletableDeferred<Boolean>()
            // The handler runs inside the caller's ask call and cancels the
            // caller there: before the ask has registered its cancel hook.
            node.pool("self", PoolOptions(dispatcher = here)) { _, ctx ->
                caller.await().cancel()
                try {
                    awaitCancellation()
                } finally {
                    handlerSaw.complete(ctx.isCancelled)
                }
            }
            val job = launch(here, start = kotlinx.coroutines.CoroutineStart.LAZY) {
                node.ask("self", "x", AskOptions(timeout = 30.seconds))
            }
            caller.complete(job)
            job.start()
            assertTrue(withTimeout(5_000) { handlerSaw.await() })
            job.join()
            assertTrue(job.isCancelled)
        }
    }

    @Test
    fun `a handler started inline that blocks on a nested ask gets its reply`() = runBlocking {
        // runBlocking in a handler (a blocking bridge): the nested ask's
        // request came back to this thread in the nested hot call, and was
        // held there for the loop that runs requests, which waited on the
        // blocked handler: the nested ask timed out, every time.
        Node().use { node ->
            node.pool("inner") { m, _ -> m }
            node.pool("outer") { m, _ -> runBlocking { node.ask("inner", m, AskOptions(timeout = 3.seconds)) } }
            // A caller on the pool's dispatcher starts the handler inline.
            val direct = withContext(Dispatchers.Default) {
                runCatching { node.ask("outer", "x", AskOptions(timeout = 10.seconds)) }
            }
            assertEquals("x", direct.getOrThrow())
            // Queued requests: the next one starts inline from the reply of
            // the one before, whatever the callers' dispatcher.
            val queued = (0 until 6).map { async { runCatching { node.ask("outer", it, AskOptions(timeout = 10.seconds)) } } }.awaitAll()
            assertEquals((0 until 6).map { Result.success(it) }, queued)
            assertEquals(0, node.stats().awaitedOutcomes)
        }
    }

    @Test
    fun `handlers that ask other pools, many callers, one dispatcher`() = runBlocking {
        val here = thread("inline-nested")
        Node().use { node ->
            node.pool("inner", PoolOptions(concurrency = 2, dispatcher = here)) { msg, _ -> AskTest.Receipt(msg as AskTest.Order) }
            node.pool("outer", PoolOptions(concurrency = 2, dispatcher = here)) { msg, _ ->
                node.ask("inner", msg, AskOptions(timeout = 5.seconds))
            }
            val orders = (0 until 500).map { AskTest.Order(it) }
            val receipts = withContext(here) {
                orders.map { o -> async { node.ask("outer", o, AskOptions(timeout = 10.seconds)) } }.awaitAll()
            }
            orders.zip(receipts).forEach { (o, r) -> assertSame(o, (r as AskTest.Receipt).order) }
            assertEquals(0, node.stats().awaitedOutcomes)
        }
    }
}
