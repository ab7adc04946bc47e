package askpool

import kotlinx.coroutines.async
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.io.TempDir
import java.io.File
import java.nio.file.Files
import java.nio.file.Path
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration
import kotlin.time.Duration.Companion.hours
import kotlin.time.Duration.Companion.microseconds
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

class PromisesTest {
    private fun b(s: String) = s.encodeToByteArray()

    @Test
    fun `create, get, resolve, reject and cancel move a promise once`() {
        Promises.memory().use { p ->
            val created = p.create("a", timeout = 1.hours, param = b("in"))
            assertEquals(PromiseState.PENDING, created.state)
            assertArrayEquals(b("in"), p.get("a").param)
            assertNull(p.get("a").value)

            val resolved = p.resolve("a", b("out"))
            assertEquals(PromiseState.RESOLVED, resolved.state)
            assertArrayEquals(b("out"), p.get("a").value)
            assertTrue(p.get("a").settledAt != null)

            p.create("r", timeout = 1.hours)
            assertEquals(PromiseState.REJECTED, p.reject("r", b("why")).state)
            p.create("c", timeout = 1.hours)
            assertEquals(PromiseState.CANCELED, p.cancel("c").state)
            assertEquals(PromiseState.CANCELED, p.get("c").state)
        }
    }

    @Test
    fun `keys make create and completion idempotent`() {
        Promises.memory().use { p ->
            assertFalse(p.create("k", timeout = 1.hours, key = "ck").replayed)
            assertTrue(p.create("k", timeout = 1.hours, key = "ck").replayed)
            assertFalse(p.resolve("k", b("v"), key = "done").replayed)
            val again = p.resolve("k", b("v"), key = "done")
            assertTrue(again.replayed)
            assertEquals(PromiseState.RESOLVED, again.state)
        }
    }

    @Test
    fun `unknown ids, refused transitions and bad files are typed errors`(@TempDir dir: Path) {
        Promises.memory().use { p ->
            val missing = assertThrows(PromiseException.NotFound::class.java) { p.get("nope") }
            assertEquals("NotFound", missing.code)
            assertThrows(PromiseException.NotFound::class.java) { p.resolve("nope") }
            p.create("x", timeout = 1.hours)
            p.resolve("x", b("1"))
            val refused = assertThrows(PromiseException.AlreadySettled::class.java) { p.reject("x") }
            assertTrue(refused.message!!.contains("x"), refused.message)
            assertArrayEquals(b("1"), p.get("x").value, "a refused transition changes nothing")
            assertThrows(PromiseException.AlreadyExists::class.java) { p.create("x", timeout = 1.hours, key = "other") }
        }
        val junk = dir.resolve("junk.db")
        Files.write(junk, ByteArray(8192) { (it * 31).toByte() })
        val bad = assertThrows(PromiseException.BadDatabase::class.java) { Promises.open(junk) }
        assertTrue(bad.code in setOf("Corrupt", "Foreign"), bad.code)
    }

    @Test
    fun `a durable timeout under a millisecond is refused`(@TempDir dir: Path) {
        // Every durable ask would time out as it is stored, its handler never run.
        for (bad in listOf(Duration.ZERO, 500.microseconds, (-1).seconds)) {
            assertThrows(PromiseException.InvalidArgument::class.java, { Promises.memory(bad) }, "$bad")
            assertThrows(PromiseException.InvalidArgument::class.java, { Promises.open(dir.resolve("p.db"), bad) }, "$bad")
        }
        Promises.memory(1.milliseconds).close()
    }

    @Test
    fun `prune deletes the promises settled longer ago than the retention`() {
        Promises.memory().use { p ->
            for (id in listOf("done-1", "done-2", "open")) p.create(id, timeout = 1.hours)
            p.resolve("done-1", b("1"))
            p.reject("done-2", b("2"))
            Thread.sleep(20)
            assertEquals(2L, p.prune(Duration.ZERO))
            assertThrows(PromiseException.NotFound::class.java) { p.get("done-1") }
            assertEquals(PromiseState.PENDING, p.get("open").state)
            // Settled within the retention: kept.
            p.resolve("open", b("3"))
            assertEquals(0L, p.prune(1.hours))
            assertEquals(PromiseState.RESOLVED, p.get("open").state)
            assertThrows(PromiseException.InvalidArgument::class.java) { p.prune((-1).milliseconds) }
        }
    }

