//! The DLQ depth gauge: the dead letters of every node of the process. In
//! a test binary of its own, as the gauge is the process's total (other
//! tests filing letters at the same time would move it).

use std::collections::HashMap;

use askpool::{Node, NodeConfig, RetryPolicy};
use askpool_tests::paused_runtime;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// The gauge's value as `work` left it, with a fresh recorder as the
/// recorder meanwhile (`None`: not set).
fn gauge_after<T>(
    runtime: &tokio::runtime::Runtime,
    work: impl std::future::Future<Output = T>,
) -> (T, Option<f64>) {
    let recorder = DebuggingRecorder::new();
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(work));
    let values: HashMap<String, DebugValue> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_string(), value))
        .collect();
    let gauge = match values.get("askpool_dlq_depth") {
        Some(DebugValue::Gauge(g)) => Some(g.into_inner()),
        _ => None,
    };
    (out, gauge)
}

/// A node whose pool "full" is full for good, and whose asks are not
/// re-sent: each further ask is dead-lettered at once.
async fn node_with_a_full_pool() -> (Node<u64, u64>, askpool::AskHandle<u64, u64>) {
    let node: Node<u64, u64> = Node::with_config(NodeConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..NodeConfig::default()
    });
    node.pool("full")
        .max_in_flight(1)
        .handler(|m: u64, _ctx| async move {
            std::future::pending::<()>().await;
            Ok(m)
        })
        .unwrap();
    let stuck = node.ask("full", 0).send();
    tokio::task::yield_now().await;
    (node, stuck)
}

/// Each node adds and removes its own letters, a node dropped takes its
/// letters out, and a recorder installed after letters were filed reads
/// the true total (the gauge was set to one node's length, then moved by
/// deltas that went negative).
#[test]
fn the_dlq_gauge_is_every_nodes_letters_whenever_the_recorder_came() {
    let runtime = paused_runtime();
    // Filed with no recorder installed.
    let early = runtime.block_on(async {
        let early = node_with_a_full_pool().await;
        for i in 1..=3 {
            early.0.ask("full", i).await.unwrap_err();
        }
        early
    });
    let ((a, b), gauge) = gauge_after(&runtime, async {
        let a = node_with_a_full_pool().await;
        let b = node_with_a_full_pool().await;
        for i in 1..=3 {
            a.0.ask("full", i).await.unwrap_err();
        }
        b.0.ask("full", 9).await.unwrap_err();
        assert_eq!((a.0.stats().dlq_depth, b.0.stats().dlq_depth), (3, 1));
        // An empty node's purge: another node's letters stay counted.
        let c = node_with_a_full_pool().await;
        assert_eq!(c.0.purge_dead_letters(), 0);
        (a, b)
    });
    assert_eq!(gauge, Some(3.0 + 3.0 + 1.0));
    let (_, gauge) = gauge_after(&runtime, async move {
        assert_eq!(b.0.purge_dead_letters(), 1);
        drop(a);
        assert_eq!(early.0.purge_dead_letters(), 3);
    });
    assert_eq!(gauge, Some(0.0), "one purged, three dropped, three purged");
}
