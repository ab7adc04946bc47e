package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.concurrent.atomic.AtomicInteger

/** A panic on the hot path becomes one error and leaks nothing. */
class HotPanicTest {
    @Test
    fun `a panic in the hot ask fails the ask once with Internal and leaks nothing`() = runBlocking {
        Node().use { node ->
            val runs = AtomicInteger()
            val gate = CompletableDeferred<Unit>()
            node.pool("gated") { msg, _ ->
                runs.incrementAndGet()
                gate.await()
                msg
            }
            askpool.ffi.panicInNextHotAskForTest()
            // The panic comes after the ask started: the waiter fails at once,
            // and the ask is cancelled under its token. Its request may reach
            // the handler before that cancel or be cancelled while queued
            // (a race between the pool's worker and the cancel); either way
            // neither the cancel nor a late reply finds the waiter again.
            val e = failure { node.ask("gated", Any()) }
            assertTrue(e is AskException.Internal, e.toString())
            assertTrue(e.message!!.contains("panic"), e.message)
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
            gate.complete(Unit)
            eventually("no ask in flight") { node.stats().asksInFlight == 0L && node.stats().pending == 0L }
            delay(50)
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
            assertTrue(runs.get() <= 1, "the handler ran ${runs.get()} times")
            // The node still works.
            val msg = Any()
            assertSame(msg, node.ask("gated", msg))
            eventually("no waiter") { node.stats().awaitedOutcomes == 0L }
        }
        eventually("no live host refs") { HandleTable.size() == 0 && HandleTable.nativeRefs() == 0L }
    }
}
