package askpool

import kotlinx.coroutines.delay
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.function.Executable

/** The [AskException] [block] throws (fails the test if it throws none or another). */
internal suspend fun failure(block: suspend () -> Any?): AskException {
    val e = runCatching { block() }.exceptionOrNull()
    assertTrue(e is AskException, "expected an AskException, got $e")
    return e as AskException
}

/** Waits up to 5 s until [cond] holds (counts settle on runtime threads). */
internal suspend fun eventually(what: String, cond: () -> Boolean) {
    val until = System.nanoTime() + 5_000_000_000L
    while (!cond()) {
        assertTrue(System.nanoTime() < until, "still not: $what")
        delay(5)
    }
}

/** Asserts that [make] throws [AskException.InvalidArgument]. */
internal fun invalid(what: String, make: () -> Any?) {
    val e = assertThrows(AskException.InvalidArgument::class.java, Executable { make() }, what)
    assertEquals("INVALID_ARGUMENT", e.code)
}
