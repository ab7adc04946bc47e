//! Per-pool circuit breakers at the caller: open on failures, fail fast,
//! probe when half-open, close again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, BreakerConfig, BreakerState, CodeSet, ErrorCode, Node, NodeConfig, RetryPolicy,
    WorkerTransport,
};
use askpool_tests::{FrameKind, Tap};

type TestNode = Node<u64, String>;

fn breaker() -> BreakerConfig {
    BreakerConfig {
        window: Duration::from_secs(10),
        buckets: 10,
        min_requests: 4,
        failure_rate: 0.5,
        open_for: Duration::from_secs(5),
        half_open_probes: 1,
        open_on: CodeSet::EMPTY,
    }
}

/// A node whose pool "p" fails while `failing` is set, and counts its runs.
type Setup = (
    Arc<Tap<u64, String>>,
    TestNode,
    Arc<AtomicBool>,
    Arc<AtomicUsize>,
);

fn setup(config: Option<BreakerConfig>) -> Setup {
    let tap = Tap::in_process();
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::try_with_transport(
        transport,
        NodeConfig {
            retry: RetryPolicy::no_retry(),
            breaker: config,
            ..NodeConfig::default()
        },
    )
    .unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let (f, r) = (failing.clone(), runs.clone());
    node.pool("p")
        .handler(move |msg: u64, _ctx| {
            r.fetch_add(1, Ordering::SeqCst);
            let fail = f.load(Ordering::SeqCst);
            async move {
                match (fail, msg) {
                    (true, 99) => Err(AskError::PermissionDenied {
                        message: "no".into(),
                    }),
                    (true, _) => Err(AskError::internal("db down")),
                    (false, _) => Ok("ok".to_string()),
                }
            }
        })
        .unwrap();
    (tap, node, failing, runs)
}

