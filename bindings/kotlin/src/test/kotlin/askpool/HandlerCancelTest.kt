package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
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
}
