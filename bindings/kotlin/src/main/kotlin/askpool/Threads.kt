package askpool

import com.sun.jna.Native
import java.util.concurrent.atomic.AtomicInteger

/**
 * Runtime threads call into the JVM for every outcome and request. JNA
 * attaches a native thread on each callback and detaches it afterwards
 * unless told otherwise; attaching creates a new java.lang.Thread each
 * time, which costs more than the callback. Each runtime thread is told
 * once to stay attached (JNA detaches it when the native thread exits).
 */
internal object JvmThreads {
    private val kept = ThreadLocal.withInitial { false }

    /** Java threads created for native callback threads and kept attached. */
    val attached = AtomicInteger()

    /** Set by tests: record every distinct thread that calls back. */
    @Volatile var observe = false
    val observed: MutableSet<Thread> = java.util.Collections.newSetFromMap(java.util.concurrent.ConcurrentHashMap())

    fun stayAttached() {
        // A callback made during a hot call runs on the JVM thread that made
        // the call: nothing to attach.
        if (Hot.inCall()) return
        if (observe) observed.add(Thread.currentThread())
        if (kept.get()) return
        kept.set(true)
        Native.detach(false)
        attached.incrementAndGet()
    }
}
