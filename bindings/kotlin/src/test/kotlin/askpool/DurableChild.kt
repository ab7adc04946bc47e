package askpool

import kotlinx.coroutines.runBlocking
import java.util.concurrent.atomic.AtomicInteger

/**
 * The second process of the restart tests (launched by [PromisesTest]):
 * `await DB ID` awaits a durable ask by id on a fresh node whose pool
 * counts its handler runs; `resolve DB ID VALUE` resolves a promise.
 * Prints one `key=value` line per result.
 */
object DurableChild {
    @JvmStatic
    fun main(args: Array<String>) {
        // No exitProcess: the JVM ends when main returns (ExitTest).
        run(args)
    }

    /** The durable pool of the tests: upper-cases UTF-8, counting its runs. */
    fun upper(runs: AtomicInteger) = Handler { msg, _ ->
        runs.incrementAndGet()
        (msg as ByteArray).decodeToString().uppercase().encodeToByteArray()
    }

    private fun run(args: Array<String>) = runBlocking {
        Promises.open(args[1]).use { promises ->
            when (args[0]) {
                "await" -> Node().use { node ->
                    val runs = AtomicInteger()
                    node.pool("upper", handler = upper(runs))
                    val reply = node.awaitDurable(promises, args[2], DurableCodec.UTF8)
                    println("reply=$reply")
                    println("runs=${runs.get()}")
                }
                "resolve" -> println("state=${promises.resolve(args[2], args[3].encodeToByteArray()).state}")
                else -> error("unknown mode ${args[0]}")
            }
        }
    }
}
