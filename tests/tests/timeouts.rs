//! TimeoutConfig: delivery and read deadlines at the caller, the processing
//! timeout at the pool, and the rule that nothing stays in flight forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, CancelReason, ErrorCode, Node, NodeConfig, PoolConfig, TimeoutConfig, WorkerTransport,
};
use askpool_tests::{Fate, FrameKind, Tap};

type TestNode = Node<u64, String>;

fn tapped(config: NodeConfig) -> (Arc<Tap<u64, String>>, TestNode) {
    let tap = Tap::in_process();
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    (tap.clone(), Node::with_transport(transport, config))
}

#[tokio::test(start_paused = true)]
async fn no_ack_within_the_delivery_timeout_is_deadline_exceeded() {
    let (tap, node) = tapped(NodeConfig::default());
    let _pool = node.pool("p").build().unwrap();
    tap.set_rule(|f| match f.kind {
        FrameKind::Request => Fate::Drop,
        _ => Fate::Deliver,
    });
    let started = tokio::time::Instant::now();
    let err = node.ask("p", 1).await.unwrap_err();
    assert_eq!(err, AskError::DeadlineExceeded);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "the default delivery timeout"
    );
    assert_eq!(tap.sent(FrameKind::Cancel).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn no_read_within_the_read_timeout_is_deadline_exceeded() {
    let (_tap, node) = tapped(NodeConfig {
        timeouts: TimeoutConfig {
            read: Some(Duration::from_secs(2)),
            ..TimeoutConfig::default()
        },
        ..NodeConfig::default()
    });
    // Admitted (acked) but never pulled by a worker.
    let pool = node.pool("p").build().unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(
        node.ask("p", 1).await.unwrap_err(),
        AskError::DeadlineExceeded
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(pool.stats().in_flight, 0, "the cancel reached the pool");
}

#[tokio::test(start_paused = true)]
async fn the_processing_timeout_cancels_a_slow_handler() {
    let (tap, node) = tapped(NodeConfig::default());
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let s = saw_cancel.clone();
    node.pool("p")
        .config(PoolConfig {
            processing_timeout: Some(Duration::from_secs(1)),
            ..PoolConfig::default()
        })
        .handler(move |_m: u64, ctx| {
            let s = s.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                s.store(ctx.is_cancelled(), Ordering::SeqCst);
                Ok("too late".to_string())
            }
        })
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = node
        .ask("p", 1)
        .timeout(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AskError::AskCancelled {
            reason: CancelReason::ProcessingTimeout
        }
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        saw_cancel.load(Ordering::SeqCst),
        "the handler could see it"
    );
    assert!(
        tap.sent(FrameKind::Reply).is_empty(),
        "its late reply was suppressed"
    );
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!((pool.expired, pool.in_flight, pool.expiry_index), (1, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_caller_is_gone_leaves_the_pool_at_its_processing_timeout() {
    let (tap, node) = tapped(NodeConfig::default());
    // Never pulled, and the caller's cancel is lost: only the pool's own
    // clock can end it.
    let pool = node
        .pool("p")
        .config(PoolConfig {
            processing_timeout: Some(Duration::from_secs(5)),
            ..PoolConfig::default()
        })
        .build()
        .unwrap();
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        _ => Fate::Deliver,
    });
    let err = node
        .ask("p", 1)
        .timeout(Duration::from_secs(3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AskTimeout);
    assert_eq!(
        pool.stats().in_flight,
        1,
        "still there after the caller gave up"
    );
    tokio::time::sleep(Duration::from_millis(2_001)).await;
    let stats = pool.stats();
    assert_eq!(
        (stats.in_flight, stats.expired, stats.expiry_index),
        (0, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_processing_is_bounded_at_five_minutes() {
    let node: TestNode = Node::new();
    let pool = node.pool("p").build().unwrap();
    let _ask = tokio::spawn(node.ask("p", 1).timeout(Duration::from_secs(600)).send());
    tokio::time::sleep(Duration::from_secs(299)).await;
    assert_eq!(pool.stats().in_flight, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((pool.stats().in_flight, pool.stats().expired), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn the_expiry_index_returns_to_empty() {
    let node: TestNode = Node::new();
    node.pool("p")
        .concurrency(4)
        .handler(|m: u64, _ctx| async move { Ok(m.to_string()) })
        .unwrap();
    for i in 0..1_000 {
        node.ask("p", i).await.unwrap();
    }
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!((pool.expiry_index, pool.expired), (0, 0));
}

/// Ask deadlines wait in the node's deadline queue, whose sweeper task runs
/// on the runtime that first needed it. A node that outlives that runtime
/// starts a new sweeper on the next one: its asks still time out.
#[test]
fn ask_deadlines_fire_after_the_sweepers_runtime_is_gone() {
    let node = TestNode::new();
    // A pool nobody pulls from: its asks are acknowledged and then wait for
    // nothing but their deadline.
    let _pool = node.pool("idle").build().unwrap();
    let ask_once = |id: u64| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let node = node.clone();
        rt.block_on(async move {
            let ask = node.ask("idle", id).timeout(Duration::from_millis(20));
            tokio::time::timeout(Duration::from_secs(10), ask).await
        })
    };
    for id in 0..3 {
        let outcome = ask_once(id).expect("the deadline fired, not the test's guard");
        assert!(
            matches!(outcome, Err(AskError::AskTimeout { .. })),
            "{outcome:?}"
        );
    }
    let stats = node.stats();
    assert_eq!((stats.pending, stats.armed_timers), (0, 0));
}
