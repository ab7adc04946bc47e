//! The runtime on a real multi-threaded scheduler: concurrent asks through
//! a transport that drops, duplicates and delays frames, with cancels and
//! timeouts racing replies. Afterwards every count is back to its bound and
//! no request ran twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use askpool::{
    AskError, Node, NodeConfig, PoolConfig, RequestId, RetryPolicy, TimeoutConfig, WorkerTransport,
};
use askpool_tests::{Fate, Tap};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const TASKS: u64 = 8;
const ASKS_PER_TASK: u64 = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_asks_under_faults_leave_nothing_behind() {
    let tap: Arc<Tap<u64, u64>> = Tap::in_process();
    let rng = Mutex::new(SmallRng::seed_from_u64(9));
    tap.set_rule(move |_| {
        let x: f64 = rng.lock().unwrap().random();
        match x {
            x if x < 0.05 => Fate::Drop,
            x if x < 0.15 => Fate::Duplicate,
            x if x < 0.20 => Fate::Delay(Duration::from_millis(3)),
            _ => Fate::Deliver,
        }
    });
    let transport: Arc<dyn WorkerTransport<u64, u64>> = tap.clone();
    let node = Node::with_transport(
        transport,
        NodeConfig {
            retry: RetryPolicy {
                initial_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(40),
                ..RetryPolicy::default()
            },
            default_timeout: Duration::from_millis(300),
            timeouts: TimeoutConfig {
                processing: Some(Duration::from_millis(500)),
                ..TimeoutConfig::default()
            },
            breaker: None,
            ..NodeConfig::default()
        },
    );
    // Each request id's side effect is counted: it must happen at most once.
    let effects = Arc::new(Mutex::new(
        std::collections::HashMap::<RequestId, u32>::new(),
    ));
    let e = effects.clone();
    node.pool("p")
        .config(PoolConfig {
            concurrency: 8,
            max_in_flight: 2_000,
            ..PoolConfig::default()
        })
        .handler(move |msg: u64, ctx| {
            *e.lock().unwrap().entry(ctx.request_id()).or_default() += 1;
            async move {
                if msg % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Ok(msg * 2)
            }
        })
        .unwrap();

    let outcomes = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let node = node.clone();
        let outcomes = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(t);
            let mut inflight = Vec::new();
            for i in 0..ASKS_PER_TASK {
                let msg = t * ASKS_PER_TASK + i;
                let mut handle = node.ask("p", msg).send();
                match rng.random_range(0..10) {
                    // Cancelled soon, or dropped: both are endings too.
                    0 => {
                        tokio::task::yield_now().await;
                        handle.cancel();
                        let r = handle.await;
                        assert!(matches!(r, Ok(_) | Err(AskError::AskCancelled { .. })));
                        outcomes.fetch_add(1, Ordering::Relaxed);
                    }
                    1 => {
                        drop(handle);
                        outcomes.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => inflight.push((msg, handle)),
                }
                if inflight.len() >= 64 {
                    for (msg, h) in inflight.drain(..) {
                        match h.await {
                            Ok(reply) => assert_eq!(reply, msg * 2),
                            Err(e) => assert!(
                                e.is_transient() || matches!(e, AskError::AskCancelled { .. }),
                                "{e:?}"
                            ),
                        }
                        outcomes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            for (_, h) in inflight {
                let _ = h.await;
                outcomes.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(outcomes.load(Ordering::Relaxed), TASKS * ASKS_PER_TASK);

    // Let delayed frames land and processing timeouts fire (a loaded
    // machine may need longer than an idle one).
    // Every count asserted below is waited for (early exit when all are 0).
    for _ in 0..300 {
        let stats = node.stats();
        let pool = stats.pool("p").unwrap();
        if stats.pending == 0
            && stats.armed_timers == 0
            && pool.in_flight == 0
            && pool.queued == 0
            && pool.dedup.in_progress == 0
            && pool.expiry_index == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = node.stats();
    let pool = stats.pool("p").unwrap();
    assert_eq!(stats.pending, 0);
    assert_eq!(stats.armed_timers, 0);
    assert_eq!(pool.in_flight, 0);
    assert_eq!(pool.queued, 0);
    assert_eq!(pool.dedup.in_progress, 0);
    assert_eq!(pool.expiry_index, 0);
    assert!(pool.dedup.terminal <= askpool::DedupConfig::default().max_terminal);
    assert!(stats.dlq_depth <= NodeConfig::default().dlq_capacity);
    let effects = effects.lock().unwrap();
    assert!(effects.values().all(|&n| n == 1), "a request ran twice");
    assert_eq!(effects.len() as u64, pool.handler_runs);
    assert!(pool.handler_runs <= pool.admitted);
    assert!(
        stats.retries > 0 && pool.duplicate_acks + pool.replays > 0,
        "faults happened"
    );
}
