package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/**
 * What the fast start of `tell` and `send` must keep (their cost against a
 * plain `ask` is measured by the bench, `cargo xtask bench kotlin`: a
 * session found them at 30 to 60 asks each, started through the generated
 * uniffi call and heard back through uniffi callbacks).
 */
class TellAndSendTest {
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

    @Test
    fun `a plain ask with options or bytes keeps no stage record`() = runBlocking {
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            val before = askpool.ffi.keptStageRecords()
            // Its handle is the ask's own: nobody can collect its stages.
            repeat(100) {
                node.ask("echo", it, AskOptions(correlationId = "000000000000000000000000000000aa"))
                node.ask("echo", byteArrayOf(1))
            }
            val after = askpool.ffi.keptStageRecords()
            // Earlier tests' records may go meanwhile (as their handles are collected).
            assertTrue(after <= before, "stage records kept: $before -> $after")
        }
    }
}
