package askpool

import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.delay
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
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
            val started = CompletableDeferred<Unit>()
            val gate = CompletableDeferred<Unit>()
            node.pool("gated") { msg, _ ->
                runs.incrementAndGet()
                started.complete(Unit)
                gate.await()
                msg
            }
            askpool.ffi.panicInNextHotAskForTest()
            // The panic comes after the ask started (its request reaches the
            // handler): the waiter fails at once, and neither the ask's cancel
            // nor the late reply finds it again.
            val e = failure { node.ask("gated", Any()) }
            assertTrue(e is AskException.Internal, e.toString())
            assertTrue(e.message!!.contains("panic"), e.message)
            assertEquals(0L, node.stats().awaitedOutcomes)
            withTimeout(5_000) { started.await() }
            gate.complete(Unit)
            eventually("no ask in flight") { node.stats().asksInFlight == 0L && node.stats().pending == 0L }
            delay(50)
            assertEquals(0L, node.stats().awaitedOutcomes)
            assertEquals(1, runs.get())
            // The node still works.
            val msg = Any()
            assertSame(msg, node.ask("gated", msg))
            assertEquals(0L, node.stats().awaitedOutcomes)
        }
        eventually("no live host refs") { HandleTable.size() == 0 && HandleTable.nativeRefs() == 0L }
    }
}
