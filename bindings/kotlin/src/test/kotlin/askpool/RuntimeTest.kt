package askpool

import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

class RuntimeTest {
    @Test
    fun `runtime threads stay attached to the JVM across callbacks`() = runBlocking {
        val workers = askpool.ffi.runtimeWorkerThreads().toInt()
        JvmThreads.observed.clear()
        JvmThreads.observe = true
        try {
            Node(NodeOptions(maxAttempts = 1, circuitBreaker = false)).use { node ->
                // Failures and byte arrays come back through uniffi callbacks
                // (host-object replies come as events, no callback).
                node.pool("fail", PoolOptions(concurrency = 8)) { _, _ -> throw IllegalStateException("no") }
                node.pool("bytes", PoolOptions(concurrency = 8)) { msg, _ -> msg }
                repeat(20) { round ->
                    (0 until 100).map { i ->
                        async {
                            if (i % 2 == 0) {
                                runCatching { node.ask("fail", round * 100 + i) }.exceptionOrNull()
                            } else {
                                node.ask("bytes", byteArrayOf(i.toByte()))
                            }
                        }
                    }.awaitAll()
                }
            }
        } finally {
            JvmThreads.observe = false
        }
        // 2000 asks make 3000 callbacks (bytes request + outcome). A thread that
        // JNA detached after a callback comes back as a new Thread object,
        // so the set would grow with every callback.
        val threads = JvmThreads.observed.toList()
        assertTrue(threads.isNotEmpty())
        assertTrue(threads.size <= workers, "callbacks came from ${threads.size} JVM threads for $workers runtime workers")
        assertTrue(threads.all { it.isAlive }, "callback threads are still attached")
        assertTrue(JvmThreads.attached.get() <= workers, "attached ${JvmThreads.attached.get()} times")
    }

    @Test
    fun `leak check - asks with timeouts and cancels leave nothing behind`() = runBlocking {
        val total = System.getProperty("askpool.leak.asks", "100000").toInt()
        val dedup = 1_000
        val dlq = 500
        val node = Node(NodeOptions(maxAttempts = 1, dlqCapacity = dlq, circuitBreaker = false))
        val pool = node.pool("leak", PoolOptions(concurrency = 16, dedupCapacity = dedup)) { msg, ctx ->
            when ((msg as Job).kind) {
                0 -> Reply(msg.n)
                else -> { ctx.cancelled(); null }
            }
        }
        var replies = 0
        var timeouts = 0
        var cancels = 0
        val batch = 200
        for (start in 0 until total step batch) {
            val results = (start until minOf(total, start + batch)).map { n ->
                val kind = n % 3
                val job = Job(n, kind)
                when (kind) {
                    0 -> async { node.ask("leak", job) }
                    1 -> async { runCatching { node.ask("leak", job, AskOptions(timeout = kotlin.time.Duration.parse("5ms"))) }.exceptionOrNull() }
                    else -> async {
                        val h = node.send("leak", job)
                        h.cancel()
                        runCatching { h.await() }.exceptionOrNull()
                    }
                }
            }.awaitAll()
            for (r in results) {
                when (r) {
                    is Reply -> replies++
                    is AskException.AskTimeout -> timeouts++
                    is AskException.AskCancelled -> cancels++
                    else -> throw AssertionError("unexpected outcome $r")
                }
            }
            if (start % 20_000 == 0) {
                // Bounded while running: the reply cache, the DLQ and what is in flight.
                // Waited for (5 s at most): on a loaded machine, cancels of
                // earlier batches may still be on their way to the handlers.
                eventually("the handle table within its bound (reply cache + DLQ + 2 batches)") {
                    HandleTable.size() <= dedup + dlq + 2 * batch
                }
            }
        }
        assertEquals(total, replies + timeouts + cancels)
        assertEquals((total + 2) / 3, replies)
        awaitQuiet(node, pool)
        val s = node.stats()
        assertEquals(0, s.pending, "pending asks")
        assertEquals(0, s.asksInFlight, "asks driven by the binding")
        assertEquals(0, s.awaitedOutcomes, "outcomes awaited on the Kotlin side")
        assertEquals(0, s.armedTimers, "armed timers")
        assertEquals(0L, askpool.ffi.requestsInFlight().toLong(), "requests awaiting a Kotlin reply")
        assertEquals(0, pool.running(), "handler coroutines")
        assertTrue(s.dlqDepth <= dlq)
        node.purgeDeadLetters()
        node.close()
        // The pools' worker tasks (and with them the reply caches) end on
        // the runtime shortly after the close.
        var tries = 0
        while ((HandleTable.size() != 0 || HandleTable.nativeRefs() != 0L) && tries++ < 500) {
            kotlinx.coroutines.delay(10)
        }
        assertEquals(0, HandleTable.size(), "objects in the handle table")
        assertEquals(0L, HandleTable.nativeRefs(), "handles held by Rust")
    }

    private suspend fun awaitQuiet(node: Node, pool: Pool) {
        repeat(500) {
            val s = node.stats()
            if (s.pending == 0L && s.asksInFlight == 0L && s.awaitedOutcomes == 0L && pool.running() == 0 &&
                askpool.ffi.requestsInFlight() == 0uL
            ) return
            kotlinx.coroutines.delay(10)
        }
    }

    class Job(val n: Int, val kind: Int)
    class Reply(val n: Int)
}
