package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.cancel
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration.Companion.milliseconds

/** What a caller and a handler see at the edges of an ask's life. */
class CallerEdgesTest {
    @Test
    fun `an ask or tell from a cancelled coroutine sends nothing`() = runBlocking {
        Node().use { node ->
            val runs = AtomicInteger()
            node.pool("inline") { m, _ -> runs.incrementAndGet(); m }
            node.pool("own", PoolOptions(dispatcher = Dispatchers.IO)) { m, _ -> runs.incrementAndGet(); m }
            val calls: List<suspend () -> Any?> = listOf(
                { node.ask("inline", "x") },
                { node.ask("own", "x") },
                { node.ask("own", "x", AskOptions(maxAttempts = 1)) },
                { node.tell("own", "x") },
            )
            for (call in calls) {
                repeat(10) {
                    launch(Dispatchers.Default) {
                        cancel()
                        call()
                    }.join()
                }
            }
            delay(100)
            assertEquals(0, runs.get(), "no handler ran for a cancelled caller")
        }
    }

    @Test
    fun `a pool is AutoCloseable, and closing it after its node is nothing`() {
        val node = Node()
        node.pool("p") { m, _ -> m }.use { pool ->
            assertEquals("p", pool.name)
            node.close()
        }
    }

    @Test
    fun `a context's ids read after its handler ended are FailedPrecondition, not empty`() = runBlocking {
        Node().use { node ->
            val later = CompletableDeferred<Result<String>>()
            val scope = CoroutineScope(Dispatchers.Default)
            node.pool("p") { m, ctx ->
                scope.launch {
                    delay(50)
                    later.complete(runCatching { ctx.requestId })
                }
                m
            }
            assertEquals("x", node.ask("p", "x"))
            val read = withTimeout(5_000) { later.await() }
            val e = read.exceptionOrNull()
            assertTrue(e is AskException.FailedPrecondition, "$read")
            scope.cancel()
        }
    }
}

/** Unconfined callers never run on the library's threads. */
class UnconfinedCallerTest {
    @Test
    fun `unconfined callers that block after their outcome stall no other ask`() = runBlocking {
        Node().use { node ->
            node.pool("hang", PoolOptions(dispatcher = Dispatchers.IO)) { _, _ -> kotlinx.coroutines.awaitCancellation() }
            node.pool("bytes", PoolOptions(dispatcher = Dispatchers.IO)) { _, _ -> byteArrayOf(1) }
            val threads = java.util.concurrent.ConcurrentHashMap.newKeySet<String>()
            val workers = askpool.ffi.runtimeWorkerThreads().toInt()
            // Failures (a timeout) and byte replies come from runtime
            // threads; an ask with options goes through an AskHandle.
            val blockers = List(workers + 1) { i ->
                launch(Dispatchers.Unconfined) {
                    runCatching {
                        when (i % 3) {
                            0 -> node.ask("hang", "x", AskOptions(timeout = 50.milliseconds))
                            1 -> node.ask("bytes", "x")
                            else -> node.send("hang", "x", AskOptions(timeout = 50.milliseconds)).await()
                        }
                    }
                    threads.add("$i:" + Thread.currentThread().name)
                    Thread.sleep(2_000)
                }
            }
            delay(300)
            val started = System.nanoTime()
            val e = withContext(Dispatchers.Default) {
                runCatching { node.ask("hang", "y", AskOptions(timeout = 100.milliseconds)) }.exceptionOrNull()
            }
            val ms = (System.nanoTime() - started) / 1_000_000
            assertTrue(e is AskException.AskTimeout, "$e")
            assertTrue(ms < 1_000, "an ask with a 100 ms timeout took $ms ms; callers ran on $threads")
            assertTrue(threads.none { it.substringAfter(":").startsWith("askpool-") }, "$threads")
            blockers.forEach { it.join() }
        }
    }
}

/** What a Python user of the same node sees, a Kotlin user sees too. */
class ParityTest {
    @Test
    fun `caller id, correlation id, pool stats and the node's counters`() = runBlocking {
        val node = Node(NodeOptions(maxAttempts = 1))
        assertTrue(Regex("[0-9a-f]{16}").matches(node.callerId), node.callerId)
        Node().use { other -> assertTrue(other.callerId != node.callerId) }
        val pool = node.pool("p") { m, _ -> m }
        val given = "A".repeat(32)
        val handle = node.send("p", "x", AskOptions(correlationId = given))
        assertEquals("x", handle.await())
        assertEquals(given.lowercase(), handle.correlationId)
        val own = node.send("p", "y")
        own.await()
        assertEquals(own.requestId, own.correlationId)
        val stats = pool.stats()
        assertEquals("p", stats.name)
        assertEquals(2L, stats.handlerRuns)
        assertEquals(0L, node.stats().lateOutcomes)
        assertEquals(listOf("p"), node.stats().pools.map { it.name })
        pool.close()
        val e = runCatching { pool.stats() }.exceptionOrNull()
        assertTrue(e is AskException.FailedPrecondition, "$e")
        assertTrue(!node.isClosed)
        val id = node.callerId
        node.close()
        assertTrue(node.isClosed)
        assertEquals(id, node.callerId, "readable after close, as in Python and Node")
        assertTrue(Node().also { it.close() }.callerId.isNotEmpty())
    }
}
