//! The metrics of DESIGN section 4 after a scripted run, read back through
//! a debugging recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, BreakerConfig, DedupConfig, Node, NodeConfig, RequestId, RetryPolicy, WorkerTransport,
};
use askpool_tests::paused_runtime;
use askpool_tests::{Fate, FrameKind, Tap};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

type Key = (MetricKind, String, Vec<(String, String)>);

fn snapshot(recorder: &DebuggingRecorder) -> HashMap<Key, DebugValue> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            ((kind, key.name().to_string(), labels), value)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn counter(s: &HashMap<Key, DebugValue>, name: &str, pairs: &[(&str, &str)]) -> u64 {
    match s.get(&(MetricKind::Counter, name.to_string(), labels(pairs))) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{name}: {other:?}"),
    }
}

fn gauge(s: &HashMap<Key, DebugValue>, name: &str) -> f64 {
    match s.get(&(MetricKind::Gauge, name.to_string(), vec![])) {
        Some(DebugValue::Gauge(g)) => g.into_inner(),
        other => panic!("{name}: {other:?}"),
    }
}

fn histogram_count(s: &HashMap<Key, DebugValue>, name: &str, pairs: &[(&str, &str)]) -> usize {
    match s.get(&(MetricKind::Histogram, name.to_string(), labels(pairs))) {
        Some(DebugValue::Histogram(v)) => v.len(),
        None => 0,
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn metrics_after_a_scripted_run() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(scripted_run());
    });
    let s = snapshot(&recorder);
    let acks = |stage, code| {
        counter(
            &s,
            "askpool_acks_sent_total",
            &[("stage", stage), ("code", code)],
        )
    };
    // Seven asks were admitted; each was acked and read once.
    assert_eq!(acks("RECEIVED", "OK"), 7);
    assert_eq!(acks("READ", "OK"), 7);
    // Four live replies and one replay.
    assert_eq!(acks("FULFILLED", "OK"), 5);
    assert_eq!(acks("FAILED", "HANDLER_FAILED"), 1);
    // The timed-out ask's cancel was answered AskCancelled.
    assert_eq!(acks("FAILED", "ASK_CANCELLED"), 1);
    // The pool's own processing timeout is TIMED_OUT, as the caller's
    // stage says.
    assert_eq!(acks("TIMED_OUT", "ASK_CANCELLED"), 1);
    assert_eq!(counter(&s, "askpool_retries_total", &[]), 1);
    assert_eq!(
        counter(&s, "askpool_timeouts_total", &[("code", "ASK_TIMEOUT")]),
        1
    );
    // The pool's processing timeout, counted as its breaker counts it.
    assert_eq!(
        counter(
            &s,
            "askpool_timeouts_total",
            &[("code", "DEADLINE_EXCEEDED")]
        ),
        1
    );
    assert_eq!(
        counter(&s, "askpool_dedup_hits_total", &[("kind", "replay")]),
        1
    );
    assert_eq!(counter(&s, "askpool_late_outcomes_total", &[]), 0);
    assert_eq!(gauge(&s, "askpool_pending_acks"), 0.0);
    assert_eq!(
        gauge(&s, "askpool_dlq_depth"),
        0.0,
        "the timeout was dead-lettered, and its node is gone with it"
    );
    let latency = "askpool_end_to_end_latency_seconds";
    assert_eq!(histogram_count(&s, latency, &[("outcome", "ok")]), 5);
    assert_eq!(
        histogram_count(&s, latency, &[("outcome", "HANDLER_FAILED")]),
        1
    );
    assert_eq!(
        histogram_count(&s, latency, &[("outcome", "ASK_TIMEOUT")]),
        1
    );
    let stage = "askpool_ack_stage_duration_seconds";
    assert_eq!(histogram_count(&s, stage, &[("stage", "READ")]), 7);
    assert_eq!(histogram_count(&s, stage, &[("stage", "TIMED_OUT")]), 2);
}

fn labelled_gauge(s: &HashMap<Key, DebugValue>, name: &str, pairs: &[(&str, &str)]) -> f64 {
    match s.get(&(MetricKind::Gauge, name.to_string(), labels(pairs))) {
        Some(DebugValue::Gauge(g)) => g.into_inner(),
        other => panic!("{name} {pairs:?}: {other:?}"),
    }
}

