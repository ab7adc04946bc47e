package askpool

/** FFI cost probes for the `kotlin` bench (floors of the report). */
object Probes {
    /** One hot-path crossing (JNA direct mapping, primitives). */
    fun hot(x: Long): Long = Hot.askpool_hot_probe(x)

    /** `n` uniffi callbacks Rust -> Kotlin, made on the calling thread. */
    fun callbacks(n: Int) = askpool.ffi.ffiProbeCallbacks(sink, n.toUInt())

    private val sink = object : askpool.ffi.AskListener {
        override fun onReplyBytes(token: Long, data: ByteArray) {}
        override fun onTold(token: Long) {}
        override fun onFailure(token: Long, failure: askpool.ffi.Failure) {}
        override fun onStage(token: Long, stage: askpool.ffi.Stage) {}
        override fun onStagesEnd(token: Long) {}
    }
}
