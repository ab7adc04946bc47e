package askpool.bench

import askpool.AskOptions
import askpool.Node
import askpool.NodeOptions
import askpool.PoolOptions
import askpool.TellOptions
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlin.time.Duration.Companion.seconds

/**
 * The per-call cost of `send().await()` and `tell()` against a plain
 * `ask`, one caller, in one JVM: the ratios a review once found at 30x.
 * Args: `[calls per trial] [trials]`. Run with
 * `mvn -f bindings/kotlin/pom.xml -Daskpool.lib.dir=... -Dbench.main=askpool.bench.TellCostKt exec:java`.
 */
fun main(args: Array<String>) = runBlocking {
    val n = args.getOrElse(0) { "3000" }.toInt()
    val trials = args.getOrElse(1) { "7" }.toInt()
    val node = Node(NodeOptions())
    node.pool("echo", PoolOptions(concurrency = 4)) { msg, _ -> msg }
    // What keeping each handle's stage record costs a send.
    val untracked = Node(NodeOptions(trackStages = false))
    untracked.pool("echo", PoolOptions(concurrency = 4)) { msg, _ -> msg }
    val msg = Any()
    val opts = AskOptions(timeout = 30.seconds)
    val tellOpts = TellOptions(timeout = 30.seconds)
    val candidates: List<Pair<String, suspend () -> Unit>> = listOf(
        "ask" to { node.ask("echo", msg, opts) },
        "send+await" to { node.send("echo", msg, opts).await() },
        "tell" to { node.tell("echo", msg, tellOpts) },
        "send+await, stages untracked" to { untracked.send("echo", msg, opts).await() },
    )
    val out = candidates.map { mutableListOf<Double>() }
    withContext(Dispatchers.Default) {
        // Warm-up: the JIT and the runtime's attached threads.
        val warmEnd = System.nanoTime() + 5_000_000_000
        while (System.nanoTime() < warmEnd) for ((_, c) in candidates) repeat(n / 4) { c() }
        for (t in 0 until trials) {
            for (k in candidates.indices) {
                val i = (t + k) % candidates.size
                val start = System.nanoTime()
                repeat(n) { candidates[i].second() }
                out[i].add((System.nanoTime() - start).toDouble() / n)
            }
        }
    }
    fun median(v: List<Double>) = v.sorted()[v.size / 2]
    val askNs = out[0]
    for ((i, c) in candidates.withIndex()) {
        val ratios = out[i].zip(askNs) { a, b -> a / b }
        println("COST %-30s %9.0f ns/call  ratio to ask %6.2fx (%.2f..%.2f)".format(
            c.first, median(out[i]), median(ratios), ratios.min(), ratios.max()))
    }
    node.close()
    untracked.close()
    System.exit(0)
}
