package askpool

import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.nio.file.Files
import java.nio.file.Path
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger
import kotlin.concurrent.thread

/**
 * The library first used from threads that come and go (a pool thread that
 * is retired, as `Dispatchers.IO` retires idle ones): the allocator it links
 * must not tie itself to the first thread that used it. Run in a child JVM:
 * the failure this guards against is the process dying.
 */
class ThreadsTest {
    @Test
    fun `first use from short-lived threads does not crash the JVM`() {
        val java = Path.of(System.getProperty("java.home"), "bin", "java").toString()
        val classpath = System.getProperty("surefire.test.class.path") ?: System.getProperty("java.class.path")
        val command = listOf(java, "-cp", classpath, "-Djna.library.path=${System.getProperty("jna.library.path")}", ThreadsChild::class.java.name)
        val log = Files.createTempFile("threads-child", ".log").toFile()
        val process = ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start()
        val finished = process.waitFor(120, TimeUnit.SECONDS)
        if (!finished) process.destroyForcibly().waitFor()
        val output = log.readText().also { log.delete() }
        assertTrue(finished, "the child did not finish:\n$output")
        assertEquals(0, process.exitValue(), output)
        // Every ask of every thread answered with its own bytes: a child whose
        // threads failed (no library, a wrong reply) exits 1 or counts fewer.
        assertTrue(Regex("(?m)^done ${ThreadsChild.THREADS * ThreadsChild.ASKS}$").containsMatchIn(output), output)
    }
}

/**
 * The child of [ThreadsTest]: each short-lived thread makes a node, asks,
 * closes it. A failure on any thread ends the process with status 1 (an
 * exception in a `thread {}` would otherwise only be printed); prints
 * `done <asks answered>` at the end.
 */
object ThreadsChild {
    const val THREADS = 30
    const val ASKS = 20

    @JvmStatic
    fun main(args: Array<String>) {
        Thread.setDefaultUncaughtExceptionHandler { t, e ->
            System.err.println("uncaught on ${t.name}:")
            e.printStackTrace()
            System.err.flush()
            Runtime.getRuntime().halt(1)
        }
        val answered = AtomicInteger()
        repeat(THREADS) { i ->
            thread {
                Node().use { node ->
                    runBlocking {
                        node.pool("echo") { m, _ -> m }
                        repeat(ASKS) {
                            val reply = node.ask("echo", byteArrayOf(i.toByte())) as ByteArray
                            check(reply.contentEquals(byteArrayOf(i.toByte()))) { "thread $i: reply ${reply.toList()}" }
                            answered.incrementAndGet()
                        }
                    }
                }
            }.join()
        }
        println("done ${answered.get()}")
    }
}