    @Test
    fun `await suspends until another caller settles the promise, and sees timeouts`() = runBlocking {
        Promises.memory().use { p ->
            p.create("w", timeout = 1.hours)
            val waiter = async { p.await("w") }
            assertFalse(waiter.isCompleted)
            p.resolve("w", b("done"))
            val settled = withTimeout(10.seconds) { waiter.await() }
            assertEquals(PromiseState.RESOLVED, settled.state)
            assertArrayEquals(b("done"), settled.value)

            p.create("t", timeout = 50.milliseconds)
            assertEquals(PromiseState.TIMEDOUT, withTimeout(10.seconds) { p.await("t") }.state)
            assertThrows(PromiseException.NotFound::class.java) { runBlocking { p.await("none") } }
        }
    }

    @Test
    fun `a durable ask records its reply and a second await answers from the promise`() = runBlocking {
        val runs = AtomicInteger()
        Promises.memory().use { p ->
            Node().use { node ->
                node.pool("upper", handler = DurableChild.upper(runs))
                val ask = node.askDurable(p, "upper", "hi", DurableCodec.UTF8, DurableCodec.UTF8)
                assertEquals("HI", ask.await())
                assertEquals(PromiseState.RESOLVED, p.get(ask.id).state)
                assertEquals("HI", node.awaitDurable(p, ask.id, DurableCodec.UTF8))
                assertEquals(1, runs.get())
            }
        }
    }

    @Test
    fun `a durable ask streams the stages of its ask, collected once`() = runBlocking {
        Promises.memory().use { p ->
            Node().use { node ->
                node.pool("slow") { msg, ctx ->
                    ctx.progress(0.5f, "half")
                    kotlinx.coroutines.delay(20)
                    msg
                }
                val ask = node.askDurable(p, "slow", b("hi"))
                val stages = async { withTimeout(5_000) { ask.stages.toList() } }
                assertArrayEquals(b("hi"), ask.await())
                val seen = stages.await()
                assertEquals(
                    listOf("SENT", "RECEIVED", "READ", "PARTIAL", "FULFILLED"),
                    seen.map { it.stage },
                )
                assertEquals("half", seen[3].note)
                val again = failure { ask.stages.toList() }
                assertTrue(again is AskException.InvalidArgument, again.toString())
                // Resumed by id (in upper case): answered from the promise,
                // no ask made, no stages.
                val resumed = node.resumeDurable(p, ask.id.uppercase(), DurableCodec.BYTES)
                assertEquals(ask.id, resumed.id)
                assertArrayEquals(b("hi"), resumed.await())
                assertEquals(emptyList<StageEvent>(), withTimeout(5_000) { resumed.stages.toList() })
            }
            // Not tracked: no stages, and nothing kept.
            Node(NodeOptions(trackStages = false)).use { node ->
                node.pool("echo") { msg, _ -> msg }
                val ask = node.askDurable(p, "echo", b("x"))
                assertArrayEquals(b("x"), ask.await())
                assertEquals(emptyList<StageEvent>(), withTimeout(5_000) { ask.stages.toList() })
            }
        }
    }

    @Test
    fun `a durable ask resumed by id streams the stages of the ask it makes again`() = runBlocking {
        Promises.memory().use { p ->
            // No pool of that name yet: the first ask fails NO_ROUTE and
            // leaves the promise pending.
            val id = Node().use { bare ->
                val first = bare.askDurable(p, "slow", b("hi"))
                assertTrue(failure { first.await() } is AskException.NoRoute)
                first.id
            }
            Node().use { node ->
                node.pool("slow") { msg, ctx ->
                    ctx.progress(0.5f, "half")
                    msg
                }
                val resumed = node.resumeDurable(p, id, DurableCodec.BYTES)
                val stages = async { withTimeout(5_000) { resumed.stages.toList() } }
                assertArrayEquals(b("hi"), resumed.await())
                assertEquals(
                    listOf("SENT", "RECEIVED", "READ", "PARTIAL", "FULFILLED"),
                    stages.await().map { it.stage },
                )
            }
        }
    }

