//! Dead letters, late-outcome reconciliation and per-pool retry policies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use askpool::{
    AskError, DeadLetterKind, DeadLetterReason, ErrorCode, LateResult, Node, NodeConfig, PoolName,
    Replay, RetryPolicy, WorkerTransport,
};
use askpool_tests::{Fate, FrameKind, Tap};

type TestNode = Node<u64, String>;

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_delay: Duration::from_millis(10),
        jitter: 0.0,
        ..RetryPolicy::default()
    }
}

fn config(dlq_capacity: usize) -> NodeConfig {
    NodeConfig {
        retry: fast_retry(3),
        default_timeout: Duration::from_secs(1),
        seed: Some(3),
        dlq_capacity,
        ..NodeConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn exhausted_retries_land_in_the_dlq_with_their_payload() {
    let node: TestNode = Node::with_config(config(10));
    // A pool that is full for good: one request admitted and never pulled.
    let _pool = node.pool("p").max_in_flight(1).build().unwrap();
    let _stuck = node.ask("p", 0).send();
    let handle = node.ask("p", 42).send();
    let id = handle.request_id();
    let err = handle.await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::BufferFull);
    let letters = node.dead_letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.request_id(), id);
    assert_eq!(letter.payload, 42);
    assert_eq!(letter.pool, PoolName::new("p"));
    assert_eq!(letter.reason, DeadLetterReason::RetriesExhausted);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.error, err);
    assert_eq!(node.stats().dlq_depth, 1);
}

#[tokio::test(start_paused = true)]
async fn poison_outcomes_are_dead_lettered_and_permanent_ones_are_not() {
    let node: TestNode = Node::with_config(config(10));
    node.pool("p")
        .handler(|msg: u64, _ctx| async move {
            match msg {
                0 => Err(AskError::DecodeFailure {
                    message: "garbled".into(),
                }),
                // Retryable, but a reply: final, never re-sent, so no
                // retries ran out.
                2 => Err(AskError::unavailable("db down")),
                _ => Err(AskError::handler_failed("ValueError", "no")),
            }
        })
        .unwrap();
    let poison = node.ask("p", 0).send();
    let poison_id = poison.request_id();
    assert_eq!(poison.await.unwrap_err().code(), ErrorCode::DecodeFailure);
    assert_eq!(
        node.ask("p", 1).await.unwrap_err().code(),
        ErrorCode::HandlerFailed
    );
    assert_eq!(
        node.ask("nowhere", 1).await.unwrap_err().code(),
        ErrorCode::NoRoute
    );
    let replied = node.ask("p", 2).send();
    let replied_id = replied.request_id();
    assert_eq!(replied.await.unwrap_err().code(), ErrorCode::Unavailable);
    // Its duplicate is answered from the reply cache: a reply too.
    let again = node.ask("p", 2).request_id(replied_id).await;
    assert_eq!(again.unwrap_err().code(), ErrorCode::Unavailable);
    let letters = node.dead_letters();
    assert_eq!(letters.len(), 1, "only the poison message: {letters:?}");
    assert_eq!(letters[0].request_id(), poison_id);
    assert_eq!(letters[0].reason, DeadLetterReason::Poison);
}

#[tokio::test(start_paused = true)]
async fn the_dlq_is_bounded_and_drops_the_oldest() {
    let node: TestNode = Node::with_config(NodeConfig {
        retry: RetryPolicy::no_retry(),
        ..config(3)
    });
    node.pool("p")
        .handler(|_msg: u64, _ctx| async {
            Err(AskError::DecodeFailure {
                message: "x".into(),
            })
        })
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let h = node.ask("p", i).send();
        ids.push(h.request_id());
        h.await.unwrap_err();
    }
    let kept: Vec<_> = node.dead_letters().iter().map(|l| l.request_id()).collect();
    assert_eq!(kept, ids[2..].to_vec(), "the two oldest were dropped");
    let stats = node.stats();
    assert_eq!((stats.dlq_depth, stats.dlq_dropped), (3, 2));
    assert_eq!(node.purge_dead_letters(), 3);
    assert_eq!(node.stats().dlq_depth, 0);
}

