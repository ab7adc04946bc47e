package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/**
 * `tell` and `send` against a plain `ask`: both once started through the
 * generated uniffi call (several JNA crossings that each build a
 * `Structure`) and heard back through uniffi callbacks (a tell's
 * acceptance, every stage of a send, read or not), which made them cost
 * 30 to 60 asks each.
 */
class SendCostTest {
    @Test
    fun `a tell and a send cost about what an ask does`() = runBlocking(Dispatchers.Default) {
        Node().use { node ->
            node.pool("echo", PoolOptions(concurrency = 4)) { m, _ -> m }
            val msg = Any()
            val calls = listOf<suspend () -> Unit>(
                { node.ask("echo", msg) },
                { node.tell("echo", msg) },
                { node.send("echo", msg).await() },
            )
            // Warm-up by time: the JIT, the runtime's attached threads.
            val warmEnd = System.nanoTime() + 2_000_000_000L
            while (System.nanoTime() < warmEnd) for (call in calls) repeat(100) { call() }
            // Interleaved trials, the first candidate rotating: a machine
            // busy with something else slows all three alike.
            val n = 1_000
            val ns = calls.map { mutableListOf<Double>() }
            repeat(7) { trial ->
                for (k in calls.indices) {
                    val i = (trial + k) % calls.size
                    val start = System.nanoTime()
                    repeat(n) { calls[i]() }
                    ns[i].add((System.nanoTime() - start).toDouble() / n)
                }
            }
            fun ratio(i: Int) = ns[i].zip(ns[0]) { a, b -> a / b }.sorted()[ns[i].size / 2]
            val tell = ratio(1)
            val send = ratio(2)
            val report = "ask %.0f ns, tell %.2fx, send+await %.2fx".format(ns[0].sorted()[3], tell, send)
            println("SendCostTest: $report")
            // About 1x and 2x on an idle machine (a send's handler cannot
            // start on the caller's thread: send does not suspend, so its
            // request and reply each cross threads, which a busy machine
            // makes dearer); 40x and 60x before.
            assertTrue(tell < 4.0, "a tell costs $report")
            assertTrue(send < 10.0, "a send costs $report")
        }
    }

    @Test
    fun `a tell returns the request id its handler sees`() = runBlocking {
        Node().use { node ->
            val seen = CompletableDeferred<String>()
            node.pool("sink") { _, ctx -> seen.complete(ctx.requestId); null }
            val id = node.tell("sink", "x")
            assertEquals(id, withTimeout(5_000) { seen.await() })
        }
    }

    @Test
    fun `a handle's stage record is let go once read, or once the handle is collected`() = runBlocking {
        // The records of earlier tests' handles go as the collector finds
        // them: counted from none, or one going meanwhile hides one kept.
        eventually("earlier stage records let go: ${askpool.ffi.keptStageRecords()}") {
            System.gc()
            askpool.ffi.keptStageRecords() == 0uL
        }
        val before = 0uL
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            // Read: opened, so no longer kept, and still complete after the
            // ask ended (the record became a copy of its stages).
            val read = node.send("echo", "x")
            assertEquals(before + 1uL, askpool.ffi.keptStageRecords())
            assertEquals("x", read.await())
            val stages = withTimeout(5_000) { read.stages.toList() }.map { it.stage }
            assertEquals(listOf("SENT", "RECEIVED", "READ", "FULFILLED"), stages)
            assertEquals(before, askpool.ffi.keptStageRecords())
            // Never read: let go when the collector finds the handles.
            sendAndForget(node, 200)
            assertTrue(askpool.ffi.keptStageRecords() >= before + 200uL)
            eventually("stage records let go: ${askpool.ffi.keptStageRecords()}, before: $before") {
                System.gc()
                askpool.ffi.keptStageRecords() == before
            }
        }
        // A node that tracks no stages keeps no record: the stages are empty.
        Node(NodeOptions(trackStages = false)).use { node ->
            node.pool("echo") { m, _ -> m }
            val h = node.send("echo", "x")
            assertEquals(before, askpool.ffi.keptStageRecords())
            assertEquals("x", h.await())
            assertEquals(emptyList<StageEvent>(), withTimeout(5_000) { h.stages.toList() })
        }
    }

    /** Handles that are unreachable once this returns. */
    private suspend fun sendAndForget(node: Node, n: Int) {
        repeat(n) { assertEquals(it, node.send("echo", it).await()) }
    }
}
