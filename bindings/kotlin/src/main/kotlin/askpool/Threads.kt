package askpool

import askpool.ffi.uniffiCallbackInterfaceAskListener
import askpool.ffi.uniffiCallbackInterfaceHostHandler
import com.sun.jna.CallbackThreadInitializer
import com.sun.jna.Native
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.Dispatchers
import java.util.concurrent.atomic.AtomicInteger
import kotlin.coroutines.ContinuationInterceptor
import kotlin.coroutines.CoroutineContext
import kotlin.coroutines.EmptyCoroutineContext

/**
 * Runtime threads call into the JVM for every outcome and request. JNA
 * attaches a native thread on each callback and detaches it afterwards
 * unless told otherwise; attaching creates a new java.lang.Thread each
 * time, which costs more than the callback. Each runtime thread is told
 * once to stay attached (JNA detaches it when the native thread exits).
 *
 * They are attached as daemon threads: the runtime's threads never end, so
 * attached as ordinary threads they kept the JVM from exiting after `main`
 * returned, whether or not every node was closed. JNA reads a callback's
 * thread options when it makes the callback's native trampoline, which
 * uniffi does when the library loads: [ensure] runs before anything loads
 * the library (every entry point of the wrapper calls it first).
 */
internal object JvmThreads {
    init {
        // detach = false: a thread stays attached after its first callback.
        val options = CallbackThreadInitializer(true, false, "askpool-runtime")
        listOf(
            uniffiCallbackInterfaceAskListener.onReplyBytes,
            uniffiCallbackInterfaceAskListener.onTold,
            uniffiCallbackInterfaceAskListener.onFailure,
            uniffiCallbackInterfaceAskListener.onStage,
            uniffiCallbackInterfaceAskListener.onStagesEnd,
            uniffiCallbackInterfaceAskListener.uniffiFree,
            uniffiCallbackInterfaceAskListener.uniffiClone,
            uniffiCallbackInterfaceHostHandler.handleBytes,
            uniffiCallbackInterfaceHostHandler.cancelled,
            uniffiCallbackInterfaceHostHandler.uniffiFree,
            uniffiCallbackInterfaceHostHandler.uniffiClone,
        ).forEach { Native.setCallbackThreadInitializer(it, options) }
    }

    /** Sets the callbacks' thread options; a call before the library loads (see the class doc). */
    fun ensure() = Unit

    private val kept = ThreadLocal.withInitial { false }

    /** Threads of the library's own (the runtime's, `askpool-events`). */
    private val library = ThreadLocal.withInitial { false }

    fun markLibraryThread() = library.set(true)

    /**
     * Whether this is one of the library's threads: a caller's code must not
     * run here (a caller blocking one would stall every ask's timers).
     */
    fun onLibraryThread(): Boolean = library.get()

    /**
     * Runs [block] here, unless here is a library thread and what it
     * resumes runs its code in place: a continuation of [resumes] with no
     * dispatcher or `Dispatchers.Unconfined`, or (null) an awaiter not
     * known here. Then on `Dispatchers.IO`, where such a caller may block.
     */
    inline fun offLibraryThread(resumes: CoroutineContext?, crossinline block: () -> Unit) {
        if (onLibraryThread() && (resumes == null || !dispatches(resumes))) {
            Dispatchers.IO.dispatch(EmptyCoroutineContext, Runnable { block() })
        } else {
            block()
        }
    }

    /** Whether a continuation of [context] is dispatched, not run in place. */
    fun dispatches(context: CoroutineContext): Boolean {
        val dispatcher = context[ContinuationInterceptor] as? CoroutineDispatcher
        return dispatcher != null && dispatcher.isDispatchNeeded(context)
    }

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
        library.set(true)
        Native.detach(false)
        attached.incrementAndGet()
    }
}
