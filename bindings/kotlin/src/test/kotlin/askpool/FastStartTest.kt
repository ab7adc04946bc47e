package askpool

import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicBoolean
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/**
 * Tells and sends started through the direct call (as an ask is), after a
 * review of that change: each test failed before its fix.
 */
class FastStartTest {
    @Test
    fun `a tell returns once accepted, not after its handler's first step`() = runBlocking {
        Node().use { node ->
            var latch = CountDownLatch(1)
            val saw = CompletableDeferred<Boolean>()
            // The handler waits for what its caller does after the tell: a
            // tell that ran it on the caller's thread deadlocked (2 s here).
            node.pool("b") { _, _ -> saw.complete(latch.await(2, TimeUnit.SECONDS)); null }
            withContext(Dispatchers.Default) {
                node.tell("b", "x")
                latch.countDown()
            }
            assertTrue(withTimeout(5_000) { saw.await() }, "the handler waited out its caller")
        }
    }

    @Test
    fun `a send racing its node's close leaves nothing waiting`() = runBlocking {
        repeat(200) { round ->
            val node = Node()
            val stop = AtomicBoolean(false)
            val senders = List(2) { t ->
                Thread {
                    var k = 0
                    while (!stop.get()) {
                        // New pool names: each send looks its pool up first.
                        try { node.send("n${t}_${k++ % 500}", k) } catch (e: AskException) {
                            if (node.isClosed) break
                        }
                    }
                }.apply { start() }
            }
            Thread.sleep(3)
            node.close()
            stop.set(true)
            senders.forEach { it.join() }
        }
        Node().use { node -> eventually("no outcome awaited") { node.stats().awaitedOutcomes == 0L } }
    }

    @Test
    fun `a send whose start panics keeps no stage record`() = runBlocking {
        val before = settledStageRecords()
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            askpool.ffi.panicInNextHotAskForTest()
            val e = runCatching { node.send("echo", Any()) }.exceptionOrNull()
            assertTrue(e is AskException.Internal, "$e")
            assertEquals("x", node.ask("echo", "x"))
        }
        assertEquals(before, settledStageRecords())
    }

    @Test
    fun `an unconfined stage collector never runs on a library thread`() = runBlocking {
        Node().use { node ->
            val go = CompletableDeferred<Unit>()
            node.pool("p") { m, _ -> go.await(); m }
            val handle = node.send("p", "x")
            val threads = ConcurrentHashMap.newKeySet<String>()
            val collector = launch(Dispatchers.Unconfined) {
                handle.stages.collect { threads.add(Thread.currentThread().name + ":" + it.stage) }
            }
            delay(100)
            go.complete(Unit)
            assertEquals("x", handle.await())
            withTimeout(5_000) { collector.join() }
            assertTrue(threads.any { it.endsWith(":FULFILLED") }, "$threads")
            assertTrue(threads.none { it.startsWith("askpool-") }, "$threads")
        }
    }

    private suspend fun settledStageRecords(): ULong {
        repeat(20) { System.gc(); delay(50) }
        return askpool.ffi.keptStageRecords()
    }
}
