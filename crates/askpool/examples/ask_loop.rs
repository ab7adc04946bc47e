//! A tight loop of sequential asks, for profilers:
//! `cargo build --release -p askpool --example ask_loop &&
//!  perf record -g target/release/examples/ask_loop 200000`.
//! `ASK_LOOP_TRACK=1` turns ACK stage tracking on (the node default);
//! `ASK_LOOP_MT=1` runs on a multi_thread runtime with 2 workers;
//! `ASK_LOOP_CALLERS=64` splits the asks over that many concurrent caller
//! tasks (contention on the pool's shared state), `ASK_LOOP_CONCURRENCY=4`
//! gives the pool that many workers. For attributing costs:
//! `ASK_LOOP_CAP=1000` shrinks the reply cache (100,000 by default: at
//! capacity every request evicts a cold entry), `ASK_LOOP_NOBREAKER=1`
//! turns the circuit breakers off.

use askpool::{Node, NodeConfig};
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(300_000);
    let rt = if std::env::var_os("ASK_LOOP_MT").is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .unwrap();
    // The loop runs in a runtime task, as in the ask bench.
    let main = rt.spawn(async move {
        let node: Node<u64, u64> = Node::with_config(NodeConfig {
            track_stages: std::env::var_os("ASK_LOOP_TRACK").is_some(),
            breaker: if std::env::var_os("ASK_LOOP_NOBREAKER").is_some() {
                None
            } else {
                NodeConfig::default().breaker
            },
            ..NodeConfig::default()
        });
        let concurrency = std::env::var("ASK_LOOP_CONCURRENCY").map_or(1, |s| s.parse().unwrap());
        node.pool("p")
            .concurrency(concurrency)
            .dedup(askpool_dedup::DedupConfig {
                max_terminal: std::env::var("ASK_LOOP_CAP").map_or(100_000, |s| s.parse().unwrap()),
                ..Default::default()
            })
            .handler(|m: u64, _ctx| async move { Ok(m + 1) })
            .unwrap();
        let callers: u64 = std::env::var("ASK_LOOP_CALLERS")
            .map(|s| s.parse().unwrap())
            .unwrap_or(1);
        let t = std::time::Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let node = node.clone();
                tokio::spawn(async move {
                    for i in 0..n / callers {
                        let r = node.ask("p", i).await.unwrap();
                        assert_eq!(r, i + 1);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        println!("{:?} per ask", t.elapsed() / n as u32);
    });
    rt.block_on(main).unwrap();
}