/// A node whose pool "p" is full for good (its one request, `stuck`, is
/// never pulled), and the request id of the ask (payload 7) that was
/// dead-lettered for it.
async fn a_dead_letter_of_a_full_pool() -> (
    TestNode,
    askpool::WorkerPool<u64, String>,
    askpool::AskHandle<u64, String>,
    askpool::RequestId,
) {
    let node: TestNode = Node::with_config(config(10));
    let pool = node.pool("p").max_in_flight(1).build().unwrap();
    let stuck = node.ask("p", 0).send();
    let handle = node.ask("p", 7).send();
    let id = handle.request_id();
    handle.await.unwrap_err();
    (node, pool, stuck, id)
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_replays_with_its_request_id() {
    let (node, pool, stuck, id) = a_dead_letter_of_a_full_pool().await;
    assert!(node.dead_letter(id).is_some());
    // Free the pool, then replay.
    let r = pool.next_request().await.unwrap();
    r.responder.reply("zero".into());
    assert_eq!(stuck.await.unwrap(), "zero");
    let replay = node.replay_dead_letter(id).unwrap();
    assert_eq!(replay.request_id(), id);
    let served = tokio::spawn(async move {
        let r = pool.next_request().await.unwrap();
        assert_eq!(r.message, 7);
        let ctx_id = r.context.request_id();
        r.responder.reply("seven".into());
        ctx_id
    });
    assert_eq!(replay.await.unwrap(), "seven");
    assert_eq!(
        served.await.unwrap(),
        id,
        "the worker saw the same request id"
    );
    assert!(node.dead_letter(id).is_none());
    assert_eq!(
        node.replay_dead_letter(id).unwrap_err().code(),
        ErrorCode::FailedPrecondition
    );
}

/// A tell that exhausted its retries is filed as a tell, and is replayed as
/// one: one-way, done when the pool accepts it. It used to be replayed as
/// an ask: it waited for the handler's answer, which a pool that had
/// admitted the tell never sends (the replay timed out and was filed
/// again), and one that had run it answered from its cache.
#[tokio::test(start_paused = true)]
async fn a_tells_dead_letter_replays_as_a_tell() {
    let node: TestNode = Node::with_config(config(10));
    let pool = node.pool("p").max_in_flight(1).build().unwrap();
    let stuck = node.ask("p", 0).send();
    let tell = node.tell("p", 7).send();
    let id = tell.request_id();
    assert_eq!(tell.await.unwrap_err().code(), ErrorCode::BufferFull);
    let letter = node.dead_letter(id).expect("BufferFull every time: filed");
    assert_eq!(letter.kind, DeadLetterKind::Tell);
    let r = pool.next_request().await.unwrap();
    r.responder.reply("zero".into());
    assert_eq!(stuck.await.unwrap(), "zero");

    // Not as an ask: refused, and the letter stays.
    let err = node.replay_dead_letter(id).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(err.to_string().contains("replay_dead_tell"), "{err}");
    assert_eq!(node.dead_letter(id).unwrap().kind, DeadLetterKind::Tell);

    // As a tell: accepted before any worker took it.
    let replay = node.replay_dead_tell(id).unwrap();
    assert_eq!(replay.await.unwrap(), id);
    assert!(!node.is_pending(id));
    assert!(node.dead_letter(id).is_none());
    let r = pool.next_request().await.unwrap();
    assert_eq!((r.message, r.context.request_id()), (7, id));
    r.responder.reply("seven".into());
    // Again with the same id: deduplicated as a tell, acknowledged and not
    // queued again.
    assert_eq!(node.tell("p", 7).request_id(id).await.unwrap(), id);
    assert_eq!(pool.stats().queued, 0);
    assert_eq!(node.stats().dlq_depth, 0);

    // And an ask's letter is not replayed as a tell.
    let stuck = node.ask("p", 0).send();
    let ask = node.ask("p", 8).send();
    let ask_id = ask.request_id();
    ask.await.unwrap_err();
    assert_eq!(node.dead_letter(ask_id).unwrap().kind, DeadLetterKind::Ask);
    let err = node.replay_dead_tell(ask_id).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(node.dead_letter(ask_id).is_some());

    // Replayed as sent, each is what it was: the ask fails again (the pool
    // is still full) and is filed again as an ask; a tell is a tell.
    let tell = node.tell("p", 9).send();
    let tell_id = tell.request_id();
    tell.await.unwrap_err();
    let Replay::Ask(ask) = node.replay_dead_letter_as_sent(ask_id).unwrap() else {
        panic!("an ask's letter replays as an ask");
    };
    assert_eq!(ask.await.unwrap_err().code(), ErrorCode::BufferFull);
    assert_eq!(node.dead_letter(ask_id).unwrap().kind, DeadLetterKind::Ask);
    let r = pool.next_request().await.unwrap();
    r.responder.reply("zero".into());
    assert_eq!(stuck.await.unwrap(), "zero");
    let Replay::Tell(tell) = node.replay_dead_letter_as_sent(tell_id).unwrap() else {
        panic!("a tell's letter replays as a tell");
    };
    assert_eq!(tell.await.unwrap(), tell_id);
}

/// A letter keeps its ask's payload fingerprint and its replay carries it:
/// a pool that holds the id for another payload since refuses the replay
/// as it refuses the ask itself, instead of answering it with the other
/// payload's reply.
#[tokio::test(start_paused = true)]
async fn a_replay_carries_its_payload_fingerprint() {
    use askpool::PayloadFingerprint;
    let node: TestNode = Node::with_config(config(10));
    let pool = Arc::new(node.pool("p").max_in_flight(1).build().unwrap());
    let id = askpool::RequestId::from_parts(9, 9);
    let fingerprint = |m: u64| PayloadFingerprint::from_u128(1000 + u128::from(m));
    let stuck = node.ask("p", 0).send();
    let refused = node.ask("p", 1).request_id(id).fingerprint(fingerprint(1));
    assert_eq!(refused.await.unwrap_err().code(), ErrorCode::BufferFull);
    let letter = node.dead_letter(id).expect("filed: BufferFull every time");
    assert_eq!(letter.fingerprint, Some(fingerprint(1)));
    let serve = |reply: &'static str| {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move {
            let r = pool.next_request().await.unwrap();
            r.responder.reply(reply.into());
        })
    };
    serve("zero");
    assert_eq!(stuck.await.unwrap(), "zero");
    // The id is reused for payload 2 meanwhile.
    serve("two");
    let two = node.ask("p", 2).request_id(id).fingerprint(fingerprint(2));
    assert_eq!(two.await.unwrap(), "two");
    let replay = node.replay_dead_letter(id).unwrap().await;
    assert!(
        matches!(replay, Err(AskError::PayloadMismatch)),
        "payload 1's replay: {replay:?}"
    );
    // Refused for good: the letter is back, with its fingerprint.
    let back = node
        .dead_letter(id)
        .expect("a failed replay keeps its letter");
    assert_eq!(back.fingerprint, Some(fingerprint(1)));
}

