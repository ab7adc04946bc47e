package askpool

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/**
 * Handlers that start after their node's close went over their pool: a
 * pool worker that took a request just before the close hands it over
 * after it. Started as handleBytes does, with a request id that is none of
 * the runtime's (its answer is dropped).
 */
class CloseGuardTest {
    /** A handler that waits for its cancel; [cancelled] completes when it gets it. */
    private fun waitsForCancel(cancelled: CompletableDeferred<Unit>) = Handler { _, _ ->
        try {
            awaitCancellation()
        } catch (e: CancellationException) {
            cancelled.complete(Unit)
            throw e
        }
    }

    @Test
    fun `a handler that starts after its node closed is cancelled`() = runBlocking {
        val node = Node()
        val cancelled = CompletableDeferred<Unit>()
        val pool = node.pool("late") { m, c -> waitsForCancel(cancelled).handle(m, c) }
        node.close() // cancelAll went over no running handler
        pool.start(Long.MAX_VALUE - 11, ByteArray(1))
        withTimeout(5_000) { cancelled.await() }
        eventually("the handler ended") { pool.running() == 0 }
    }

    @Test
    fun `a closed pool's handler that starts after its node closed is cancelled`() = runBlocking {
        val node = Node()
        val cancelled = CompletableDeferred<Unit>()
        val pool = node.pool("closed-late") { m, c -> waitsForCancel(cancelled).handle(m, c) }
        pool.close() // nothing running: the node does not hold it
        node.close() // so its close never sees this pool
        pool.start(Long.MAX_VALUE - 13, ByteArray(1))
        withTimeout(5_000) { cancelled.await() }
        eventually("the handler ended") { pool.running() == 0 }
    }

    @Test
    fun `a pool's close that tells its running handlers after its node closed has them cancelled`() = runBlocking {
        val node = Node()
        val cancelled = CompletableDeferred<Unit>()
        val started = CompletableDeferred<Unit>()
        // The interleaving of a pool's close with its node's: the pool left
        // the node's pools (its native close done), the node's close went
        // over its pools and lingering ones, and only then does the pool's
        // close tell its running handlers (Pool.tellClosed). A pool the node
        // never listed stands for one it let go of.
        val pool = Pool(node, "let-go", PoolOptions()) { m, c ->
            started.complete(Unit)
            waitsForCancel(cancelled).handle(m, c)
        }
        pool.start(Long.MAX_VALUE - 17, ByteArray(1))
        withTimeout(5_000) { started.await() }
        node.close()
        pool.tellClosed()
        withTimeout(5_000) { cancelled.await() }
        eventually("the handler ended") { pool.running() == 0 }
    }

    @Test
    fun `hot asks, sends and tells that pass the open check as the native node shuts down fail Unavailable`() = runBlocking {
        val node = Node()
        node.pool("echo") { msg, _ -> msg }
        assertTrue(node.ask("echo", "x") == "x") // the pool's id is known: the hot path from now on
        // A close racing these calls, caught between their open check and
        // the hot call: the native node is gone, `closed` not yet set.
        node.native.shutdown()
        val errors = listOf(
            runCatching { withTimeout(5_000) { node.ask("echo", "a") } }.exceptionOrNull(),
            runCatching { node.send("echo", "b") }.exceptionOrNull(),
            runCatching { withTimeout(5_000) { node.tell("echo", "c") } }.exceptionOrNull(),
        )
        for (e in errors) assertTrue(e is AskException.Unavailable, "$e")
        eventually("no waiter left") { node.completions.size() == 0 }
        node.close()
    }

    @Test
    fun `a pool made while its node closes is never left registered`() {
        val before = Pool.registered()
        repeat(500) { round ->
            val node = Node()
            val go = java.util.concurrent.CyclicBarrier(2)
            val maker = kotlin.concurrent.thread {
                go.await()
                runCatching { node.pool("p") { m, _ -> m } }
            }
            go.await()
            node.close()
            maker.join()
            assertTrue(Pool.registered() == before, "round $round: ${Pool.registered() - before} pool(s) of a closed node left registered")
        }
    }

    @Test
    fun `a promise await whose store closes after its open check throws Closed, not the generated IllegalStateException`() {
        val promises = Promises.memory()
        promises.create("done", kotlin.time.Duration.parse("1m"))
        promises.resolve("done")
        // The await asks its caller's dispatcher whether it dispatches after
        // its open check and before the native wait: the store closes there,
        // as a close on another thread would at that moment.
        val closing = object : kotlinx.coroutines.CoroutineDispatcher() {
            override fun isDispatchNeeded(context: kotlin.coroutines.CoroutineContext): Boolean {
                // Only where the await asks (coroutine machinery asks too).
                val inAwait = Throwable().stackTrace.any { it.className == "askpool.Promises" && it.methodName == "await" }
                if (inAwait) promises.close()
                return true
            }

            override fun dispatch(context: kotlin.coroutines.CoroutineContext, block: Runnable) =
                kotlinx.coroutines.Dispatchers.Default.dispatch(context, block)
        }
        val e = runCatching { runBlocking(closing) { promises.await("done") } }.exceptionOrNull()
        assertTrue(e is PromiseException.Closed, "$e")
    }
}