/// The breaker's state gauge follows it open and closed again; the reply
/// cache's evictions are published (by `Node::stats`) per reason.
#[test]
fn breaker_state_and_dedup_evictions() {
    // One recorder per phase: a snapshot resets every gauge to 0, so a
    // gauge read from a second snapshot of one recorder is 0 whether or not
    // it was set to 0 meanwhile. A fresh recorder holds only what was set
    // while it was the recorder.
    let runtime = paused_runtime();
    let (node, open) = in_recorder(&runtime, async {
        let node: Node<u64, u64> = breaking_node(4, Duration::from_secs(1));
        node.pool("flaky")
            .dedup(DedupConfig {
                max_terminal: 2,
                ..DedupConfig::default()
            })
            .handler(|m: u64, _ctx| async move {
                if m == 0 {
                    Err(AskError::internal("down"))
                } else {
                    Ok(m)
                }
            })
            .unwrap();
        for _ in 0..4 {
            node.ask("flaky", 0).await.unwrap_err();
        }
        node
    });
    let (_, closed) = in_recorder(&runtime, async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        for m in 1..=3 {
            node.ask("flaky", m).await.unwrap();
        }
        node.stats();
    });
    let state = |s: &HashMap<Key, DebugValue>| {
        labelled_gauge(s, "askpool_breaker_state", &[("pool", "flaky")])
    };
    assert_eq!(state(&open), 1.0, "open after four failures");
    assert_eq!(state(&closed), 0.0, "closed after a good probe");
    // Seven requests through a cache of two terminal entries.
    assert_eq!(
        counter(
            &closed,
            "askpool_dedup_evictions_total",
            &[("reason", "capacity")]
        ),
        5
    );
}

/// A node whose breakers open when half of at least `min_requests` asks
/// failed, for `open_for`, then let one probe through.
fn breaking_node(min_requests: u32, open_for: Duration) -> Node<u64, u64> {
    Node::with_config(NodeConfig {
        breaker: Some(BreakerConfig {
            min_requests,
            failure_rate: 0.5,
            open_for,
            half_open_probes: 1,
            ..BreakerConfig::default()
        }),
        ..NodeConfig::default()
    })
}

/// Runs `work` on `runtime` with a fresh debugging recorder as the
/// recorder; its output, and what was recorded meanwhile.
fn in_recorder<T>(
    runtime: &tokio::runtime::Runtime,
    work: impl std::future::Future<Output = T>,
) -> (T, HashMap<Key, DebugValue>) {
    let recorder = DebuggingRecorder::new();
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(work));
    (out, snapshot(&recorder))
}

async fn scripted_run() {
    let tap = Tap::in_process();
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(
        transport,
        NodeConfig {
            retry: RetryPolicy {
                initial_delay: Duration::from_millis(50),
                jitter: 0.0,
                ..RetryPolicy::default()
            },
            ..NodeConfig::default()
        },
    );
    node.pool("p")
        .handler(|msg: u64, _ctx| async move {
            match msg {
                13 => Err(AskError::handler_failed("Bad", "thirteen")),
                99 => {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok("slow".to_string())
                }
                _ => Ok(format!("ok {msg}")),
            }
        })
        .unwrap();
    let first = RequestId::from_parts(1, 1);
    node.ask("p", 1).request_id(first).await.unwrap();
    node.ask("p", 2).await.unwrap();
    node.ask("p", 3).await.unwrap();
    node.ask("p", 13).await.unwrap_err();
    node.ask("p", 99)
        .timeout(Duration::from_secs(1))
        .await
        .unwrap_err();
    // The first request frame of ask 5 is lost: one retry.
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    tap.set_rule(move |f| match f.kind {
        FrameKind::Request if d.fetch_add(1, Ordering::SeqCst) == 0 => Fate::Drop,
        _ => Fate::Deliver,
    });
    node.ask("p", 5).await.unwrap();
    tap.set_rule(|_| Fate::Deliver);
    // A duplicate of the first ask, answered from the cache.
    node.ask("p", 1).request_id(first).await.unwrap();
    // A pool that gives up at its processing deadline: a timeout.
    node.pool("hung")
        .config(askpool::PoolConfig {
            processing_timeout: Some(Duration::from_millis(100)),
            ..askpool::PoolConfig::default()
        })
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    assert_eq!(
        node.ask("hung", 7).await.unwrap_err().code(),
        askpool::ErrorCode::AskCancelled
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
}

/// A node made under a recorder describes the metrics to it (help text and
/// units), whichever recorder came before.
#[test]
fn every_recorder_a_node_is_made_under_gets_the_descriptions() {
    let runtime = paused_runtime();
    for _ in 0..2 {
        let recorder = DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let node: Node<u64, u64> = Node::new();
                node.pool("p")
                    .handler(|m: u64, _ctx| async move { Ok(m) })
                    .unwrap();
                node.ask("p", 1).await.unwrap();
            })
        });
        let described = recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| key.key().name() == "askpool_end_to_end_latency_seconds")
            .map(|(_, unit, description, _)| (unit, description.map(|d| d.to_string())));
        assert_eq!(
            described,
            Some((
                Some(metrics::Unit::Seconds),
                Some("Time from sending an ask to its outcome".to_string())
            ))
        );
    }
}