/// The hook an ask is given hears the outcomes of its dead letter's
/// replays (a durable ask records them in its promise), not the ask's own,
/// and goes back into the queue with a letter a replay files again.
#[tokio::test(start_paused = true)]
async fn replay_outcomes_reach_the_asks_hook() {
    let node: TestNode = Node::with_config(config(10));
    let pool = node.pool("p").max_in_flight(1).build().unwrap();
    let stuck = node.ask("p", 0).send();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let hook = Arc::clone(&heard);
    let handle = node
        .ask("p", 7)
        .on_replay_outcome(move |outcome: Result<String, AskError>| {
            hook.lock().unwrap().push(outcome.map_err(|e| e.code()));
        })
        .send();
    let id = handle.request_id();
    handle.await.unwrap_err();
    assert!(
        heard.lock().unwrap().is_empty(),
        "not the ask's own outcome"
    );
    // Replayed while the pool is still full: it fails again, is heard, and
    // its letter is filed again with the hook.
    let err = node.replay_dead_letter(id).unwrap().await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::BufferFull);
    assert_eq!(*heard.lock().unwrap(), vec![Err(ErrorCode::BufferFull)]);
    let r = pool.next_request().await.unwrap();
    r.responder.reply("zero".into());
    assert_eq!(stuck.await.unwrap(), "zero");
    let served = tokio::spawn(async move {
        let r = pool.next_request().await.unwrap();
        r.responder.reply("seven".into());
    });
    assert_eq!(node.replay_dead_letter(id).unwrap().await.unwrap(), "seven");
    served.await.unwrap();
    assert_eq!(
        *heard.lock().unwrap(),
        vec![Err(ErrorCode::BufferFull), Ok("seven".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_replay_puts_its_letter_back() {
    let (node, pool, stuck, id) = a_dead_letter_of_a_full_pool().await;
    assert_eq!(
        node.dead_letter(id).unwrap().reason,
        DeadLetterReason::RetriesExhausted
    );
    // Its pool is gone: the replay fails NoRoute (permanent), and the
    // letter, with its payload, is back in the queue with that error.
    pool.close();
    let err = node.replay_dead_letter(id).unwrap().await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::NoRoute);
    let letter = node.dead_letter(id).expect("the letter is back");
    assert_eq!(letter.payload, 7);
    assert_eq!(letter.error.code(), ErrorCode::NoRoute);
    assert_eq!(letter.reason, DeadLetterReason::RetriesExhausted);
    assert_eq!(node.stats().dlq_depth, 1);
    // Refused before it was sent (its id is pending on this node): back too.
    let _q = node.pool("q").build().unwrap();
    let _pending = node.ask("q", 1).request_id(id).send();
    let err = node.replay_dead_letter(id).unwrap().await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(node.dead_letter(id).expect("back again").payload, 7);
    // A replay its caller cancels gives the letter up, as asked.
    drop(_pending);
    let _p = node.pool("p").build().unwrap();
    let mut replay = node.replay_dead_letter(id).unwrap();
    replay.cancel();
    assert_eq!(replay.await.unwrap_err().code(), ErrorCode::AskCancelled);
    assert!(node.dead_letter(id).is_none());
    drop(stuck);
    assert_eq!(node.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn a_replay_cut_short_by_the_shutdown_keeps_its_letter() {
    let (node, pool, stuck, id) = a_dead_letter_of_a_full_pool().await;
    pool.close();
    drop(stuck);
    // A pool that admits the replay and never answers it.
    let _p = node.pool("p").build().unwrap();
    let replay = node.replay_dead_letter(id).unwrap();
    let replay = tokio::spawn(replay);
    tokio::task::yield_now().await;
    node.shutdown();
    assert_eq!(
        replay.await.unwrap().unwrap_err().code(),
        ErrorCode::Unavailable
    );
    assert_eq!(node.dead_letter(id).expect("kept").payload, 7);
}

#[tokio::test(start_paused = true)]
async fn a_late_outcome_is_reconciled_once_and_clears_the_dead_letter() {
    let tap = Tap::in_process();
    tap.set_rule(|f| match f.kind {
        FrameKind::Reply => Fate::Duplicate,
        _ => Fate::Deliver,
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(transport, config(10));
    node.pool("p")
        .handler(|msg: u64, _ctx| async move {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            Ok(format!("late {msg}"))
        })
        .unwrap();
    // The caller's cancel must not reach the worker, or the late reply
    // would be suppressed (which is the point of the cancel).
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        FrameKind::Reply => Fate::Duplicate,
        _ => Fate::Deliver,
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    node.on_late_outcome(move |late| s.lock().unwrap().push(late));
    let handle = node.ask("p", 5).send();
    let id = handle.request_id();
    let err = handle.await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::AskTimeout);
    assert_eq!(
        node.dead_letter(id).map(|l| l.reason),
        Some(DeadLetterReason::RetriesExhausted)
    );
    assert_eq!(node.stats().timed_out_records, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "reconciled once though the reply came twice");
    assert_eq!(seen[0].ids.request_id, id);
    assert!(matches!(&seen[0].result, LateResult::Reply(Ok(s)) if s == "late 5"));
    assert_eq!(seen[0].late_by, Duration::from_millis(1500));
    let stats = node.stats();
    assert_eq!(stats.late_outcomes, 1);
    assert_eq!(stats.timed_out_records, 0);
    assert_eq!(stats.dlq_depth, 0, "the dead-letter mark was cleared");
    assert_eq!(
        stats.ignored_frames, 1,
        "the duplicate late reply was ignored"
    );
}

#[tokio::test(start_paused = true)]
async fn timed_out_records_are_bounded() {
    let node: TestNode = Node::with_config(NodeConfig {
        reconcile_capacity: 2,
        reconcile_window: Duration::from_secs(60),
        ..config(10)
    });
    let _pool = node.pool("p").build().unwrap();
    for i in 0..5 {
        node.ask("p", i).await.unwrap_err();
    }
    assert_eq!(node.stats().timed_out_records, 2);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(
        node.stats().timed_out_records,
        0,
        "and forgotten after the window"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pool_policy_overrides_the_node_and_an_ask_overrides_both() {
    let tap = Tap::in_process();
    tap.set_rule(|f| match f.kind {
        FrameKind::Request => Fate::Drop,
        _ => Fate::Deliver,
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(
        transport,
        NodeConfig {
            pool_retry: HashMap::from([(PoolName::new("once"), RetryPolicy::no_retry())]),
            ..config(10)
        },
    );
    for name in ["once", "thrice"] {
        node.pool(name).build().unwrap();
    }
    let count = |tap: &Tap<u64, String>| tap.sent(FrameKind::Request).len();
    node.ask("once", 1).await.unwrap_err();
    assert_eq!(count(&tap), 1);
    tap.clear();
    node.ask("thrice", 1).await.unwrap_err();
    assert_eq!(count(&tap), 3);
    tap.clear();
    node.ask("once", 1).retry(fast_retry(5)).await.unwrap_err();
    assert_eq!(count(&tap), 5);
}

/// A timed-out ask's cancel reaches its pool, which keeps the id cancelled
/// (the table's Cancelled row) for the reply cache's TTL: a replay before
/// then is answered `AskCancelled` and keeps its letter; once the entry has
/// expired, the replay runs the request again under its own id.
#[tokio::test(start_paused = true)]
async fn a_timed_out_asks_letter_replays_once_its_cancel_expired() {
    let node: TestNode = Node::with_config(NodeConfig {
        seed: Some(3),
        ..NodeConfig::default()
    });
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    node.pool("p")
        .handler(move |msg: u64, _ctx| {
            let run = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if run == 0 {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Ok(format!("done {msg}"))
            }
        })
        .unwrap();
    let ask = node.ask("p", 7).timeout(Duration::from_secs(1)).send();
    let id = ask.request_id();
    assert_eq!(ask.await.unwrap_err().code(), ErrorCode::AskTimeout);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let early = node.replay_dead_letter(id).unwrap().await;
    assert_eq!(
        early,
        Err(AskError::AskCancelled {
            reason: askpool::CancelReason::CallerTimeout
        })
    );
    assert!(node.dead_letter(id).is_some(), "the letter went back");
    let ttl = askpool::DedupConfig::default().terminal_ttl;
    tokio::time::sleep(ttl).await;
    assert_eq!(
        node.replay_dead_letter(id).unwrap().await.unwrap(),
        "done 7"
    );
    assert!(node.dead_letter(id).is_none());
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A node whose cancel frames are lost on the way to its pools.
fn losing_cancels() -> (Arc<Tap<u64, String>>, TestNode) {
    let tap = Tap::in_process();
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        _ => Fate::Deliver,
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    (tap, Node::with_transport(transport, config(10)))
}

/// An ask that timed out at its caller, whose cancel was lost, and that the
/// pool then cancelled at its processing timeout: the pool did no work, so
/// its cancel is no late outcome and the dead letter stays, to be replayed.
#[tokio::test(start_paused = true)]
async fn a_pools_processing_timeout_after_the_callers_keeps_the_dead_letter() {
    let (tap, node) = losing_cancels();
    node.pool("p")
        .config(askpool::PoolConfig {
            processing_timeout: Some(Duration::from_secs(2)),
            ..askpool::PoolConfig::default()
        })
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    let ask = node.ask("p", 7).timeout(Duration::from_secs(1)).send();
    let id = ask.request_id();
    assert_eq!(ask.await.unwrap_err().code(), ErrorCode::AskTimeout);
    assert!(node.dead_letter(id).is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !tap.delivered(FrameKind::Cancelled).is_empty(),
        "the pool's processing-timeout cancel reached the caller"
    );
    assert_eq!(node.stats().late_outcomes, 0);
    assert!(node.dead_letter(id).is_some(), "the letter stays");
}

/// The same with the pool closing instead: it cancels the queued request,
/// whose handler never ran, so that cancel is no late outcome either.
#[tokio::test(start_paused = true)]
async fn a_pool_closing_after_the_callers_timeout_keeps_the_dead_letter() {
    let (tap, node) = losing_cancels();
    let pool = node
        .pool("p")
        .concurrency(1)
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    let _running = node.ask("p", 1).timeout(Duration::from_secs(60)).send();
    let queued = node.ask("p", 2).timeout(Duration::from_secs(1)).send();
    let id = queued.request_id();
    assert_eq!(queued.await.unwrap_err().code(), ErrorCode::AskTimeout);
    assert!(node.dead_letter(id).is_some());
    pool.close();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !tap.delivered(FrameKind::Cancelled).is_empty(),
        "the pool's closing cancel reached the caller"
    );
    assert_eq!(node.stats().late_outcomes, 0);
    assert!(node.dead_letter(id).is_some(), "the letter stays");
}
