package askpool

import askpool.ffi.Stage
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import java.util.concurrent.atomic.AtomicBoolean
import java.util.concurrent.atomic.AtomicLong
import kotlin.time.Duration
import kotlin.time.Duration.Companion.microseconds

/** One stage change of an ask's ACK lifecycle. */
data class StageEvent(
    /** `SENT`, `RECEIVED`, `READ`, `PARTIAL`, `FULFILLED`, `REJECTED`, `FAILED`, `TIMED_OUT`. */
    val stage: String,
    val sincePrevious: Duration,
    val sinceSent: Duration,
    val progress: Float?,
    val note: String?,
)

/** Stage events an ask keeps for a collector that is not reading, as the core does. */
internal const val MAX_UNREAD_STAGE_EVENTS = 64

/** An ask in flight, from [Node.send] or [Node.replayDeadLetterHandle]. */
class AskHandle internal constructor(private val node: Node) : Completion {
    internal var token = 0L

    /** The ask's request id, 32 hex digits. */
    lateinit var requestId: String
        internal set

    /**
     * Its correlation id: the one given ([AskOptions.correlationId]), else
     * the request id; a replay's is its dead letter's.
     */
    lateinit var correlationId: String
        internal set

    /**
     * The token the native side keeps this ask's stage record under until
     * [stages] is collected (opening a stream for every ask cost a callback
     * per stage, read or not); 0 once opened or let go, or if none was kept.
     */
    private val stageRecord = AtomicLong()

    /** Lets the record go if this handle is collected before its stages are. */
    @Volatile private var recordRelease: java.lang.ref.Cleaner.Cleanable? = null

    /** Takes what starting the ask reported. */
    internal fun started(requestId: String, correlationId: String, stagesKept: Boolean) {
        this.requestId = requestId
        this.correlationId = correlationId
        if (stagesKept) {
            stageRecord.set(token)
            recordRelease = Node.CLEANER.register(this, ReleaseStageRecord(stageRecord))
        }
    }

    private val result = CompletableDeferred<Any?>()
    // Bounded as the core bounds a stream nobody reads: the events are
    // pushed here as they happen, so an unbounded buffer grew with every
    // progress report of a long handler whose caller never collects
    // `stages`. Past 64 the oldest PARTIAL goes: SENT, RECEIVED, READ and
    // the terminal stay. Guarded by its own lock; `stageSignal` wakes the
    // collector.
    private val unread = ArrayDeque<StageEvent>()
    private var stagesEnded = false
    private val stageSignal = Channel<Unit>(Channel.CONFLATED)

    private val stagesTaken = AtomicBoolean()

    /**
     * The ask's stages, ending after the terminal one. Collected once: a
     * second collection throws [AskException.InvalidArgument] (two
     * collectors would each get part of the events).
     */
    val stages: Flow<StageEvent> = flow {
        if (!stagesTaken.compareAndSet(false, true)) {
            throw AskException.InvalidArgument("the stages of an ask can be collected once")
        }
        openStages()
        while (true) {
            val (batch, ended) = synchronized(unread) {
                val batch = unread.toList()
                unread.clear()
                batch to stagesEnded
            }
            for (event in batch) emit(event)
            if (ended) break
            stageSignal.receive()
        }
    }

    /** Streams the kept record's stages here; ends the stages at once if there is none. */
    private fun openStages() {
        val record = stageRecord.getAndSet(0L)
        // Nothing left for the cleaner to let go: unregistered.
        recordRelease?.clean()
        if (record == 0L) {
            stagesEnd()
            return
        }
        Completions.openStream(record, this)
        val opened = try {
            AskException.native { askpool.ffi.openStages(record) }
        } catch (e: Throwable) {
            Completions.closeStream(record)
            throw e
        }
        if (!opened) {
            Completions.closeStream(record)
            stagesEnd()
        }
    }

    /** The reply. Cancelling the awaiting coroutine cancels the ask. */
    suspend fun await(): Any? = try {
        result.await()
    } catch (e: CancellationException) {
        cancel()
        throw e
    }

    /** The reply; cancelling the awaiting coroutine leaves the ask running (a [DurableAsk]). */
    internal suspend fun awaitKeepingAsk(): Any? = result.await()

    /**
     * Waits until the ask has ended, however it ended. Unlike [await],
     * cancelling the waiting coroutine leaves the ask running: a
     * `withTimeoutOrNull { join() }` waits a while and gives nothing up
     * (a replayed dead letter included).
     */
    suspend fun join() = result.join()

    /**
     * Cancels the ask: [await] throws [AskException.AskCancelled] unless it
     * already ended. Does nothing once the node is closed (the ask failed).
     */
    fun cancel() = node.cancelAsk(token)

    val isCompleted: Boolean get() = result.isCompleted

    // An unconfined awaiter resumes on the thread that completes `result`,
    // whose dispatcher is not known here: never a library thread.
    override fun complete(value: Any?) {
        JvmThreads.offLibraryThread(null) { result.complete(value) }
    }

    override fun fail(error: AskException) {
        JvmThreads.offLibraryThread(null) { result.completeExceptionally(error) }
    }

    override fun stage(stage: Stage) {
        val event = StageEvent(
            stage.stage,
            stage.sincePreviousMicros.toLong().microseconds,
            stage.sinceSentMicros.toLong().microseconds,
            stage.progress,
            stage.note,
        )
        synchronized(unread) {
            if (unread.size >= MAX_UNREAD_STAGE_EVENTS) {
                val oldest = unread.indexOfFirst { it.stage == "PARTIAL" }
                if (oldest >= 0) unread.removeAt(oldest) else unread.removeFirst()
            }
            unread.addLast(event)
        }
        signalStages()
    }

    override fun stagesEnd() {
        synchronized(unread) { stagesEnded = true }
        signalStages()
    }

    // As for `complete`: an unconfined collector resumes on the thread that
    // signals, which must not be a library thread.
    private fun signalStages() {
        JvmThreads.offLibraryThread(null) { stageSignal.trySend(Unit) }
    }

    /**
     * The ask never started (its start panicked or threw): the stage record
     * the native side may have kept for it is let go now, as no handle
     * will ever be returned to collect it or be collected with it.
     */
    internal fun dropStageRecord() {
        ReleaseStageRecord(AtomicLong(token)).run()
    }
}

/** Holds the record's cell, never the [AskHandle]: a cleaning action must not reach its object. */
private class ReleaseStageRecord(private val record: AtomicLong) : Runnable {
    override fun run() {
        val token = record.getAndSet(0L)
        if (token != 0L && Hot.askpool_hot_stages_free(token) == Hot.PANICKED.toInt()) {
            System.err.println("askpool: panic in askpool_hot_stages_free (caught); see above")
        }
    }
}
