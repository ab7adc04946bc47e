package askpool

import java.io.File
import kotlin.time.Duration.Companion.seconds
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test

/** What the README's Kotlin example leaves to the reader. */
private data class Order(val id: Int)
private data class Receipt(val order: Order)

/**
 * The README's Kotlin example is compiled here, verbatim (a doc that drifted
 * from the API fails the build, not a user's first try), and run.
 */
class ReadmeTest {
    private suspend fun example(order: Order, event: Any): Pair<Any?, Any?> {
        // README:start
        Node().use { node ->
            node.pool("orders", PoolOptions(concurrency = 4)) { msg, ctx -> Receipt(msg as Order) }
            node.pool("audit") { event, _ -> println(event); null }
            val receipt = node.ask("orders", order, AskOptions(timeout = 5.seconds))  // suspends
            val handle = node.send("orders", order)   // handle.requestId, cancel(), stages: Flow (collected once), await(), join()
            node.tell("audit", event)                 // one-way, deduplicated by request id
            val letter = node.deadLetters().firstOrNull()
            if (letter != null) node.replayDeadLetterHandle(letter.requestId).await()  // an AskHandle, as send gives
        // README:end
            // The README's example ends here (its brace closes `use`).
            return receipt to handle.await()
        }
    }

    @Test
    fun `the README's Kotlin example is this one, and it runs`() = runBlocking {
        var dir: File? = File(System.getProperty("user.dir")).absoluteFile
        while (dir != null && !File(dir, "README.md").isFile) dir = dir.parentFile
        val root = checkNotNull(dir) { "no README.md above the working directory" }
        val section = File(root, "README.md").readText().substringAfter("\n## Kotlin").substringBefore("\n## ")
        val blocks = Regex("^```kotlin\n(.*?)^```$", setOf(RegexOption.DOT_MATCHES_ALL, RegexOption.MULTILINE))
            .findAll(section).map { it.groupValues[1] }.toList()
        assertEquals(1, blocks.size)
        val here = File(root, "bindings/kotlin/src/test/kotlin/askpool/ReadmeTest.kt").readText()
        val compiled = here.substringAfter("// README:start\n").substringBefore("        // README:end")
        // The README's block ends with the `use` lambda's brace, which closes
        // here after the checks below.
        assertEquals(blocks[0].trimIndent().trim(), compiled.trimIndent().trim() + "\n}")

        assertEquals(Receipt(Order(7)) to Receipt(Order(7)), example(Order(7), "an audit event"))
    }
}
