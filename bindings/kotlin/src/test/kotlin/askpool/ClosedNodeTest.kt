package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.suspendCancellableCoroutine
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.concurrent.thread
import kotlin.time.Duration.Companion.seconds

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
        pool.close() // the node closed it: nothing, as in Python and Node
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

    @Test
    fun `a second close returns once the first is done`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        val inCancel = CountDownLatch(1)
        val cleaned = AtomicBoolean()
        val pool = node.pool("lingers") { _, _ ->
            suspendCancellableCoroutine<Unit> { c ->
                // Runs on the thread that cancels the handler: the node's close.
                c.invokeOnCancellation {
                    inCancel.countDown()
                    Thread.sleep(300)
                    cleaned.set(true)
                }
                started.complete(Unit)
            }
        }
        val caller = async(Dispatchers.Default) { runCatching { node.ask("lingers", 1, AskOptions(timeout = 30.seconds)) } }
        withTimeout(5_000) { started.await() }
        // Closed, its handler still running: only the node's close cancels it.
        pool.close()
        val first = thread { node.close() }
        assertTrue(inCancel.await(5, TimeUnit.SECONDS), "the node's close did not cancel the handler")
        node.close()
        assertTrue(cleaned.get(), "the second close returned while the first was still closing the node")
        first.join()
        withTimeout(5_000) { caller.await() }
        Unit
    }

    @Test
    fun `a close from inside the node's own close returns`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        val pool = node.pool("recloses") { _, _ ->
            suspendCancellableCoroutine<Unit> { c ->
                c.invokeOnCancellation { node.close() }
                started.complete(Unit)
            }
        }
        val caller = async(Dispatchers.Default) { runCatching { node.ask("recloses", 1, AskOptions(timeout = 30.seconds)) } }
        withTimeout(5_000) { started.await() }
        pool.close()
        val closer = thread { node.close() }
        closer.join(5_000)
        assertFalse(closer.isAlive, "a close called by a cancel handler during the close deadlocked it")
        withTimeout(5_000) { caller.await() }
        Unit
    }

    @Test
    fun `a second close on an interrupted thread waits for the first and keeps the interrupt`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        val inCancel = CountDownLatch(1)
        val release = CountDownLatch(1)
        node.pool("holds") { _, _ ->
            suspendCancellableCoroutine<Unit> { c ->
                // Runs on the thread that cancels the handler: the node's close.
                c.invokeOnCancellation {
                    inCancel.countDown()
                    release.await()
                }
                started.complete(Unit)
            }
        }
        val handle = node.send("holds", 1, AskOptions(timeout = 30.seconds))
        withTimeout(5_000) { started.await() }
        val first = thread { node.close() }
        try {
            assertTrue(inCancel.await(5, TimeUnit.SECONDS), "the node's close did not cancel the handler")
            var thrown: Throwable? = null
            var interruptKept = false
            val second = thread {
                Thread.currentThread().interrupt()
                thrown = runCatching { node.close() }.exceptionOrNull()
                interruptKept = Thread.currentThread().isInterrupted
            }
            // Waiting for the first close (WAITING), or already ended with what it threw.
            eventually("the second close waits") { second.state == Thread.State.WAITING || !second.isAlive }
            release.countDown()
            second.join()
            assertEquals(null, thrown, "the second close threw")
            assertTrue(interruptKept, "the second close cleared its thread's interrupt")
        } finally {
            release.countDown()
            first.join()
        }
        assertTrue(runCatching { handle.await() }.exceptionOrNull() is AskException.Unavailable)
    }

    /** Asks [node] by name (options) with a fresh object that only the library could hold; returns a reference to it. */
    private fun askByNameRefused(node: Node, tell: Boolean): java.lang.ref.WeakReference<Any> {
        val msg = Any()
        val options = "000000000000000000000000000000aa"
        val e = runCatching {
            if (tell) {
                runBlocking { node.tell("echo", msg, TellOptions(correlationId = options)) }
            } else {
                node.send("echo", msg, AskOptions(correlationId = options))
            }
        }.exceptionOrNull()
        assertTrue(e is AskException, "a call on a freed native node: $e")
        return java.lang.ref.WeakReference(msg)
    }

    @Test
    fun `a send or tell the native node refuses as it closes lets go of its message`() = runBlocking {
        val node = Node()
        node.pool("echo") { msg, _ -> msg }
        // The native node freed under a call that passed the open check (a
        // close racing it): the generated call throws before the message's
        // handle reaches the native side, which then never releases it.
        node.native.shutdown()
        node.native.close()
        val sent = askByNameRefused(node, tell = false)
        val told = askByNameRefused(node, tell = true)
        eventually("the refused messages are collectable") {
            System.gc()
            sent.get() == null && told.get() == null
        }
        node.close()
    }
}
