package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.cancel
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger

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
