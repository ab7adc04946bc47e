package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/** Calls on a closed node: a typed error, no waiter left behind. */
class ClosedNodeTest {
    @Test
    fun `every call on a closed node throws Unavailable and leaks no waiter`() = runBlocking {
        val node = Node()
        val pool = node.pool("echo") { msg, _ -> msg }
        assertEquals("x", node.ask("echo", "x"))
        val handle = node.send("echo", "y")
        assertEquals("y", handle.await())
        node.close()
        node.close() // idempotent

        val rid = "0123456789abcdef0123456789abcdef"
        val calls: List<Pair<String, suspend () -> Any?>> = listOf(
            "ask" to { node.ask("echo", "x") },
            "ask unknown pool" to { node.ask("never-asked", "x") },
            "ask bytes" to { node.ask("echo", byteArrayOf(1)) },
            "ask with options" to { node.ask("echo", "x", AskOptions(requestId = rid)) },
            "send" to { node.send("echo", "x") },
            "tell" to { node.tell("echo", "x") },
            "pool" to { node.pool("other") { m, _ -> m } },
            "pool close" to { pool.close() },
            "dead letters" to { node.deadLetters() },
            "replay" to { node.replayDeadLetter(rid) },
            "purge" to { node.purgeDeadLetters() },
            "durable ask" to { Promises.memory().use { p -> node.askDurable(p, "echo", byteArrayOf(1)) } },
            "durable await" to { Promises.memory().use { p -> node.awaitDurable(p, rid) } },
        )
        for ((what, call) in calls) {
            val e = runCatching { call() }.exceptionOrNull()
            assertTrue(e is AskException.Unavailable, "$what: $e")
        }
        handle.cancel() // a no-op, no exception
        eventually("no waiter, nothing in flight") {
            val stats = node.stats()
            stats.awaitedOutcomes == 0L && stats.asksInFlight == 0L && stats.pending == 0L
        }
    }

    @Test
    fun `cancelling an ask while the node closes throws nothing in the cancel handler`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        node.pool("stuck") { _, _ -> started.complete(Unit); awaitCancellation() }
        val handle = node.send("stuck", "x")
        withTimeout(5_000) { started.await() }
        node.close()
        handle.cancel()
        val e = failure { handle.await() }
        assertTrue(e is AskException.Unavailable, e.toString())
        // The waiter goes when the failure is delivered, which may finish on
        // another thread just after the await returns.
        eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
    }
}