/// Evictions are counted over every node: each publishes what it added.
#[test]
fn dedup_evictions_sum_every_node() {
    let runtime = paused_runtime();
    let (_, s) = in_recorder(&runtime, async {
        for (asks, stats_calls) in [(6, 2), (3, 1)] {
            let node: Node<u64, u64> = Node::new();
            node.pool("p")
                .dedup(DedupConfig {
                    max_terminal: 1,
                    ..DedupConfig::default()
                })
                .handler(|m: u64, _ctx| async move { Ok(m) })
                .unwrap();
            for m in 0..asks {
                node.ask("p", m).await.unwrap();
            }
            for _ in 0..stats_calls {
                node.stats();
            }
        }
    });
    assert_eq!(
        counter(
            &s,
            "askpool_dedup_evictions_total",
            &[("reason", "capacity")]
        ),
        5 + 2
    );
}

/// Between Open and Closed the breaker's gauge reads 2 (half-open): a probe
/// is in flight.
#[test]
fn the_breaker_gauge_shows_half_open() {
    let runtime = paused_runtime();
    let (node, _) = in_recorder(&runtime, async {
        let node: Node<u64, u64> = breaking_node(2, Duration::from_secs(1));
        node.pool("flaky")
            .handler(|m: u64, _ctx| async move {
                match m {
                    0 => Err(AskError::internal("down")),
                    _ => {
                        std::future::pending::<()>().await;
                        Ok(m)
                    }
                }
            })
            .unwrap();
        for _ in 0..2 {
            node.ask("flaky", 0).await.unwrap_err();
        }
        node
    });
    let (_probe, s) = in_recorder(&runtime, async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let probe = node.ask("flaky", 1).send();
        tokio::task::yield_now().await;
        // Kept in flight until the snapshot (an Option: not awaitable).
        Some(probe)
    });
    assert_eq!(
        labelled_gauge(&s, "askpool_breaker_state", &[("pool", "flaky")]),
        2.0
    );
}

/// Every ask's outcome is in the end-to-end latency: refused at once (an
/// open breaker), cancelled or dropped by its caller. A tell's is not (it
/// ends at RECEIVED; the latency is send to FULFILLED).
#[test]
fn end_to_end_counts_refusals_and_cancels_but_not_tells() {
    let runtime = paused_runtime();
    let (_, s) = in_recorder(&runtime, async {
        let node: Node<u64, u64> = breaking_node(2, Duration::from_secs(60));
        node.pool("slow")
            .handler(|m: u64, _ctx| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(m)
            })
            .unwrap();
        node.tell("slow", 1).await.unwrap();
        let mut cancelled = node.ask("slow", 2).send();
        cancelled.cancel();
        cancelled.await.unwrap_err();
        drop(node.ask("slow", 3).send());
        node.pool("down")
            .handler(|_m: u64, _ctx| async move { Err(AskError::internal("down")) })
            .unwrap();
        for _ in 0..2 {
            node.ask("down", 0).await.unwrap_err();
        }
        let refused = node.ask("down", 0).await.unwrap_err();
        assert_eq!(refused.code(), askpool::ErrorCode::Unavailable);
        tokio::time::sleep(Duration::from_secs(2)).await;
    });
    let latency = "askpool_end_to_end_latency_seconds";
    assert_eq!(histogram_count(&s, latency, &[("outcome", "ok")]), 0);
    assert_eq!(
        histogram_count(&s, latency, &[("outcome", "ASK_CANCELLED")]),
        2
    );
    assert_eq!(
        histogram_count(&s, latency, &[("outcome", "UNAVAILABLE")]),
        1
    );
    assert_eq!(histogram_count(&s, latency, &[("outcome", "INTERNAL")]), 2);
}
