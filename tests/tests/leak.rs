//! 100,000 asks ending every way an ask can end leave nothing behind: the
//! pending map, timers and in-flight counts return to 0 and the reply cache
//! stays within its bound.

use std::collections::HashMap;
use std::time::Duration;

use askpool::{
    AskError, CancelReason, DedupConfig, ErrorCode, Node, NodeConfig, RetryPolicy, WorkerPool,
};

const ASKS: u64 = 100_000;
const BATCH: u64 = 2_000;
const TIMEOUT: Duration = Duration::from_millis(100);
const MAX_TERMINAL: usize = 5_000;

/// How ask `i` is meant to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ending {
    Reply,
    /// The handler outlives the caller's timeout.
    Timeout,
    /// The caller calls `cancel()` while the handler runs.
    LocalCancel,
    /// The caller drops the future while the handler runs.
    Dropped,
    /// The worker cancels before the deadline.
    RemoteCancel,
    /// The worker cancels at the very instant the caller times out.
    RemoteCancelAtTimeout,
}

fn ending(i: u64) -> Ending {
    match i % 6 {
        0 => Ending::Reply,
        1 => Ending::Timeout,
        2 => Ending::LocalCancel,
        3 => Ending::Dropped,
        4 => Ending::RemoteCancel,
        _ => Ending::RemoteCancelAtTimeout,
    }
}

fn serve(pool: WorkerPool<u64, u64>) {
    tokio::spawn(async move {
        while let Some(req) = pool.next_request().await {
            let msg = req.message;
            let responder = req.responder;
            tokio::spawn(async move {
                match ending(msg) {
                    Ending::Reply => responder.reply(msg),
                    Ending::Timeout => {
                        tokio::time::sleep(TIMEOUT * 2).await;
                        responder.reply(msg);
                    }
                    Ending::LocalCancel | Ending::Dropped => {
                        tokio::time::sleep(TIMEOUT / 2).await;
                        responder.reply(msg);
                    }
                    Ending::RemoteCancel => {
                        tokio::time::sleep(TIMEOUT / 4).await;
                        responder.cancel();
                    }
                    Ending::RemoteCancelAtTimeout => {
                        tokio::time::sleep(TIMEOUT).await;
                        responder.cancel();
                    }
                }
            });
        }
    });
}

#[tokio::test(start_paused = true)]
async fn every_ending_returns_to_the_bounds() {
    let node: Node<u64, u64> = Node::with_config(NodeConfig {
        retry: RetryPolicy {
            initial_delay: Duration::from_millis(20),
            ..RetryPolicy::default()
        },
        default_timeout: TIMEOUT,
        seed: Some(11),
        // Half of these asks fail on purpose; a breaker would rightly open
        // and fail the rest fast. Breakers have tests of their own.
        breaker: None,
        ..NodeConfig::default()
    });
    let pool = node
        .pool("p")
        .max_in_flight(BATCH as usize)
        .dedup(DedupConfig {
            max_terminal: MAX_TERMINAL,
            terminal_ttl: Duration::from_secs(3600),
        })
        .build()
        .unwrap();
    serve(pool);

    let mut seen: HashMap<(Ending, Option<ErrorCode>), u64> = HashMap::new();
    let mut peak_pending = 0;
    for batch in 0..ASKS / BATCH {
        let mut tasks = Vec::with_capacity(BATCH as usize);
        for i in batch * BATCH..(batch + 1) * BATCH {
            let mut handle = node.ask("p", i).send();
            tasks.push(tokio::spawn(async move {
                let result = match ending(i) {
                    Ending::LocalCancel => {
                        tokio::time::sleep(TIMEOUT / 10).await;
                        handle.cancel();
                        handle.await
                    }
                    Ending::Dropped => {
                        let _ = tokio::time::timeout(TIMEOUT / 10, &mut handle).await;
                        drop(handle);
                        return (i, None);
                    }
                    _ => handle.await,
                };
                (i, Some(result))
            }));
        }
        peak_pending = peak_pending.max(node.stats().pending);
        for task in tasks {
            let (i, result) = task.await.unwrap();
            let code = match &result {
                Some(Ok(reply)) => {
                    assert_eq!(*reply, i);
                    None
                }
                Some(Err(e)) => Some(e.code()),
                None => Some(ErrorCode::AskCancelled),
            };
            check_ending(ending(i), result.as_ref().map(|r| r.as_ref().err()));
            *seen.entry((ending(i), code)).or_default() += 1;
        }
        // Let suppressed late replies finish before the next batch.
        tokio::time::sleep(TIMEOUT * 3).await;
    }

    assert_eq!(
        peak_pending, BATCH as usize,
        "all of a batch was pending at once"
    );
    let stats = node.stats();
    let pool = stats.pool("p").unwrap();
    assert_eq!(stats.pending, 0, "pending map empty");
    assert_eq!(stats.armed_timers, 0, "no timer outlives its ask");
    assert_eq!(pool.in_flight, 0, "in-flight count back to 0");
    assert_eq!(pool.queued, 0);
    assert_eq!(pool.dedup.in_progress, 0);
    assert!(pool.dedup.terminal <= MAX_TERMINAL, "{:?}", pool.dedup);
    assert_eq!(
        pool.dedup.terminal, MAX_TERMINAL,
        "the cache filled to its bound"
    );
    assert_eq!(
        pool.dedup.evicted_capacity,
        ASKS - MAX_TERMINAL as u64,
        "every other entry was evicted"
    );
    // Every ending happened, and the race at the deadline went both ways
    // or one way, but each ask ended exactly once.
    let total: u64 = seen.values().sum();
    assert_eq!(total, ASKS);
    for e in [
        Ending::Reply,
        Ending::Timeout,
        Ending::LocalCancel,
        Ending::Dropped,
        Ending::RemoteCancel,
        Ending::RemoteCancelAtTimeout,
    ] {
        let n: u64 = seen
            .iter()
            .filter(|((k, _), _)| *k == e)
            .map(|(_, n)| n)
            .sum();
        assert!(n >= ASKS / 6, "{e:?} ended {n} times: {seen:?}");
    }
    assert!(pool.suppressed_replies > 0, "late replies were suppressed");
    // Timed-out asks are dead-lettered and remembered for reconciliation,
    // both within their bounds.
    let defaults = NodeConfig::default();
    assert_eq!(
        stats.dlq_depth, defaults.dlq_capacity,
        "the DLQ filled to its bound"
    );
    assert!(stats.dlq_dropped > 0);
    assert!(stats.timed_out_records <= defaults.reconcile_capacity);
}

fn check_ending(ending: Ending, result: Option<Option<&AskError>>) {
    let caller = AskError::AskCancelled {
        reason: CancelReason::Caller,
    };
    let worker = AskError::AskCancelled {
        reason: CancelReason::Worker,
    };
    match (ending, result) {
        (Ending::Reply, Some(None)) => {}
        (Ending::Timeout, Some(Some(AskError::AskTimeout { elapsed_ms: 100 }))) => {}
        (Ending::LocalCancel, Some(Some(e))) if *e == caller => {}
        (Ending::Dropped, None) => {}
        (Ending::RemoteCancel, Some(Some(e))) if *e == worker => {}
        (Ending::RemoteCancelAtTimeout, Some(Some(e)))
            if *e == worker || matches!(e, AskError::AskTimeout { elapsed_ms: 100 }) => {}
        other => panic!("unexpected ending {other:?}"),
    }
}
