package askpool

import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.awaitCancellation
import kotlinx.coroutines.delay
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/** Bad input and odd handlers (the Kotlin review): a typed error, the JVM alive, nothing lost. */
class AdversarialTest {
    private suspend fun settled(node: Node) {
        eventually("node settled: ${node.stats()}") {
            val s = node.stats()
            s.awaitedOutcomes == 0L && s.asksInFlight == 0L && s.pending == 0L
        }
    }

    private suspend fun noHandles() {
        eventually("handles back to 0: ${HandleTable.size()} / ${HandleTable.nativeRefs()}") {
            HandleTable.size() == 0 && HandleTable.nativeRefs() == 0L
        }
    }

    @Test
    fun `malformed ids are InvalidArgument on every path`() = runBlocking {
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            val bad = listOf("", "xyz", "0".repeat(31), "0".repeat(33), " " + "0".repeat(31), "0x" + "0".repeat(30), "é".repeat(32), "0".repeat(100_000))
            for (id in bad) {
                for ((what, opts) in listOf(
                    "requestId" to AskOptions(requestId = id),
                    "correlationId" to AskOptions(correlationId = id),
                    "causationId" to AskOptions(causationId = id),
                )) {
                    val e = failure { node.ask("echo", "x", opts) }
                    assertTrue(e is AskException.InvalidArgument, "ask $what ${id.take(40)}: $e")
                    assertTrue(e.message!!.length < 1000, "message bounded: ${e.message!!.length}")
                    val e2 = failure { node.send("echo", byteArrayOf(1), opts).await() }
                    assertTrue(e2 is AskException.InvalidArgument, "send $what: $e2")
                }
                val e3 = failure { node.tell("echo", "x", TellOptions(requestId = id)) }
                assertTrue(e3 is AskException.InvalidArgument, "tell: $e3")
                val e4 = failure { node.replayDeadLetter(id) }
                assertTrue(e4 is AskException.InvalidArgument, "replay: $e4")
                assertTrue(e4.message!!.length < 1000, "replay message bounded: ${e4.message!!.length}")
            }
            // Uppercase hex is a valid id? Either way, typed.
            assertEquals("x", node.ask("echo", "x", AskOptions(requestId = "ABCDEF0123456789ABCDEF0123456789")))
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `huge durations in every option`() = runBlocking {
        val huge = listOf(Duration.INFINITE, Long.MAX_VALUE.milliseconds, 365_000_000.seconds)
        for (d in huge) {
            val r = runCatching {
                Node(NodeOptions(defaultTimeout = d)).use { node ->
                    node.pool("echo", PoolOptions(processingTimeout = d, dedupTtl = d)) { m, _ -> m }
                    assertEquals("x", node.ask("echo", "x"))
                    assertEquals("x", node.ask("echo", "x", AskOptions(timeout = d)))
                    assertEquals("y", node.send("echo", "y", AskOptions(timeout = d, requestId = "0123456789abcdef0123456789abcdef")).await())
                    node.tell("echo", "z", TellOptions(timeout = d))
                    settled(node)
                }
            }
            assertTrue(r.isSuccess || r.exceptionOrNull() is AskException.InvalidArgument, "$d: ${r.exceptionOrNull()}")
        }
        noHandles()
    }

    @Test
    fun `pool names`() = runBlocking {
        Node().use { node ->
            val e1 = runCatching { node.pool("") { m, _ -> m } }.exceptionOrNull()
            assertTrue(e1 is AskException.InvalidArgument, "empty pool: $e1")
            val e2 = runCatching { node.pool("p".repeat(1_000_000)) { m, _ -> m } }.exceptionOrNull()
            assertTrue(e2 is AskException.InvalidArgument, "huge pool: $e2")
            assertTrue(e2!!.message!!.length < 2000)
            val a = failure { node.ask("", "x") }
            assertTrue(a is AskException.InvalidArgument || a is AskException.NoRoute, "ask empty: $a")
            val b = failure { node.ask("p".repeat(1_000_000), "x") }
            assertTrue(b is AskException.InvalidArgument || b is AskException.NoRoute, "ask huge: $b")
            assertTrue(b.message!!.length < 2000, "bounded: ${b.message!!.length}")
            val c = failure { node.tell("q".repeat(1_000_000), "x") }
            assertTrue(c is AskException.InvalidArgument || c is AskException.NoRoute, "tell huge: $c")
            // Duplicate pool name.
            node.pool("dup") { m, _ -> m }
            val d = runCatching { node.pool("dup") { _, _ -> "second" } }.exceptionOrNull()
            assertTrue(d is AskException.InvalidArgument, "dup pool: $d")
            assertEquals("x", node.ask("dup", "x"))
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `asking ever new pool names keeps the name table bounded`() = runBlocking {
        Node().use { node ->
            // Each name the fast path met used to be kept for the node's life.
            repeat(1_100) { i ->
                val e = failure { node.ask("nowhere-$i", "x") }
                assertTrue(e is AskException.NoRoute, "ask nowhere-$i: $e")
            }
            assertEquals(-1L, node.native.poolId("one-more"), "no id past the bound")
            // A pool made after the bound is still asked (by name), with identity.
            node.pool("late") { m, _ -> m }
            val msg = Any()
            assertTrue(node.ask("late", msg) === msg)
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `a pool closed and made again is let go`() = runBlocking {
        Node().use { node ->
            val before = Pool.registered()
            repeat(300) { i ->
                val p = node.pool("again") { m, _ -> m }
                assertEquals(i, node.ask("again", i))
                p.close()
                p.close() // a second close of the same pool is nothing
            }
            assertEquals(before, Pool.registered(), "closed pools are not kept")
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `pool close then reuse of the name, close twice`() = runBlocking {
        Node().use { node ->
            val p = node.pool("p") { _, _ -> "one" }
            assertEquals("one", node.ask("p", "x"))
            p.close()
            p.close()
            val e = failure { node.ask("p", "x") }
            assertTrue(e is AskException.NoRoute, "after pool close: $e")
            // The handler leaves the running ones after its reply went out,
            // and the reply can resume this caller on its own thread first.
            eventually("the closed pool's handler finished") { p.running() == 0 }
            node.pool("p") { _, _ -> "two" }
            assertEquals("two", node.ask("p", "x"))
            settled(node)
        }
        noHandles()
    }

    class BadMessage : RuntimeException() {
        override val message: String get() = throw IllegalStateException("message getter throws")
    }

    class BadToString : RuntimeException("m") {
        override fun toString(): String = throw IllegalStateException("toString throws")
    }

    @Test
    fun `odd throws from a handler still answer`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1, circuitBreaker = false)).use { node ->
            fun recurse(n: Int): Int = recurse(n + 1) + 1
            node.pool("odd", PoolOptions(concurrency = 4)) { msg, _ ->
                when (msg as String) {
                    "soe" -> recurse(0)
                    "oom" -> throw OutOfMemoryError("fake oom")
                    "null-msg" -> throw IllegalStateException()
                    "bad-msg" -> throw BadMessage()
                    "bad-tostring" -> throw BadToString()
                    "anon" -> throw object : Exception("anon") {}
                    "error" -> throw AssertionError("assert")
                    "throwable" -> throw Throwable("plain throwable")
                    "null" -> null
                    else -> msg
                }
            }
            for (m in listOf("soe", "oom", "null-msg", "bad-msg", "bad-tostring", "anon", "error", "throwable")) {
                val e = withTimeout(10_000) { failure { node.ask("odd", m, AskOptions(timeout = 5.seconds)) } }
                assertTrue(e is AskException.HandlerFailed, "$m: $e")
                val e2 = withTimeout(10_000) { failure { node.send("odd", m, AskOptions(timeout = 5.seconds)).await() } }
                assertTrue(e2 is AskException.HandlerFailed, "$m (send): $e2")
            }
            assertNull(node.ask("odd", "null"))
            assertEquals("ok", node.ask("odd", "ok"))
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `a handler that never completes, node closed under it`() = runBlocking {
        val node = Node()
        val started = CompletableDeferred<Unit>()
        val handlerEnded = CompletableDeferred<Throwable?>()
        node.pool("stuck") { _, _ ->
            started.complete(Unit)
            try {
                awaitCancellation()
            } catch (e: Throwable) {
                handlerEnded.complete(e)
                throw e
            }
        }
        node.pool("stuck-blocking") { _, _ ->
            // Ignores cancellation entirely.
            withContext(Dispatchers.IO) { Thread.sleep(500) }
            "late"
        }
        val a = async { failure { node.ask("stuck", "x") } }
        val b = async { failure { node.ask("stuck-blocking", "y") } }
        withTimeout(5_000) { started.await() }
        delay(50)
        node.close()
        val ea = withTimeout(5_000) { a.await() }
        val eb = withTimeout(5_000) { b.await() }
        assertTrue(ea is AskException.Unavailable || ea is AskException.AskCancelled, "$ea")
        assertTrue(eb is AskException.Unavailable || eb is AskException.AskCancelled, "$eb")
        assertTrue(withTimeout(5_000) { handlerEnded.await() } is CancellationException)
        delay(700)
        settled(node)
        noHandles()
    }

    @Test
    fun `cancel after completion, stages after completion and twice`() = runBlocking {
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            val h = node.send("echo", "x")
            assertEquals("x", h.await())
            h.cancel()
            h.cancel()
            assertEquals("x", h.await())
            val first = withTimeout(5_000) { h.stages.toList() }
            val second = failure { h.stages.toList() }
            assertTrue(second is AskException.InvalidArgument, "second collection: $second")
            assertEquals("FULFILLED", first.last().stage)
            settled(node)
        }
        // trackStages off: the flow must still end.
        Node(NodeOptions(trackStages = false)).use { node ->
            node.pool("echo") { m, _ -> m }
            val h = node.send("echo", "x")
            assertEquals("x", h.await())
            val s = withTimeout(5_000) { h.stages.toList() }
            assertTrue(s.isEmpty(), "untracked stages: $s")
            settled(node)
        }
        // The node closes with the ask in flight: the stages end.
        val node = Node()
        node.pool("stuck") { _, _ -> awaitCancellation() }
        val h = node.send("stuck", "x")
        delay(50)
        node.close()
        val s = withTimeout(5_000) { h.stages.toList() }
        assertEquals("FAILED", s.last().stage, "an accepted ask cut short by close fails: $s")
        settled(node)
        noHandles()
    }

    @Test
    fun `nodes dropped without close are shut down once collected`() {
        val before = askpool.ffi.liveNativeNodes()
        repeat(2_000) { Node() }
        val until = System.nanoTime() + 20_000_000_000L
        while (askpool.ffi.liveNativeNodes() > before && System.nanoTime() < until) {
            System.gc()
            Thread.sleep(20)
        }
        assertTrue(askpool.ffi.liveNativeNodes() <= before, "live: ${askpool.ffi.liveNativeNodes()}, before: $before")
        // A closed node leaves at once, and its cleaner has nothing left to do.
        val closed = Node()
        assertEquals(before + 1uL, askpool.ffi.liveNativeNodes())
        closed.close()
        assertEquals(before, askpool.ffi.liveNativeNodes())
    }

    @Test
    fun `stages nobody collects keep 64 events, the lifecycle and the newest progress`() = runBlocking {
        Node().use { node ->
            node.pool("chatty") { m, ctx ->
                repeat(20_000) { i -> ctx.progress(i / 20_000f, "step $i") }
                m
            }
            val handle = node.send("chatty", "x")
            assertEquals("x", handle.await())
            // The events reach the handle on the runtime's threads: let the
            // last ones arrive before reading what was kept.
            delay(500)
            val events = withTimeout(5_000) { handle.stages.toList() }
            assertTrue(events.size <= MAX_UNREAD_STAGE_EVENTS, "kept ${events.size} events")
            assertEquals(listOf("SENT", "RECEIVED", "READ"), events.take(3).map { it.stage }, "the lifecycle stays")
            assertEquals("FULFILLED", events.last().stage)
            val partials = events.drop(3).dropLast(1)
            assertTrue(partials.all { it.stage == "PARTIAL" }, "$events")
            assertEquals("step 19999", partials.last().note, "the newest progress kept")
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `tell with bad args, replay of missing letters`() = runBlocking {
        Node(NodeOptions(maxPayloadBytes = 4)).use { node ->
            node.pool("echo") { m, _ -> m }
            val e1 = failure { node.tell("nowhere", "x") }
            assertTrue(e1 is AskException.NoRoute, "$e1")
            val e2 = failure { node.tell("echo", ByteArray(5)) }
            assertTrue(e2 is AskException.OversizePayload, "$e2")
            val e3 = failure { node.replayDeadLetter("0123456789abcdef0123456789abcdef") }
            assertTrue(e3 is AskException.FailedPrecondition, "$e3")
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `promises with bad inputs`() = runBlocking {
        Promises.memory().use { p ->
            val results = mutableListOf<Pair<String, Result<Any?>>>()
            results += "create neg" to runCatching { p.create("a", (-1).seconds) }
            results += "create zero" to runCatching { p.create("z", Duration.ZERO) }
            results += "create inf" to runCatching { p.create("b", Duration.INFINITE) }
            results += "create huge" to runCatching { p.create("c", Long.MAX_VALUE.milliseconds) }
            results += "create empty id" to runCatching { p.create("", 1.seconds) }
            results += "get missing" to runCatching { p.get("missing") }
            results += "resolve missing" to runCatching { p.resolve("missing") }
            results += "await missing" to runCatching { withTimeout(5_000) { p.await("missing") } }
            results += "prune neg" to runCatching { p.prune((-1).seconds) }
            results += "prune inf" to runCatching { p.prune(Duration.INFINITE) }
            val expect = mapOf(
                "create neg" to PromiseException.InvalidArgument::class,
                "create empty id" to PromiseException.InvalidArgument::class,
                "get missing" to PromiseException.NotFound::class,
                "resolve missing" to PromiseException.NotFound::class,
                "await missing" to PromiseException.NotFound::class,
                "prune neg" to PromiseException.InvalidArgument::class,
            )
            for ((w, r) in results) {
                val want = expect[w]
                if (want == null) {
                    assertTrue(r.isSuccess, "$w: $r")
                } else {
                    assertTrue(want.isInstance(r.exceptionOrNull()), "$w: $r")
                }
            }
        }
        val r1 = runCatching { Promises.memory((-1).seconds) }
        assertTrue(r1.exceptionOrNull() is PromiseException.InvalidArgument, "$r1")
        val r2 = runCatching { Promises.open("") }
        assertTrue(r2.exceptionOrNull() is PromiseException.InvalidArgument, "$r2")
        val p = Promises.memory()
        p.close()
        p.close()
        val calls: List<Pair<String, suspend () -> Any?>> = listOf(
            "get" to { p.get("x") },
            "create" to { p.create("x", 1.seconds) },
            "resolve" to { p.resolve("x") },
            "reject" to { p.reject("x") },
            "cancel" to { p.cancel("x") },
            "prune" to { p.prune(1.seconds) },
            "await" to { withTimeout(5_000) { p.await("x") } },
        )
        for ((what, call) in calls) {
            val e = runCatching { call() }.exceptionOrNull()
            assertTrue(e is PromiseException.Closed, "$what after close: $e")
        }
    }

    @Test
    fun `durable ask on a closed store`() = runBlocking {
        val p = Promises.memory()
        p.close()
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            // The generated code does not check a closed object passed as
            // an argument: the store's freed handle was used (it "worked",
            // or hung the JVM).
            val r = failure { node.askDurable(p, "echo", byteArrayOf(1)).await() }
            assertTrue(r is AskException.FailedPrecondition, "askDurable: $r")
            val r2 = failure { node.awaitDurable(p, "0123456789abcdef0123456789abcdef") }
            assertTrue(r2 is AskException.FailedPrecondition, "awaitDurable: $r2")
            settled(node)
        }
    }

    @Test
    fun `durable ask with an infinite store timeout`() = runBlocking {
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            Promises.memory(Duration.INFINITE).use { pi ->
                assertArrayEquals(byteArrayOf(1), withTimeout(5_000) { node.askDurable(pi, "echo", byteArrayOf(1)).await() })
            }
            settled(node)
        }
    }

    @Test
    fun `concurrent close while many asks are in flight`() = runBlocking {
        repeat(5) { round ->
            val node = Node(NodeOptions(circuitBreaker = false))
            node.pool("slowish", PoolOptions(concurrency = 8)) { m, _ -> delay(1); m }
            node.pool("bytes", PoolOptions(concurrency = 8)) { m, _ -> m }
            val jobs = (0 until 400).map { i ->
                async(Dispatchers.Default) {
                    runCatching {
                        when (i % 3) {
                            0 -> node.ask("slowish", i)
                            1 -> node.send("bytes", byteArrayOf(i.toByte())).await()
                            else -> node.tell("slowish", i)
                        }
                    }
                }
            }
            delay(round * 3L)
            val closer = async(Dispatchers.Default) { node.close() }
            val results = withTimeout(20_000) { jobs.awaitAll() }
            closer.await()
            val bad = results.mapNotNull { it.exceptionOrNull() }
                .filter { it !is AskException.Unavailable && !(it is AskException.AskCancelled && it.reason == CancelReason.SHUTDOWN) }
            assertTrue(bad.isEmpty(), "round $round: unexpected ${bad.take(5)}")
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `a handler that suspends on another dispatcher, and nested asks`() = runBlocking {
        Node().use { node ->
            node.pool("io") { m, _ -> withContext(Dispatchers.IO) { delay(5); Thread.sleep(2); m } }
            node.pool("outer", PoolOptions(concurrency = 2)) { m, _ -> node.ask("io", m) }
            val obj = Any()
            assertTrue(node.ask("outer", obj) === obj)
            val many = (0 until 100).map { async(Dispatchers.Default) { node.ask("outer", it) } }.awaitAll()
            assertEquals((0 until 100).toList(), many)
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `remote cancel after the handler finished leaves no mark`() = runBlocking {
        Node(NodeOptions(maxAttempts = 1)).use { node ->
            node.pool("quick", PoolOptions(concurrency = 4)) { m, _ -> m }
            repeat(2000) { i ->
                val h = node.send("quick", i)
                h.cancel()
                runCatching { h.await() }
            }
            settled(node)
        }
        noHandles()
    }

    @Test
    fun `a string that is not valid Unicode is InvalidArgument, and a handler's such text arrives cleaned up`() = runBlocking {
        // An unpaired UTF-16 surrogate: a Kotlin String may hold one, UTF-8 cannot.
        val bad = "pool\uD800"
        Node().use { node ->
            node.pool("echo") { m, _ -> m }
            node.pool("thrower") { _, _ -> throw IllegalStateException("bad \uD800 message") }
            node.pool("noter") { m, ctx -> ctx.progress(0.5f, "note \uD800"); m }
            val refused: List<Pair<String, suspend () -> Any?>> = listOf(
                "pool" to { node.pool(bad) { m, _ -> m } },
                "ask" to { node.ask(bad, "x") },
                "ask bytes" to { node.ask(bad, byteArrayOf(1)) },
                "send" to { node.send(bad, "x").await() },
                "tell" to { node.tell(bad, "x") },
                "correlationId" to { node.ask("echo", "x", AskOptions(correlationId = "\uD800")) },
                "preferredWorker" to { node.ask("echo", "x", AskOptions(preferredWorker = "w\uD800")) },
                "replayDeadLetter" to { node.replayDeadLetter("\uD800") },
            )
            for ((what, call) in refused) {
                val e = runCatching { withTimeout(10_000) { call() } }.exceptionOrNull()
                assertTrue(e is AskException.InvalidArgument, "$what: $e")
            }
            val e = runCatching { node.ask("thrower", "x") }.exceptionOrNull() as AskException.HandlerFailed
            assertEquals("java.lang.IllegalStateException", e.typeName)
            assertEquals("bad \uFFFD message", e.handlerMessage)
            assertEquals("x", node.ask("noter", "x"), "a progress note is cleaned up, not refused")
            settled(node)
        }
        noHandles()
        Promises.memory().use { p ->
            assertThrows(PromiseException.InvalidArgument::class.java) { p.create("id\uD800", 1.seconds) }
        }
        assertEquals("a\uD83D\uDE00b", validText("a\uD83D\uDE00b"), "a pair is kept")
        assertEquals("\uFFFD\uFFFDc", validText("\uDE00\uD83Dc"), "a reversed pair is two unpaired halves")
    }

    @Test
    fun `a progress fraction out of range is clamped as in every binding, NaN and an oversize note are refused`() = runBlocking {
        Node().use { node ->
            var nan: Throwable? = null
            var oversize: Throwable? = null
            node.pool("p") { m, ctx ->
                ctx.progress(-0.5f)
                ctx.progress(1.5f, "rounding past the end")
                nan = runCatching { ctx.progress(Float.NaN) }.exceptionOrNull()
                    ?.takeIf { runCatching { ctx.progress(Float.POSITIVE_INFINITY) }.exceptionOrNull() is AskException.InvalidArgument }
                // A report's bound is 4096 UTF-8 bytes (2 per 'é').
                oversize = runCatching { ctx.progress(1f, "é".repeat(2049)) }.exceptionOrNull()
                ctx.progress(1f, "é".repeat(2048))
                m
            }
            val handle = node.send("p", "x")
            val partial = withTimeout(5_000) { handle.stages.toList() }.filter { it.stage == "PARTIAL" }
            assertEquals("x", handle.await())
            assertEquals(listOf(0f, 1f, 1f), partial.map { it.progress })
            assertEquals(listOf(0, 21, 2048), partial.map { it.note?.length ?: 0 })
            assertTrue(nan is AskException.InvalidArgument, "$nan")
            assertTrue(oversize is AskException.InvalidArgument && "4098 bytes" in oversize!!.message!!, "$oversize")
            settled(node)
        }
        noHandles()
    }
}
