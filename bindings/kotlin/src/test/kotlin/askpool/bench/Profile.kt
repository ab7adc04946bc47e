package askpool.bench

import askpool.AskOptions
import askpool.Node
import askpool.NodeOptions
import askpool.PoolOptions
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.launch
import kotlinx.coroutines.newSingleThreadContext
import kotlinx.coroutines.withContext
import java.io.File
import kotlin.time.Duration.Companion.seconds

/**
 * A profiling target, not a benchmark: runs one workload of the `kotlin`
 * bench for a while so `perf` or the per-thread context-switch counts in
 * /proc can be taken from outside. Args: `seq|conc seconds`.
 */
fun main(args: Array<String>) = runBlocking {
    val mode = args.getOrElse(0) { "seq" }
    val seconds = args.getOrElse(1) { "10" }.toLong()
    val node = Node(NodeOptions(trackStages = false, circuitBreaker = false))
    // `one`: caller and pool on one thread, so no hand-off at all: the CPU
    // cost of an ask. `plain`: the bench's baseline on that same thread.
    val one = newSingleThreadContext("one")
    val dispatcher = if (mode == "one") one else Dispatchers.Default
    node.pool("echo", PoolOptions(concurrency = 4, dispatcher = dispatcher)) { msg, _ -> msg }
    val msg = Any()
    val queue = Channel<Pair<Any, CompletableDeferred<Any>>>(Channel.UNLIMITED)
    if (mode == "plain") launch(one) { for ((m, r) in queue) r.complete(m) }
    // `plainconc`: the baseline's 64 callers alone; `mixconc`: the same, each
    // round after a round of askpool asks (does askpool's work slow it?).
    if (mode.endsWith("conc") && mode != "conc") repeat(4) { launch(Dispatchers.Default) { for ((m, r) in queue) r.complete(m) } }
    suspend fun plainConc(n: Int) = coroutineScope {
        (0 until 64).map {
            async(Dispatchers.Default) { repeat(n / 64) { val r = CompletableDeferred<Any>(); queue.send(msg to r); r.await() } }
        }.awaitAll()
    }
    var plainNs = 0L
    val opts = AskOptions(timeout = 30.seconds)
    val mx = java.lang.management.ManagementFactory.getThreadMXBean()
    var cpuNs = 0L
    suspend fun round(n: Int) = when (mode) {
        "seq" -> repeat(n) { node.ask("echo", msg, opts) }
        "plainconc" -> { val t = System.nanoTime(); plainConc(n); plainNs += System.nanoTime() - t }
        "mixconc" -> {
            coroutineScope {
                (0 until 64).map { async(Dispatchers.Default) { repeat(n / 64) { node.ask("echo", msg, opts) } } }.awaitAll()
            }
            val t = System.nanoTime(); plainConc(n); plainNs += System.nanoTime() - t
        }
        "one" -> withContext(one) {
            val cpu0 = mx.currentThreadCpuTime
            repeat(n) { node.ask("echo", msg, opts) }
            cpuNs += mx.currentThreadCpuTime - cpu0
        }
        "plain" -> withContext(one) {
            val cpu0 = mx.currentThreadCpuTime
            repeat(n) { val r = CompletableDeferred<Any>(); queue.send(msg to r); r.await() }
            cpuNs += mx.currentThreadCpuTime - cpu0
        }
        else -> coroutineScope {
            (0 until 64).map { async(Dispatchers.Default) { repeat(n / 64) { node.ask("echo", msg, opts) } } }.awaitAll()
        }
    }
    round(20_000)
    val pid = ProcessHandle.current().pid()
    File("/tmp/askpool-profile.pid").writeText("$pid\n")
    println("READY $pid")
    System.out.flush()
    Thread.sleep(1_000)
    var asks = 0L
    cpuNs = 0
    plainNs = 0
    val os = java.lang.management.ManagementFactory.getOperatingSystemMXBean() as com.sun.management.OperatingSystemMXBean
    val processCpu0 = os.processCpuTime
    val start = System.nanoTime()
    val end = start + seconds * 1_000_000_000
    while (System.nanoTime() < end) {
        round(6_400)
        asks += 6_400
    }
    val ns = (System.nanoTime() - start).toDouble() / asks
    val processNs = (os.processCpuTime - processCpu0).toDouble() / asks
    println("DONE $mode asks=$asks ns/ask=%.0f process cpu ns/ask=%.0f cpu ns/ask (asking thread)=%.0f baseline ns/ask=%.0f".format(ns, processNs, cpuNs.toDouble() / asks, plainNs.toDouble() / asks))
    node.close()
    one.close()
    System.exit(0)
}