    @Test
    fun `a codec that cannot encode the message is an invalid argument and stores nothing`() = runBlocking {
        val refusing = object : DurableCodec<String> {
            override fun encode(value: String): ByteArray = throw IllegalStateException("not this one")
            override fun decode(bytes: ByteArray): String = bytes.decodeToString()
        }
        Promises.memory().use { p ->
            Node().use { node ->
                node.pool("upper", handler = DurableChild.upper(AtomicInteger()))
                val e = assertThrows(AskException.InvalidArgument::class.java) {
                    node.askDurable(p, "upper", "hi", refusing, DurableCodec.UTF8)
                }
                assertTrue("not this one" in e.detail, e.detail)
                assertEquals(0L, node.stats().pending)
            }
        }
    }

    @Test
    fun `a durable ask's handler failure rejects the promise and bad ids are refused`() = runBlocking {
        Promises.memory().use { p ->
            Node().use { node ->
                node.pool("boom") { _, _ -> throw IllegalStateException("out of stock") }
                node.pool("obj") { _, _ -> "an object, not bytes" }
                val ask = node.askDurable(p, "boom", b("x"))
                val e = assertThrows(AskException.HandlerFailed::class.java) { runBlocking { ask.await() } }
                assertEquals("out of stock", e.handlerMessage)
                assertEquals(PromiseState.REJECTED, p.get(ask.id).state)
                val again = assertThrows(AskException.HandlerFailed::class.java) {
                    runBlocking { node.awaitDurable(p, ask.id) }
                }
                assertEquals("java.lang.IllegalStateException", again.typeName)

                val obj = node.askDurable(p, "obj", b("x"))
                assertThrows(AskException.DecodeFailure::class.java) { runBlocking { obj.await() } }
                assertThrows(AskException.DecodeFailure::class.java) { runBlocking { node.awaitDurable(p, obj.id) } }

                assertThrows(AskException.InvalidArgument::class.java) { runBlocking { node.awaitDurable(p, "not-hex") } }
                assertThrows(AskException.InvalidArgument::class.java) {
                    node.askDurable(p, "boom", b("x"), id = "not-hex")
                }
                assertEquals(0L, node.stats().awaitedOutcomes)
            }
        }
    }

    private fun child(vararg args: String): Map<String, String> {
        val java = Path.of(System.getProperty("java.home"), "bin", "java").toString()
        val classpath = System.getProperty("surefire.test.class.path") ?: System.getProperty("java.class.path")
        val command = listOf(java, "-cp", classpath, "-Djna.library.path=${System.getProperty("jna.library.path")}") +
            DurableChild::class.java.name + args
        val log = Files.createTempFile("durable-child", ".log").toFile()
        val process = ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start()
        val finished = process.waitFor(120, TimeUnit.SECONDS)
        if (!finished) process.destroyForcibly()
        val output = log.readText().also { log.delete() }
        assertTrue(finished, "the second process did not finish:\n$output")
        assertEquals(0, process.exitValue(), "second process failed:\n$output")
        return output.lines().filter { '=' in it }.associate { it.substringBefore('=') to it.substringAfter('=') }
    }

    @Test
    fun `after a restart a second JVM gets the outcome by id and the handler ran once`(@TempDir dir: Path) {
        val db = File(dir.toFile(), "asks.db").path
        val runs = AtomicInteger()
        val id = runBlocking {
            Promises.open(db).use { p ->
                Node().use { node ->
                    node.pool("upper", handler = DurableChild.upper(runs))
                    val ask = node.askDurable(p, "upper", "order 7", DurableCodec.UTF8, DurableCodec.UTF8)
                    assertEquals("ORDER 7", ask.await())
                    ask.id
                }
            }
        }
        val out = child("await", db, id)
        assertEquals("ORDER 7", out["reply"])
        assertEquals("0", out["runs"], "the second process must not run the handler again")
        assertEquals(1, runs.get())
    }

    @Test
    fun `await in one JVM sees a resolve made by another`(@TempDir dir: Path) = runBlocking {
        val db = File(dir.toFile(), "shared.db").path
        Promises.open(db).use { p ->
            p.create("job-1", timeout = 1.hours)
            val waiter = async { p.await("job-1") }
            assertEquals("RESOLVED", child("resolve", db, "job-1", "from the other side")["state"])
            val settled = withTimeout(30.seconds) { waiter.await() }
            assertEquals(PromiseState.RESOLVED, settled.state)
            assertArrayEquals(b("from the other side"), settled.value)
        }
    }
}