#[tokio::test(start_paused = true)]
async fn failures_open_the_breaker_and_asks_fail_fast() {
    let (tap, node, _failing, runs) = setup(Some(breaker()));
    for i in 0..4 {
        assert_eq!(
            node.ask("p", i).await.unwrap_err().code(),
            ErrorCode::Internal
        );
    }
    let stats = node.stats();
    let b = stats.breaker("p").unwrap();
    assert_eq!((b.state, b.trips), (BreakerState::Open, 1));
    tap.clear();
    let err = node.ask("p", 5).await.unwrap_err();
    assert!(
        matches!(&err, AskError::Unavailable { reason } if reason.contains("circuit open")),
        "{err}"
    );
    assert!(tap.sent(FrameKind::Request).is_empty(), "nothing was sent");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(node.stats().breaker("p").unwrap().rejections, 1);
    assert_eq!(node.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn half_open_probes_close_it_again_or_reopen_it() {
    let (_tap, node, failing, _runs) = setup(Some(breaker()));
    for i in 0..4 {
        node.ask("p", i).await.unwrap_err();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::HalfOpen
    );
    // A failed probe opens it again.
    assert_eq!(
        node.ask("p", 1).await.unwrap_err().code(),
        ErrorCode::Internal
    );
    assert_eq!(node.stats().breaker("p").unwrap().state, BreakerState::Open);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // While one probe is out, a second ask is refused.
    failing.store(false, Ordering::SeqCst);
    let probe = node.ask("p", 2).send();
    assert_eq!(
        node.ask("p", 3).await.unwrap_err().code(),
        ErrorCode::Unavailable
    );
    assert_eq!(probe.await.unwrap(), "ok");
    assert_eq!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::Closed
    );
    assert_eq!(node.ask("p", 4).await.unwrap(), "ok");
}

#[tokio::test(start_paused = true)]
async fn a_listed_code_opens_it_at_once_and_permanent_errors_do_not_count() {
    let (_tap, node, _failing, _runs) = setup(Some(BreakerConfig {
        open_on: CodeSet::of(&[ErrorCode::PermissionDenied]),
        ..breaker()
    }));
    // Payload mismatches are the caller's fault: not counted.
    let id = askpool::RequestId::from_parts(1, 1);
    for fp in [1u128, 2, 3, 4, 5] {
        let _ = node
            .ask("p", 0)
            .request_id(id)
            .fingerprint(askpool::PayloadFingerprint::from_u128(fp))
            .await;
    }
    assert_eq!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::Closed
    );
    node.ask("p", 99).await.unwrap_err();
    assert_eq!(node.stats().breaker("p").unwrap().state, BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn cancelled_asks_release_their_permit() {
    let (_tap, node, failing, _runs) = setup(Some(BreakerConfig {
        half_open_probes: 1,
        ..breaker()
    }));
    for i in 0..4 {
        node.ask("p", i).await.unwrap_err();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    failing.store(false, Ordering::SeqCst);
    // The probe is dropped before it ends: its permit must come back.
    drop(node.ask("p", 1).send());
    assert_eq!(node.ask("p", 2).await.unwrap(), "ok");
}

#[tokio::test(start_paused = true)]
async fn without_a_breaker_nothing_fails_fast() {
    let (_tap, node, _failing, runs) = setup(None);
    for i in 0..20 {
        assert_eq!(
            node.ask("p", i).await.unwrap_err().code(),
            ErrorCode::Internal
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20);
    assert!(node.stats().breakers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_invalid_breaker_config_is_a_typed_error() {
    let transport: Arc<dyn WorkerTransport<u64, String>> =
        Arc::new(askpool::InProcessTransport::new());
    let err = Node::try_with_transport(
        transport,
        NodeConfig {
            breaker: Some(BreakerConfig {
                failure_rate: 2.0,
                ..breaker()
            }),
            ..NodeConfig::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[tokio::test(start_paused = true)]
async fn asks_to_pools_that_do_not_exist_create_no_breakers() {
    let (_tap, node, _failing, _runs) = setup(Some(breaker()));
    for i in 0..100 {
        let err = node.ask(format!("nowhere-{i}"), 1).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NoRoute);
    }
    assert!(node.stats().breakers.is_empty());
}

#[tokio::test(start_paused = true)]
async fn asks_started_before_the_breaker_existed_still_count_their_successes() {
    let (_tap, node, failing, _runs) = setup(Some(breaker()));
    failing.store(false, Ordering::SeqCst);
    // Many asks in flight, none with a permit: the pool has no breaker yet.
    let pool = node.pool("slow").build().unwrap();
    let handles: Vec<_> = (0..16).map(|i| node.ask("slow", i).send()).collect();
    let mut requests = Vec::new();
    for _ in 0..16 {
        requests.push(pool.next_request().await.unwrap());
    }
    // Every fourth fails, the first one first (creating the breaker): 4
    // failures in 16 is 25 %, under the 50 % that opens it. Counting only
    // the failures would see 100 %.
    for (i, r) in requests.into_iter().enumerate() {
        if i % 4 == 0 {
            r.fail(AskError::internal("bad"));
        } else {
            r.reply("ok".into());
        }
    }
    let mut ok = 0;
    for h in handles {
        ok += usize::from(h.await.is_ok());
    }
    assert_eq!(ok, 12);
    let b = node.stats().breaker("slow").cloned().unwrap();
    assert_eq!(
        b.state,
        BreakerState::Closed,
        "4 failures in 16 must not open it"
    );
}

#[tokio::test(start_paused = true)]
async fn successes_before_the_first_failure_count() {
    let (_tap, node, failing, _runs) = setup(Some(breaker()));
    failing.store(false, Ordering::SeqCst);
    for i in 0..20 {
        node.ask("p", i).await.unwrap();
    }
    failing.store(true, Ordering::SeqCst);
    // 10 failures after 20 successes: 33 %, under the 50 % that opens it.
    for i in 0..10 {
        node.ask("p", i).await.unwrap_err();
    }
    assert_eq!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::Closed
    );
}

/// An ask that started before its pool had a breaker holds no permit. Its
/// outcome, once the breaker has opened since, is from before: it must not
/// count as the half-open probe no one sent (it closed the breaker).
#[tokio::test(start_paused = true)]
async fn an_ask_from_before_the_breaker_is_no_probe() {
    let node: TestNode = Node::with_config(NodeConfig {
        retry: RetryPolicy::no_retry(),
        breaker: Some(BreakerConfig {
            min_requests: 100,
            open_on: CodeSet::of(&[ErrorCode::Internal]),
            ..breaker()
        }),
        ..NodeConfig::default()
    });
    let gate = Arc::new(tokio::sync::Notify::new());
    let opened = Arc::clone(&gate);
    node.pool("p")
        .concurrency(4)
        .handler(move |msg: u64, _ctx| {
            let gate = Arc::clone(&opened);
            async move {
                match msg {
                    0 => {
                        gate.notified().await;
                        Ok("slow".to_string())
                    }
                    1 => Err(AskError::internal("db down")),
                    _ => Ok("fine".to_string()),
                }
            }
        })
        .unwrap();
    let slow = tokio::spawn(node.ask("p", 0).timeout(Duration::from_secs(60)).send());
    tokio::task::yield_now().await;
    assert!(node.stats().breaker("p").is_none(), "no outcome yet");
    assert_eq!(
        node.ask("p", 1).await.unwrap_err().code(),
        ErrorCode::Internal
    );
    assert_eq!(node.stats().breaker("p").unwrap().state, BreakerState::Open);
    tokio::time::advance(Duration::from_secs(6)).await;
    gate.notify_one();
    assert_eq!(slow.await.unwrap().unwrap(), "slow");
    assert_ne!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::Closed,
        "closed by an ask sent before it opened"
    );
    // A real probe still closes it.
    assert_eq!(node.ask("p", 2).await.unwrap(), "fine");
    assert_eq!(
        node.stats().breaker("p").unwrap().state,
        BreakerState::Closed
    );
}

/// A request the pool cancels at its processing timeout timed out in the
/// pool: it counts toward the breaker as a timeout, so a pool whose
/// handlers hang trips its callers' breakers. The caller's own cancels
/// still count for nothing.
#[tokio::test(start_paused = true)]
async fn processing_timeouts_trip_the_breaker() {
    let node: TestNode = Node::with_config(NodeConfig {
        retry: RetryPolicy::no_retry(),
        breaker: Some(breaker()),
        ..NodeConfig::default()
    });
    node.pool("p")
        .config(askpool::PoolConfig {
            concurrency: 8,
            processing_timeout: Some(Duration::from_millis(100)),
            ..askpool::PoolConfig::default()
        })
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    // Cancelled by their caller: not counted.
    for i in 0..8 {
        let mut handle = node.ask("p", i).send();
        tokio::task::yield_now().await;
        handle.cancel();
        assert_eq!(handle.await.unwrap_err().code(), ErrorCode::AskCancelled);
    }
    assert!(node.stats().breaker("p").is_none(), "nothing counted");
    for i in 0..4 {
        let e = node.ask("p", i).await.unwrap_err();
        assert!(
            matches!(
                e,
                AskError::AskCancelled {
                    reason: askpool::CancelReason::ProcessingTimeout
                }
            ),
            "{e:?}"
        );
    }
    let stats = node.stats();
    let breaker = stats.breaker("p").expect("timeouts counted");
    assert_eq!(breaker.state, BreakerState::Open);
    assert_eq!(breaker.trips, 1);
    assert_eq!(
        node.ask("p", 9).await.unwrap_err().code(),
        ErrorCode::Unavailable,
        "fails fast while open"
    );
}
