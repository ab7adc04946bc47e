package askpool

import askpool.ffi.Payload
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

class ErrorTest {
    private suspend fun failure(block: suspend () -> Any?): AskException {
        val e = runCatching { block() }.exceptionOrNull()
        assertTrue(e is AskException, "expected an AskException, got $e")
        return e as AskException
    }

    @Test
    fun `a handler exception arrives with its class name and message`() = runBlocking {
        Node().use { node ->
            node.pool("boom") { _, _ -> throw IllegalStateException("no stock for order 7") }
            val e = failure { node.ask("boom", "x") } as AskException.HandlerFailed
            assertEquals("java.lang.IllegalStateException", e.typeName)
            assertEquals("no stock for order 7", e.handlerMessage)
            assertEquals("HANDLER_FAILED", e.code)
            assertEquals(ErrorClass.PERMANENT, e.errorClass)
        }
    }

    @Test
    fun `every AskException a handler throws reaches the caller as the shared mapping says`() = runBlocking {
        val thrown: List<AskException> = listOf(
            AskException.Unavailable("db down"),
            AskException.DeadlineExceeded(),
            AskException.AskTimeout(12),
            AskException.BufferFull("inner", 3),
            AskException.NoRoute("elsewhere"),
            AskException.InvalidArgument("bad field"),
            AskException.ValidationError("too long"),
            AskException.PayloadMismatch(),
            AskException.PermissionDenied("not yours"),
            AskException.OversizePayload(10, 5),
            AskException.FailedPrecondition("closed account"),
            AskException.DecodeFailure("garbled"),
            AskException.Internal("oops"),
            AskException.AskCancelled(CancelReason.WORKER),
            AskException.HandlerFailed("my.Type", "why"),
        )
        assertEquals(AskException::class.sealedSubclasses.toSet(), thrown.map { it::class }.toSet())
        // No retries: transient codes would otherwise be re-sent.
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("throws") { msg, _ -> throw thrown[msg as Int] }
            // As in every binding (askpool-proto `AskError::from_handler`): an
            // error that is just a message keeps its class; one describing an
            // ask (its timeout, route, buffer, payload, cancellation) would
            // misreport the caller's own ask, so it is HandlerFailed.
            val kept = setOf(
                "UNAVAILABLE", "INVALID_ARGUMENT", "VALIDATION_ERROR", "PERMISSION_DENIED",
                "FAILED_PRECONDITION", "DECODE_FAILURE", "INTERNAL",
            )
            for ((i, sent) in thrown.withIndex()) {
                val got = failure { node.ask("throws", i) }
                if (sent.code in kept) {
                    assertEquals(sent::class, got::class)
                    assertEquals(sent.code, got.code)
                    assertEquals(sent.errorClass, got.errorClass)
                    assertEquals(sent.toFault(), got.toFault())
                } else {
                    val failed = got as AskException.HandlerFailed
                    assertEquals(sent.javaClass.name, failed.typeName, sent.code)
                    assertEquals(sent.message, failed.handlerMessage, sent.code)
                }
            }
        }
    }

    @Test
    fun `the runtime's own errors map to their classes`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            assertTrue(failure { node.ask("nobody", 1) } is AskException.NoRoute)

            node.pool("stuck") { _, _ -> awaitCancellation() }
            val timeout = failure { node.ask("stuck", 1, AskOptions(timeout = 50.milliseconds)) }
            assertTrue(timeout is AskException.AskTimeout, timeout.toString())
            assertEquals(ErrorClass.TRANSIENT, timeout.errorClass)

            assertTrue(failure { node.ask("stuck", 1, AskOptions(requestId = "not-hex")) } is AskException.InvalidArgument)

            val started = CompletableDeferred<Unit>()
            node.pool("narrow", PoolOptions(maxInFlight = 1)) { _, _ -> started.complete(Unit); awaitCancellation() }
            val first = node.send("narrow", 1)
            withTimeout(5_000) { started.await() }
            val full = failure { node.ask("narrow", 2, AskOptions(maxAttempts = 1)) }
            assertTrue(full is AskException.BufferFull, full.toString())
            first.cancel()

            assertThrows(AskException.InvalidArgument::class.java) {
                node.pool("stuck") { _, _ -> null }
            }
        }
    }

    @Test
    fun `closing the node fails pending asks with Unavailable and later asks too`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        node.pool("stuck") { _, _ -> started.complete(Unit); awaitCancellation() }
        val pending = async { runCatching { node.ask("stuck", 1) }.exceptionOrNull() }
        withTimeout(5_000) { started.await() }
        node.close()
        val e = withTimeout(5_000) { pending.await() }
        assertTrue(e is AskException.Unavailable, e.toString())
        assertTrue(failure { node.ask("stuck", 1) } is AskException.Unavailable)
    }

    @Test
    fun `a panic in the library becomes an exception`() {
        val e = assertThrows(AskException.Internal::class.java) {
            AskException.native { askpool.ffi.panicForTest("deliberate panic") }
        }
        assertTrue(e.message!!.contains("deliberate panic"), e.message)
        // The process and the runtime are still fine.
        runBlocking {
            Node().use { node ->
                node.pool("echo") { msg, _ -> msg }
                val msg = Any()
                assertSame(msg, node.ask("echo", msg))
            }
        }
    }

    @Test
    fun `failed asks are dead-lettered with their payload and can be replayed`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            val gate = CompletableDeferred<Unit>()
            val started = CompletableDeferred<Unit>()
            node.pool("narrow", PoolOptions(maxInFlight = 1)) { msg, _ ->
                started.complete(Unit)
                gate.await()
                msg
            }
            val blocker = node.send("narrow", "first")
            withTimeout(5_000) { started.await() }
            val payload = Any()
            val correlation = "000000000000000000000000000000c7"
            assertTrue(failure { node.ask("narrow", payload, AskOptions(correlationId = correlation)) } is AskException.BufferFull)
            val letter = node.deadLetters().single()
            assertSame(payload, letter.payload)
            assertEquals(correlation, letter.correlationId)
            assertEquals("narrow", letter.pool)
            assertEquals("RETRIES_EXHAUSTED", letter.reason)
            assertEquals(1, letter.attempts)
            assertTrue(letter.error is AskException.BufferFull)
            gate.complete(Unit)
            assertEquals("first", blocker.await())
            assertSame(payload, node.replayDeadLetter(letter.requestId))
            assertEquals(0, node.deadLetters().size)
            assertTrue(failure { node.replayDeadLetter(letter.requestId) } is AskException.FailedPrecondition)
        }
    }

    @Test
    fun `timed-out asks are dead-lettered and purged`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("stuck") { _, _ -> awaitCancellation() }
            val payload = Any()
            assertTrue(failure { node.ask("stuck", payload, AskOptions(timeout = 30.milliseconds)) } is AskException.AskTimeout)
            val letter = node.deadLetters().single()
            assertSame(payload, letter.payload)
            assertTrue(letter.error is AskException.AskTimeout)
            assertEquals(1, node.purgeDeadLetters())
            assertEquals(0, node.deadLetters().size)
        }
    }

    @Test
    fun `a dead letter dropped while it is listed is left out, not an error`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("poison") { _, _ -> throw AskException.DecodeFailure("bad") }
            assertTrue(failure { node.ask("poison", Any()) } is AskException.DecodeFailure)
            // What deadLetters() does, with a drop between the native list and
            // the lookups: the list does not hold the letter's object, the
            // purge lets go of the letter's reference, a drain then frees
            // the handle (once the ask's own reference is gone too).
            val listed = node.native.deadLetters().single()
            val handle = (listed.payload as Payload.Host).handle
            assertEquals(1, node.purgeDeadLetters())
            eventually("the letter's object let go") {
                HandleTable.drain()
                HandleTable.find(handle) == null
            }
            assertEquals(null, DeadLetter.of(listed))
            assertEquals(0, node.deadLetters().size)
        }
    }
}
