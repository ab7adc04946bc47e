//! A tight loop of sequential asks, for profilers:
//! `cargo build --release -p askpool --example ask_loop &&
//!  perf record -g target/release/examples/ask_loop 200000`.
//! `ASK_LOOP_TRACK=1` turns ACK stage tracking on (the node default);
//! `ASK_LOOP_MT=1` runs on a multi_thread runtime with 2 workers.

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
            ..NodeConfig::default()
        });
        node.pool("p")
            .handler(|m: u64, _ctx| async move { Ok(m + 1) })
            .unwrap();
        let t = std::time::Instant::now();
        for i in 0..n {
            let r = node.ask("p", i).await.unwrap();
            assert_eq!(r, i + 1);
        }
        println!("{:?} per ask", t.elapsed() / n as u32);
    });
    rt.block_on(main).unwrap();
}
