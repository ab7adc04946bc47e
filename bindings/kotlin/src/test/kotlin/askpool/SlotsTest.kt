package askpool

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import kotlin.random.Random

/** The per-ask tables behind the handle table, the waiters and running requests. */
class SlotsTest {
    @Test
    fun `a freed slot is reused under a new handle and the old one finds nothing`() {
        val slots = Slots<String>()
        val a = slots.put("a")
        assertNotEquals(0L, a)
        assertTrue(a > 0)
        assertEquals("a", slots.get(a))
        assertEquals("a", slots.take(a))
        assertNull(slots.take(a), "taken twice")
        val b = slots.put("b")
        assertNotEquals(a, b, "same slot, next generation")
        assertNull(slots.get(a), "a stale handle")
        assertEquals("b", slots.get(b))
        assertNull(slots.get(0L))
        assertEquals(1, slots.size())
    }

    @Test
    fun `slots from many threads stay apart`() {
        val slots = Slots<Any>()
        val threads = (0 until 8).map {
            Thread {
                val mine = (0 until 5_000).map { i -> Any().let { o -> slots.put(o) to o } }
                for ((h, o) in mine) assertSame(o, slots.get(h))
                for ((h, o) in mine.filterIndexed { i, _ -> i % 2 == 0 }) assertSame(o, slots.take(h))
            }.apply { start() }
        }
        threads.forEach { it.join() }
        assertEquals(8 * 2_500, slots.size())
    }

    @Test
    fun `the request table matches a plain map under random starts, cancels and finishes`() {
        val table = RequestTable()
        val model = HashMap<Long, RequestContext>()
        val early = HashSet<Long>()
        val random = Random(7)
        repeat(200_000) {
            // Few keys, so probe chains collide and wrap.
            val key = 1L + random.nextInt(300)
            when (random.nextInt(3)) {
                0 -> if (key !in model) {
                    val context = RequestContext(key)
                    assertEquals(early.remove(key), table.start(key, context))
                    model[key] = context
                }
                1 -> {
                    val found = table.cancel(key) { true }
                    assertSame(model[key], found)
                    if (found == null) early.add(key)
                }
                else -> if (key in model) {
                    table.finish(key)
                    model.remove(key)
                }
            }
            assertEquals(model.size, table.size())
        }
        for (key in model.keys) assertSame(model[key], table.cancel(key) { true })
        assertFalse(model.isEmpty())
    }

    @Test
    fun `a cancel that crosses the reply leaves nothing behind`() {
        val table = RequestTable()
        val context = RequestContext(9)
        assertFalse(table.start(9, context))
        table.finish(9)
        // The runtime's cancel arrives after the handler answered and
        // finished: the runtime no longer knows the request.
        assertNull(table.cancel(9) { false })
        assertEquals(0, table.entries())
        // A cancel before its start is kept for the start, then gone with it.
        assertNull(table.cancel(10) { true })
        assertEquals(1, table.entries())
        assertTrue(table.start(10, RequestContext(10)))
        table.finish(10)
        assertEquals(0, table.entries())
    }
}
