package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.withTimeoutOrNull
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/** `Node.replayDeadLetterHandle`: a replay as an [AskHandle], as Python and Node have it. */
class ReplayHandleTest {
    private val correlation = "000000000000000000000000000000c7"

    /**
     * A node whose pool "narrow" admits one request at a time, and one dead
     * letter for [payload] (an ask, or a tell if [tell], refused
     * `BufferFull` while the pool was full). [handler] runs the replays.
     */
    private suspend fun withLetter(
        payload: Any,
        handler: suspend (Any?) -> Any?,
        tell: Boolean = false,
        body: suspend (Node, Pool, DeadLetter) -> Unit,
    ) = Node(NodeOptions(maxAttempts = 1)).use { node ->
        val gate = CompletableDeferred<Unit>()
        val started = CompletableDeferred<Unit>()
        val pool = node.pool("narrow", PoolOptions(maxInFlight = 1)) { msg, _ ->
            if (msg == "blocker") {
                started.complete(Unit)
                gate.await()
                msg
            } else {
                handler(msg)
            }
        }
        val blocker = node.send("narrow", "blocker")
        withTimeout(5_000) { started.await() }
        val refused = if (tell) {
            failure { node.tell("narrow", payload, TellOptions(correlationId = correlation)) }
        } else {
            failure { node.ask("narrow", payload, AskOptions(correlationId = correlation)) }
        }
        assertTrue(refused is AskException.BufferFull, "$refused")
        gate.complete(Unit)
        assertEquals("blocker", blocker.await())
        body(node, pool, node.deadLetters().single())
    }

    @Test
    fun `a replay handle carries the letter's ids, its stages and its reply`() = runBlocking {
        val payload = Any()
        withLetter(payload, { it }) { node, _, letter ->
            assertEquals("ASK", letter.kind)
            val h = node.replayDeadLetterHandle(letter.requestId)
            assertEquals(letter.requestId, h.requestId)
            assertEquals(correlation, h.correlationId)
            assertSame(payload, h.await())
            assertEquals(0, node.deadLetters().size, "the letter was taken out")
            val stages = withTimeout(5_000) { h.stages.toList() }.map { it.stage }
            assertEquals(listOf("SENT", "RECEIVED", "READ", "FULFILLED"), stages)
            // Taken out: a second replay has nothing to take, and says so at once.
            val again = runCatching { node.replayDeadLetterHandle(letter.requestId) }.exceptionOrNull()
            assertTrue(again is AskException.FailedPrecondition, "$again")
        }
    }

    @Test
    fun `a tell's letter replays as a tell - null once accepted, and no stages`() = runBlocking {
        val payload = Any()
        val told = CompletableDeferred<Any?>()
        withLetter(payload, { told.complete(it); "an answer nobody asked for" }, tell = true) { node, _, letter ->
            assertEquals("TELL", letter.kind)
            val h = node.replayDeadLetterHandle(letter.requestId)
            assertEquals(letter.requestId, h.requestId)
            assertNull(h.await())
            assertEquals(emptyList<StageEvent>(), withTimeout(5_000) { h.stages.toList() })
            assertSame(payload, withTimeout(5_000) { told.await() })
            assertEquals(0, node.deadLetters().size, "the letter was taken out")
        }
    }

    @Test
    fun `the suspending replay still returns the reply`() = runBlocking {
        val payload = Any()
        withLetter(payload, { it }) { node, _, letter ->
            assertSame(payload, node.replayDeadLetter(letter.requestId))
            assertEquals(0, node.deadLetters().size)
        }
    }

    @Test
    fun `a cancelled replay gives its letter up`() = runBlocking {
        val running = CompletableDeferred<Unit>()
        val cancelled = CompletableDeferred<Unit>()
        val hold: suspend (Any?) -> Any? = {
            running.complete(Unit)
            try {
                kotlinx.coroutines.awaitCancellation()
            } finally {
                cancelled.complete(Unit)
            }
        }
        withLetter(Any(), hold) { node, _, letter ->
            val h = node.replayDeadLetterHandle(letter.requestId)
            withTimeout(5_000) { running.await() }
            h.cancel()
            val e = failure { h.await() }
            assertTrue(e is AskException.AskCancelled, "$e")
            withTimeout(5_000) { cancelled.await() }
            assertEquals(0, node.deadLetters().size, "a replay cancelled by its caller is not filed again")
            assertEquals("ASK_CANCELLED", e.code)
        }
    }

    @Test
    fun `a withTimeout around the suspending replay gives the letter up too`() = runBlocking {
        val running = CompletableDeferred<Unit>()
        withLetter(Any(), { running.complete(Unit); kotlinx.coroutines.awaitCancellation() }) { node, _, letter ->
            val r = withTimeoutOrNull(200) { node.replayDeadLetter(letter.requestId) }
            assertNull(r)
            assertTrue(running.isCompleted, "the replay ran")
            eventually("the replay given up") { node.stats().pending == 0L }
            assertEquals(0, node.deadLetters().size)
        }
    }

    @Test
    fun `join waits a while without giving the replay up`() = runBlocking {
        val release = CompletableDeferred<Unit>()
        val payload = Any()
        withLetter(payload, { release.await(); it }) { node, _, letter ->
            val h = node.replayDeadLetterHandle(letter.requestId)
            assertNull(withTimeoutOrNull(100) { h.join() }, "still running")
            assertTrue(!h.isCompleted)
            release.complete(Unit)
            withTimeout(5_000) { h.join() }
            assertTrue(h.isCompleted)
            assertSame(payload, h.await())
            assertEquals(0, node.deadLetters().size)
        }
    }

    @Test
    fun `a replay that fails puts its letter back`() = runBlocking {
        withLetter(Any(), { it }) { node, pool, letter ->
            pool.close()
            val h = node.replayDeadLetterHandle(letter.requestId)
            assertEquals(letter.requestId, h.requestId)
            val e = failure { h.await() }
            assertTrue(e is AskException.NoRoute, "$e")
            val back = node.deadLetters().single()
            assertEquals(letter.requestId, back.requestId)
            assertTrue(back.error is AskException.NoRoute, "${back.error}")
        }
    }
}
