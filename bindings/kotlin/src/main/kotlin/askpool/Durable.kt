package askpool

import kotlinx.coroutines.flow.Flow

/**
 * Turns values into bytes and back for durable asks: a promise outlives
 * the process, so what it holds must be bytes (an in-process object would
 * not survive a restart). Plug in any serializer (kotlinx.serialization,
 * Jackson, protobuf) by implementing this.
 */
interface DurableCodec<T> {
    fun encode(value: T): ByteArray
    fun decode(bytes: ByteArray): T

    companion object {
        val BYTES: DurableCodec<ByteArray> = object : DurableCodec<ByteArray> {
            override fun encode(value: ByteArray) = value
            override fun decode(bytes: ByteArray) = bytes
        }
        val UTF8: DurableCodec<String> = object : DurableCodec<String> {
            override fun encode(value: String) = value.encodeToByteArray()
            override fun decode(bytes: ByteArray) = bytes.decodeToString(throwOnInvalidSequence = true)
        }
    }
}

/**
 * A durable ask in flight. Its [id] (the promise id, also the request id)
 * is what a restarted process passes to [Node.awaitDurable].
 */
class DurableAsk<R> internal constructor(
    val id: String,
    private val handle: AskHandle,
    private val codec: DurableCodec<R>,
) {
    /**
     * The reply, recorded in the promise. Cancelling the awaiting coroutine
     * only stops waiting: the promise stays pending for a later await.
     */
    suspend fun await(): R = decode(handle.awaitKeepingAsk(), codec)

    /**
     * The stages of the asks it makes, one after another: SENT to a
     * terminal stage for each (an ask made again after a transient failure
     * starts at SENT again), ending with its outcome. Empty while it only
     * waits for an ask of the same id made by another handle, or on a node
     * that does not track stages. Collected once, as [AskHandle.stages].
     */
    val stages: Flow<StageEvent> get() = handle.stages
}

/**
 * Asks [pool] durably: the message and the outcome are kept in [promises]
 * under the returned ask's id. The pool's handler gets the encoded message
 * as a `ByteArray` and must reply with a `ByteArray`.
 */
fun <M, R> Node.askDurable(
    promises: Promises,
    pool: String,
    msg: M,
    codec: DurableCodec<M>,
    replyCodec: DurableCodec<R>,
    id: String? = null,
): DurableAsk<R> {
    // Before anything is registered: a message the codec refuses is the
    // caller's input, not an askpool failure.
    val encoded = try {
        codec.encode(msg)
    } catch (e: Exception) {
        throw AskException.InvalidArgument("${codec.javaClass.name} cannot encode the message: $e")
    }
    val handle = durableHandle()
    val askId = startDurable(handle) { token -> promises.held(::storeClosed) { native.askDurable(it, pool, encoded, id, token) } }
    // The native side keeps its stage record under the token when the node
    // tracks stages; one it did not keep opens as no stages.
    handle.started(askId, askId, stagesKept = true)
    return DurableAsk(askId, handle, replyCodec)
}

/** [askDurable] with bytes in and out. */
fun Node.askDurable(promises: Promises, pool: String, msg: ByteArray, id: String? = null): DurableAsk<ByteArray> =
    askDurable(promises, pool, msg, DurableCodec.BYTES, DurableCodec.BYTES, id)

/**
 * The outcome of the durable ask [id], typically after a restart: a
 * settled promise answers at once; a pending one is asked again under the
 * same id. Cancelling the calling coroutine stops the wait (nothing of it
 * is left behind); the ask runs on, its promise pending for a later await.
 */
suspend fun <R> Node.awaitDurable(promises: Promises, id: String, replyCodec: DurableCodec<R>): R {
    val handle = durableHandle()
    handle.requestId = id
    startDurable(handle) { token -> promises.held(::storeClosed) { native.awaitDurable(it, id, token, false) } }
    return decode(handle.await(), replyCodec)
}

/**
 * The durable ask [id] as a handle, typically after a restart: as
 * [awaitDurable], with the [DurableAsk.stages] of the ask it makes again
 * (none when its promise has settled); its [DurableAsk.await] only stops
 * waiting when cancelled, as an [askDurable]'s does.
 */
fun <R> Node.resumeDurable(promises: Promises, id: String, replyCodec: DurableCodec<R>): DurableAsk<R> {
    val handle = durableHandle()
    val askId = startDurable(handle) { token -> promises.held(::storeClosed) { native.awaitDurable(it, id, token, true) } }
    handle.started(askId, askId, stagesKept = true)
    return DurableAsk(askId, handle, replyCodec)
}

suspend fun Node.awaitDurable(promises: Promises, id: String): ByteArray =
    awaitDurable(promises, id, DurableCodec.BYTES)

/** What a durable ask of a closed store throws. */
private fun storeClosed() = AskException.FailedPrecondition("the promise store is closed")

private fun Node.durableHandle(): AskHandle {
    checkOpen()
    return AskHandle(this).also { it.token = completions.register(it) }
}

private inline fun <T> Node.startDurable(handle: AskHandle, start: (Long) -> T): T =
    startOrForget(handle.token) { start(handle.token) }

private fun <R> decode(reply: Any?, codec: DurableCodec<R>): R {
    val bytes = reply as? ByteArray
        ?: throw AskException.DecodeFailure("a durable reply must be bytes, got ${reply?.javaClass?.name}")
    return try {
        codec.decode(bytes)
    } catch (e: Exception) {
        throw AskException.DecodeFailure("${codec.javaClass.name} cannot decode the reply: $e")
    }
}
