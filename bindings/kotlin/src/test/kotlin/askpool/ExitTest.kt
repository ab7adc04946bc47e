package askpool

import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.nio.file.Files
import java.nio.file.Path
import java.util.concurrent.TimeUnit

/**
 * A program using askpool ends when its `main` returns: the runtime's
 * threads, attached to the JVM by callbacks, must not keep it alive.
 */
class ExitTest {
    private fun run(mode: String): Pair<Boolean, String> {
        val java = Path.of(System.getProperty("java.home"), "bin", "java").toString()
        val classpath = System.getProperty("surefire.test.class.path") ?: System.getProperty("java.class.path")
        val command = listOf(java, "-cp", classpath, "-Djna.library.path=${System.getProperty("jna.library.path")}", ExitChild::class.java.name, mode)
        val log = Files.createTempFile("exit-child", ".log").toFile()
        val process = ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log).start()
        val finished = process.waitFor(60, TimeUnit.SECONDS)
        if (!finished) process.destroyForcibly().waitFor()
        val output = log.readText().also { log.delete() }
        if (finished) assertEquals(0, process.exitValue(), output)
        return finished to output
    }

    @Test
    fun `the JVM exits when main returns after the node closed`() {
        val (finished, output) = run("closed")
        assertTrue("done" in output, output)
        assertTrue(finished, "the JVM did not exit after main returned:\n$output")
    }

    @Test
    fun `the JVM exits when main returns with a node never closed`() {
        val (finished, output) = run("open")
        assertTrue("done" in output, output)
        assertTrue(finished, "the JVM did not exit after main returned:\n$output")
    }
}

/** The child of [ExitTest]: asks that call back from runtime threads, then returns from main. */
object ExitChild {
    @JvmStatic
    fun main(args: Array<String>) {
        val node = Node()
        runBlocking {
            node.pool("echo", PoolOptions(concurrency = 2)) { m, _ -> m }
            // Bytes: the request and the reply are callbacks from runtime threads.
            repeat(50) { node.ask("echo", byteArrayOf(it.toByte())) }
            node.tell("echo", "told")
            runCatching { node.ask("nowhere", "x") }
            val h = node.send("echo", "staged")
            h.await()
            h.stages.collect {}
        }
        if (args[0] == "closed") node.close()
        println("done")
    }
}
