//! The runtime against the protocol, on a paused tokio clock: every timer
//! fires at its exact instant and a run is reproducible.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AskError, CancelReason, CausationId, CorrelationId, ErrorCode, InProcessTransport, Node,
    NodeConfig, PayloadFingerprint, PoolName, RequestId, RetryPolicy, WorkerTransport,
};
use askpool_tests::{Fate, FrameKind, Tap};
use tokio::sync::Notify;

type TestNode = Node<u64, String>;

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial_delay: Duration::from_millis(100),
        multiplier: 2.0,
        max_delay: Duration::from_secs(1),
        jitter: 0.0,
        ..RetryPolicy::default()
    }
}

fn node_on(tap: &Arc<Tap<u64, String>>) -> TestNode {
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    Node::with_transport(
        transport,
        NodeConfig {
            retry: policy(),
            default_timeout: Duration::from_secs(10),
            seed: Some(7),
            ..NodeConfig::default()
        },
    )
}

/// A handler pool that counts its runs and answers after `delay`.
fn echo_pool(node: &TestNode, name: &str, delay: Duration) -> Arc<AtomicUsize> {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    node.pool(name)
        .concurrency(4)
        .handler(move |msg: u64, _ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(delay).await;
                Ok(format!("echo {msg}"))
            }
        })
        .unwrap();
    runs
}

#[tokio::test(start_paused = true)]
async fn reply_reaches_the_caller_with_its_ids() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::from_millis(5));
    let reply = node.ask("p", 3).await.unwrap();
    assert_eq!(reply, "echo 3");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replies = tap.delivered(FrameKind::Reply);
    assert_eq!(replies.len(), 1);
    let request = &tap.delivered(FrameKind::Request)[0];
    assert_eq!(
        replies[0].ids, request.ids,
        "ids unchanged on the live reply"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_stop_after_the_ack() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::from_secs(3));
    // The first request and its ack are lost; the second attempt is acked.
    let seen = Arc::new(AtomicUsize::new(0));
    let seen2 = seen.clone();
    tap.set_rule(move |f| match f.kind {
        FrameKind::Request if seen2.fetch_add(1, Ordering::SeqCst) == 0 => Fate::Drop,
        _ => Fate::Deliver,
    });
    let reply = node.ask("p", 1).await.unwrap();
    assert_eq!(reply, "echo 1");
    let requests = tap.sent(FrameKind::Request);
    // Attempt 1 dropped at t=0, attempt 2 at t=100ms acked; the handler
    // then runs 3 s with no further attempt although 3 more were allowed.
    assert_eq!(
        requests
            .iter()
            .map(|f| f.attempt.unwrap())
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!(requests.iter().all(|f| f.ids == requests[0].ids));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn unacked_requests_are_resent_with_backoff_and_the_same_id() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let _runs = echo_pool(&node, "p", Duration::ZERO);
    tap.set_rule(|f| match f.kind {
        FrameKind::Request => Fate::Drop,
        _ => Fate::Deliver,
    });
    let start = tokio::time::Instant::now();
    let err = node
        .ask("p", 1)
        .timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AskTimeout);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    let attempts: Vec<u32> = tap
        .sent(FrameKind::Request)
        .iter()
        .map(|f| f.attempt.unwrap())
        .collect();
    // Sends at 0, 100, 300, 700, 1500 ms: max_attempts = 5, all before 2 s.
    assert_eq!(attempts, vec![1, 2, 3, 4, 5]);
    assert_eq!(node.stats().retries, 4);
}

#[tokio::test(start_paused = true)]
async fn timeout_fails_the_ask_and_sends_a_cancel_with_the_same_ids() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::from_secs(60));
    let correlation = CorrelationId::from_u128(0xc0ffee);
    let causation = CausationId::from_u128(0xcafe);
    let err = node
        .ask("p", 9)
        .timeout(Duration::from_secs(1))
        .correlation_id(correlation)
        .causation_id(causation)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AskError::AskTimeout { elapsed_ms: 1000 }),
        "{err:?}"
    );
    let request = tap.sent(FrameKind::Request)[0].clone();
    let cancels = tap.sent(FrameKind::Cancel);
    assert_eq!(cancels.len(), 1);
    assert_eq!(cancels[0].ids, request.ids);
    assert_eq!(cancels[0].ids.correlation_id, correlation);
    assert_eq!(cancels[0].ids.causation_id, Some(causation));
    // The worker recorded the cancel; its late reply is suppressed.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        tap.sent(FrameKind::Reply).is_empty(),
        "no reply after cancel"
    );
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!(pool.suppressed_replies, 1);
    assert_eq!(pool.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn duplicate_replies_are_ignored_after_the_first() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    echo_pool(&node, "p", Duration::from_millis(1));
    tap.set_rule(|f| match f.kind {
        FrameKind::Reply => Fate::Duplicate,
        _ => Fate::Deliver,
    });
    assert_eq!(node.ask("p", 5).await.unwrap(), "echo 5");
    assert_eq!(tap.delivered(FrameKind::Reply).len(), 2);
    assert_eq!(node.stats().ignored_frames, 1);
    assert_eq!(node.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn duplicate_request_in_progress_gets_an_ack_and_runs_once() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::from_millis(500));
    tap.set_rule(|f| match f.kind {
        FrameKind::Request => Fate::Duplicate,
        _ => Fate::Deliver,
    });
    assert_eq!(node.ask("p", 2).await.unwrap(), "echo 2");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(tap.delivered(FrameKind::Ack).len(), 2);
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!((pool.handler_runs, pool.duplicate_acks), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn duplicate_after_reply_replays_the_identical_reply() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::ZERO);
    let id = RequestId::from_parts(1, 42);
    let first = node.ask("p", 8).request_id(id).await.unwrap();
    // The caller restarts its ask with the same id (say, after a crash).
    let second = node.ask("p", 8).request_id(id).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replies = tap.sent(FrameKind::Reply);
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0], replies[1], "replay carries the same ids");
    assert_eq!(node.stats().pool("p").unwrap().replays, 1);
}

#[tokio::test(start_paused = true)]
async fn error_outcomes_are_cached_and_replayed() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    node.pool("p")
        .handler(move |_msg: u64, _ctx| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err(AskError::handler_failed("ValueError", "bad input")) }
        })
        .unwrap();
    let id = RequestId::from_parts(1, 43);
    let first = node.ask("p", 1).request_id(id).await.unwrap_err();
    let second = node.ask("p", 1).request_id(id).await.unwrap_err();
    assert_eq!(first, AskError::handler_failed("ValueError", "bad input"));
    assert_eq!(first, second);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn cancel_then_late_reply_sends_no_reply() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let started = Arc::new(Notify::new());
    let observed_cancel = Arc::new(AtomicUsize::new(0));
    let (s, o) = (started.clone(), observed_cancel.clone());
    node.pool("p")
        .handler(move |msg: u64, ctx| {
            let (s, o) = (s.clone(), o.clone());
            async move {
                s.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
                if ctx.is_cancelled() {
                    o.fetch_add(1, Ordering::SeqCst);
                }
                Ok(format!("late {msg}"))
            }
        })
        .unwrap();
    let mut handle = node.ask("p", 4).send();
    let ids = *handle.ids();
    tokio::select! {
        _ = started.notified() => {}
        _ = &mut handle => panic!("finished before the handler started"),
    }
    handle.cancel();
    let err = handle.await.unwrap_err();
    assert_eq!(
        err,
        AskError::AskCancelled {
            reason: CancelReason::Caller
        }
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        observed_cancel.load(Ordering::SeqCst),
        1,
        "handler saw the cancel"
    );
    assert!(
        tap.sent(FrameKind::Reply).is_empty(),
        "late reply suppressed"
    );
    let cancelled = tap.sent(FrameKind::Cancelled);
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].ids, ids);
    // A duplicate of the cancelled request is answered AskCancelled, not run.
    let again = node
        .ask("p", 4)
        .request_id(ids.request_id)
        .await
        .unwrap_err();
    assert_eq!(again.code(), ErrorCode::AskCancelled);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_cancels_the_ask() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    echo_pool(&node, "p", Duration::from_secs(5));
    let handle = node.ask("p", 1).send();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(handle);
    assert_eq!(tap.sent(FrameKind::Cancel).len(), 1);
    let stats = node.stats();
    assert_eq!((stats.pending, stats.armed_timers), (0, 0));
    assert_eq!(stats.pool("p").unwrap().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn cancel_before_request_leaves_a_tombstone() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::ZERO);
    // The request is delayed past its own timeout's cancel.
    tap.set_rule(|f| match f.kind {
        FrameKind::Request => Fate::Delay(Duration::from_secs(2)),
        _ => Fate::Deliver,
    });
    let err = node
        .ask("p", 1)
        .timeout(Duration::from_secs(1))
        .retry(RetryPolicy::no_retry())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AskTimeout);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a tombstoned request never runs"
    );
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!(pool.tombstones, 1);
    assert_eq!(tap.sent(FrameKind::Cancelled).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn worker_cancel_fails_the_ask_with_ask_cancelled() {
    let node: TestNode = Node::new();
    let pool = node.pool("p").build().unwrap();
    let ask = tokio::spawn({
        let node = node.clone();
        async move { node.ask("p", 1).await }
    });
    let request = pool.next_request().await.unwrap();
    request.responder.cancel();
    let err = ask.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        AskError::AskCancelled {
            reason: CancelReason::Worker
        }
    );
}

#[tokio::test(start_paused = true)]
async fn payload_mismatch_is_refused_without_running() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let runs = echo_pool(&node, "p", Duration::ZERO);
    let id = RequestId::from_parts(5, 5);
    let a = PayloadFingerprint::from_u128(1);
    let b = PayloadFingerprint::from_u128(2);
    node.ask("p", 1)
        .request_id(id)
        .fingerprint(a)
        .await
        .unwrap();
    let err = node
        .ask("p", 2)
        .request_id(id)
        .fingerprint(b)
        .await
        .unwrap_err();
    assert_eq!(err, AskError::PayloadMismatch);
    // Stored unchecked, asked checked: fails closed.
    let id2 = RequestId::from_parts(5, 6);
    node.ask("p", 1).request_id(id2).await.unwrap();
    let err = node
        .ask("p", 1)
        .request_id(id2)
        .fingerprint(a)
        .await
        .unwrap_err();
    assert_eq!(err, AskError::PayloadMismatch);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn unknown_pool_is_no_route() {
    let node: TestNode = Node::new();
    let err = node.ask("nowhere", 1).await.unwrap_err();
    assert_eq!(
        err,
        AskError::NoRoute {
            pool: "nowhere".into()
        }
    );
    assert_eq!(node.stats().pending, 0);
    assert_eq!(
        node.tell("nowhere", 1).await.unwrap_err().code(),
        ErrorCode::NoRoute
    );
}

#[tokio::test(start_paused = true)]
async fn over_max_in_flight_is_buffer_full_and_nothing_is_dropped() {
    let node: TestNode = Node::new();
    let pool = node.pool("p").max_in_flight(2).build().unwrap();
    let no_retry = RetryPolicy::no_retry();
    let a = node.ask("p", 1).retry(no_retry).send();
    let b = node.ask("p", 2).retry(no_retry).send();
    let c = node.ask("p", 3).retry(no_retry).send();
    let err = c.await.unwrap_err();
    assert_eq!(
        err,
        AskError::BufferFull {
            pool: "p".into(),
            limit: 2
        }
    );
    assert_eq!(pool.stats().rejected_full, 1);
    for _ in 0..2 {
        let r = pool.next_request().await.unwrap();
        let m = r.message;
        r.responder.reply(format!("ok {m}"));
    }
    assert_eq!(a.await.unwrap(), "ok 1");
    assert_eq!(b.await.unwrap(), "ok 2");
}

#[tokio::test(start_paused = true)]
async fn buffer_full_is_retried_while_time_remains() {
    let node: TestNode = Node::with_config(NodeConfig {
        retry: policy(),
        ..NodeConfig::default()
    });
    let pool = node.pool("p").max_in_flight(1).build().unwrap();
    let first = node.ask("p", 1).send();
    // Spawned: a handle drives its re-sends only while it is polled.
    let second = tokio::spawn(node.ask("p", 2).send());
    // Free the slot after 150 ms: the second ask's retry at 100 ms is
    // refused again, the one at 300 ms gets in.
    let r = pool.next_request().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    r.responder.reply("one".into());
    assert_eq!(first.await.unwrap(), "one");
    let r = pool.next_request().await.unwrap();
    assert_eq!(r.message, 2);
    r.responder.reply("two".into());
    assert_eq!(second.await.unwrap().unwrap(), "two");
    assert_eq!(pool.stats().rejected_full, 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_fails_every_pending_ask_and_new_ones() {
    let node: TestNode = Node::new();
    let _pool = node.pool("p").build().unwrap();
    let asks: Vec<_> = (0..10).map(|i| node.ask("p", i).send()).collect();
    node.shutdown();
    for ask in asks {
        assert_eq!(ask.await.unwrap_err(), AskError::node_closed());
    }
    assert_eq!(node.ask("p", 1).await.unwrap_err(), AskError::node_closed());
    assert_eq!(node.stats().pending, 0);
    assert!(node.pool("q").build().is_err());
}

#[tokio::test(start_paused = true)]
async fn preferred_worker_gets_the_ask_while_alive() {
    let node: TestNode = Node::new();
    let pool = node.pool("p").build().unwrap();
    let w1 = pool.worker("w1").unwrap();
    let w2 = pool.worker("w2").unwrap();
    let ask = node.ask("p", 1).preferred_worker("w2").send();
    let r = tokio::time::timeout(Duration::from_millis(10), w2.next_request())
        .await
        .expect("routed to w2")
        .unwrap();
    r.responder.reply("from w2".into());
    assert_eq!(ask.await.unwrap(), "from w2");
    // w2 gone: its asks go to any worker.
    drop(w2);
    let ask = node.ask("p", 2).preferred_worker("w2").send();
    let r = w1.next_request().await.unwrap();
    assert_eq!(r.message, 2);
    r.responder.reply("from w1".into());
    assert_eq!(ask.await.unwrap(), "from w1");
    assert!(
        pool.worker("w1").is_err(),
        "duplicate worker names are refused"
    );
}

#[tokio::test(start_paused = true)]
async fn tell_is_deduplicated() {
    let node: TestNode = Node::new();
    let runs = echo_pool(&node, "p", Duration::ZERO);
    let id = RequestId::from_parts(9, 9);
    assert_eq!(node.tell("p", 1).request_id(id).await.unwrap(), id);
    assert_eq!(node.tell("p", 1).request_id(id).await.unwrap(), id);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(node.tell("p", 1).request_id(id).await.unwrap(), id);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    node.tell("p", 2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(node.stats().pending, 0);
}

/// A tell whose id its caller cancelled (the key is Cancelled, or a
/// tombstone of a cancel that came first) is refused as an ask is: it
/// never runs, so it must not be acknowledged.
#[tokio::test(start_paused = true)]
async fn a_tell_of_a_cancelled_id_is_refused_not_acknowledged() {
    let node: TestNode = Node::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    node.pool("p")
        .handler(move |msg: u64, ctx| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                ctx.cancelled().await;
                Ok(format!("{msg}"))
            }
        })
        .unwrap();
    let id = RequestId::from_parts(1, 42);
    let handle = node.ask("p", 0).request_id(id).send();
    tokio::task::yield_now().await;
    drop(handle);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let told = node.tell("p", 2).request_id(id).await;
    assert_eq!(
        told,
        Err(AskError::AskCancelled {
            reason: CancelReason::Caller
        })
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tell never ran");
    assert_eq!(node.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_tell_is_an_error_not_a_silent_drop() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let pool = node.pool("p").max_in_flight(1).build().unwrap();
    node.tell("p", 1).await.unwrap();
    let err = node
        .tell("p", 2)
        .retry(RetryPolicy::no_retry())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AskError::BufferFull {
            pool: "p".into(),
            limit: 1
        }
    );
    // A tell's outcome never travels back.
    let r = pool.next_request().await.unwrap();
    r.responder.reply("ignored".into());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(tap.sent(FrameKind::Reply).is_empty());
    assert!(
        !tap.sent(FrameKind::Refused).is_empty(),
        "the refusal went back"
    );
}

#[tokio::test(start_paused = true)]
async fn handler_panic_becomes_handler_failed() {
    let node: TestNode = Node::new();
    node.pool("p")
        .handler(|msg: u64, _ctx| async move {
            if msg == 0 {
                panic!("boom");
            }
            Ok("fine".to_string())
        })
        .unwrap();
    let err = node.ask("p", 0).await.unwrap_err();
    assert_eq!(err, AskError::handler_failed("panic", "boom"));
    // The worker survived its panic.
    assert_eq!(node.ask("p", 1).await.unwrap(), "fine");
}

#[tokio::test(start_paused = true)]
async fn dropped_request_fails_instead_of_hanging() {
    let node: TestNode = Node::new();
    let pool = node.pool("p").build().unwrap();
    let ask = node.ask("p", 1).send();
    drop(pool.next_request().await.unwrap());
    assert_eq!(ask.await.unwrap_err().code(), ErrorCode::Internal);
    assert_eq!(pool.stats().in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn pool_names_are_bounded_and_errors_stay_short() {
    let node: TestNode = Node::new();
    for bad in [String::new(), "x".repeat(PoolName::MAX_LEN + 1)] {
        let err = node.pool(bad.as_str()).build().err().expect("refused");
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{bad:?}");
    }
    let longest = "y".repeat(PoolName::MAX_LEN);
    node.pool(longest.as_str())
        .handler(|m: u64, _ctx| async move { Ok(format!("{m}")) })
        .unwrap();
    assert_eq!(node.ask(longest.as_str(), 1).await.unwrap(), "1");
    // Asking a name of a megabyte: the error names it, cut at MAX_LEN
    // bytes (on a char boundary), not a megabyte long.
    let huge = format!(
        "{}é{}",
        "z".repeat(PoolName::MAX_LEN - 1),
        "z".repeat(1 << 20)
    );
    let err = node.ask(huge.as_str(), 1).await.unwrap_err();
    let AskError::NoRoute { pool } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(pool, &format!("{}...", "z".repeat(PoolName::MAX_LEN - 1)));
    assert!(err.to_string().len() < 2 * PoolName::MAX_LEN);
}

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_is_invalid_and_files_no_dead_letter() {
    let node: TestNode = Node::new();
    let _pool = node.pool("p").build().unwrap();
    for err in [
        node.ask("p", 1).timeout(Duration::ZERO).await.unwrap_err(),
        node.tell("p", 1).timeout(Duration::ZERO).await.unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }
    assert!(node.dead_letters().is_empty());
    assert_eq!(node.stats().pending, 0);
    let zero = NodeConfig {
        default_timeout: Duration::ZERO,
        ..NodeConfig::default()
    };
    let err = TestNode::try_with_transport(Arc::new(InProcessTransport::new()), zero.clone())
        .err()
        .expect("refused");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // The infallible constructor falls back to the default timeout and
    // keeps the rest of the config (breakers stay off).
    let node = TestNode::with_config(NodeConfig {
        breaker: None,
        ..zero
    });
    node.pool("p")
        .handler(|m: u64, _ctx| async move { Ok(format!("{m}")) })
        .unwrap();
    assert_eq!(node.ask("p", 4).await.unwrap(), "4");
    assert!(node.stats().breakers.is_empty());
}

/// A zero stage deadline or processing timeout would fail or cancel every
/// ask at once: refused as the zero ask timeout is, naming the setting; the
/// infallible constructor falls back to the default deadlines.
#[tokio::test(start_paused = true)]
async fn zero_stage_deadlines_and_processing_timeouts_are_invalid() {
    let node: TestNode = Node::new();
    let err = node
        .pool("p")
        .config(askpool::PoolConfig {
            processing_timeout: Some(Duration::ZERO),
            ..Default::default()
        })
        .build()
        .err()
        .expect("refused");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("processing_timeout"), "{err}");
    for (name, timeouts) in [
        (
            "delivery",
            askpool::TimeoutConfig {
                delivery: Some(Duration::ZERO),
                ..Default::default()
            },
        ),
        (
            "read",
            askpool::TimeoutConfig {
                read: Some(Duration::ZERO),
                ..Default::default()
            },
        ),
        (
            "processing",
            askpool::TimeoutConfig {
                processing: Some(Duration::ZERO),
                ..Default::default()
            },
        ),
    ] {
        let config = NodeConfig {
            timeouts,
            ..NodeConfig::default()
        };
        let err = TestNode::try_with_transport(Arc::new(InProcessTransport::new()), config.clone())
            .err()
            .expect("refused");
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{name}: {err}");
        assert!(err.to_string().contains(name), "{name}: {err}");
        let node = TestNode::with_config(config);
        node.pool("p")
            .handler(|m: u64, _ctx| async move { Ok(format!("{m}")) })
            .unwrap();
        assert_eq!(node.ask("p", 5).await.unwrap(), "5", "{name}");
    }
}

/// An invalid retry policy in the node's config failed every ask it
/// governs: refused when the node is made, as the other settings are; the
/// infallible constructor falls back to the default policy (a pool's
/// invalid policy is dropped, so its asks take the node's).
#[tokio::test(start_paused = true)]
async fn an_invalid_retry_policy_in_the_node_config_is_refused_when_the_node_is_made() {
    let bad = RetryPolicy {
        max_attempts: 0,
        ..RetryPolicy::default()
    };
    let configs = [
        NodeConfig {
            retry: bad,
            ..NodeConfig::default()
        },
        NodeConfig {
            pool_retry: [(PoolName::new("p"), bad)].into_iter().collect(),
            ..NodeConfig::default()
        },
    ];
    for config in configs {
        let err = TestNode::try_with_transport(Arc::new(InProcessTransport::new()), config.clone())
            .err()
            .expect("refused");
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.to_string().contains("max_attempts"), "{err}");
        let node = TestNode::with_config(config);
        node.pool("p")
            .handler(|m: u64, _ctx| async move { Ok(format!("{m}")) })
            .unwrap();
        assert_eq!(node.ask("p", 6).await.unwrap(), "6");
    }
}

#[tokio::test(start_paused = true)]
async fn a_running_handler_is_told_when_its_pool_closes() {
    let node: TestNode = Node::new();
    let started = Arc::new(Notify::new());
    let told = Arc::clone(&started);
    let pool = node
        .pool("p")
        .handler(move |_m: u64, ctx| {
            let told = Arc::clone(&told);
            async move {
                told.notify_one();
                assert!(!ctx.is_cancelled());
                ctx.cancelled().await;
                assert!(ctx.is_cancelled());
                Ok("stopped".to_string())
            }
        })
        .unwrap();
    let ask = node.ask("p", 1).timeout(Duration::from_secs(60)).send();
    let ask = tokio::spawn(ask);
    started.notified().await;
    pool.close();
    // The handler hears of the close at once and answers; before, it ran
    // on until the caller's timeout, told nothing.
    let reply = tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .expect("answered at the close, not at the timeout")
        .unwrap();
    assert_eq!(reply.unwrap(), "stopped");
    assert_eq!(node.stats().pending, 0);
}

#[tokio::test(start_paused = true)]
async fn explicit_request_id_already_pending_is_refused() {
    let node: TestNode = Node::new();
    let _pool = node.pool("p").build().unwrap();
    let id = RequestId::from_parts(3, 3);
    let _first = node.ask("p", 1).request_id(id).send();
    let err = node.ask("p", 1).request_id(id).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

#[tokio::test(start_paused = true)]
async fn callers_on_two_nodes_never_share_cached_replies() {
    let tap = Tap::in_process();
    let worker_node = node_on(&tap);
    let runs = echo_pool(&worker_node, "p", Duration::ZERO);
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let other = Node::with_transport(transport, NodeConfig::default());
    let id = RequestId::from_parts(77, 77);
    worker_node.ask("p", 1).request_id(id).await.unwrap();
    other.ask("p", 2).request_id(id).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the dedup key includes the caller"
    );
}

#[tokio::test(start_paused = true)]
async fn progress_is_delivered_and_counts_as_an_ack() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    node.pool("p")
        .handler(|_msg: u64, ctx| async move {
            ctx.progress(0.5, "half").unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok("done".to_string())
        })
        .unwrap();
    // Acks are lost; progress alone must stop the re-sends.
    tap.set_rule(|f| match f.kind {
        FrameKind::Ack => Fate::Drop,
        _ => Fate::Deliver,
    });
    assert_eq!(node.ask("p", 1).await.unwrap(), "done");
    assert_eq!(tap.sent(FrameKind::Progress).len(), 1);
    // Without progress counting as an ack, re-sends would go out at 100 ms,
    // 300 ms, ... while the handler sleeps 2 s.
    assert_eq!(tap.sent(FrameKind::Request).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_node_cancels_what_its_pools_had_queued() {
    let transport: Arc<dyn WorkerTransport<u64, String>> =
        Arc::new(askpool::InProcessTransport::new());
    let host = Node::with_transport(transport.clone(), NodeConfig::default());
    let caller: TestNode = Node::with_transport(transport, NodeConfig::default());
    let _pool = host.pool("p").build().unwrap();
    let ask = caller.ask("p", 1).send();
    let ask = tokio::spawn(ask);
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(_pool);
    drop(host);
    let err = ask.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        AskError::AskCancelled {
            reason: CancelReason::Shutdown
        }
    );
    // The pool left the transport with its node.
    assert_eq!(
        caller.ask("p", 2).await.unwrap_err().code(),
        ErrorCode::NoRoute
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_awaiting_cancellation_stops_early() {
    let node: TestNode = Node::new();
    let stopped_early = Arc::new(AtomicUsize::new(0));
    let s = stopped_early.clone();
    node.pool("p")
        .handler(move |_msg: u64, ctx| {
            let s = s.clone();
            async move {
                tokio::select! {
                    _ = ctx.cancelled() => {
                        s.fetch_add(1, Ordering::SeqCst);
                        Err(AskError::AskCancelled { reason: CancelReason::Worker })
                    }
                    _ = tokio::time::sleep(Duration::from_secs(3600)) => Ok("finished".into()),
                }
            }
        })
        .unwrap();
    let started = tokio::time::Instant::now();
    let err = node
        .ask("p", 1)
        .timeout(Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AskTimeout);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(stopped_early.load(Ordering::SeqCst), 1);
    assert!(started.elapsed() < Duration::from_secs(2));
    let pool = node.stats().pool("p").cloned().unwrap();
    assert_eq!((pool.in_flight, pool.suppressed_replies), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn acks_within_one_tick_travel_as_one_batch() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    node.pool("p")
        .config(askpool::PoolConfig {
            batch_acks: true,
            ..askpool::PoolConfig::default()
        })
        .handler(|m: u64, _ctx| async move { Ok(m.to_string()) })
        .unwrap();
    let handles: Vec<_> = (0..50).map(|i| node.ask("p", i).send()).collect();
    let tell = node.tell("p", 99).send();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), i.to_string());
    }
    tell.await.unwrap();
    let batches = tap.sent(FrameKind::AckBatch);
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_eq!(batches[0].batch_len, 51);
    assert!(tap.sent(FrameKind::Ack).is_empty());
    assert_eq!(
        node.stats().retries,
        0,
        "the batch arrived before any re-send"
    );
}

/// Found by the fault simulation: an ask that reuses a request id with
/// another payload must not be completed by the stale outcome of the earlier
/// request; that outcome reconciles the earlier (timed-out) ask instead.
#[tokio::test(start_paused = true)]
async fn a_stale_outcome_never_completes_a_reused_id_with_another_payload() {
    let tap = Tap::in_process();
    let node = node_on(&tap);
    let late = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = late.clone();
    node.on_late_outcome(move |o| seen.lock().unwrap().push(o.result));
    echo_pool(&node, "p", Duration::from_secs(2));
    // The timeout's cancel is lost, so the first request runs to its end.
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        _ => Fate::Deliver,
    });
    let id = RequestId::from_parts(1, 42);
    let first = node
        .ask("p", 1)
        .request_id(id)
        .fingerprint(PayloadFingerprint::from_u128(1))
        .timeout(Duration::from_secs(1))
        .await;
    assert_eq!(first.unwrap_err().code(), ErrorCode::AskTimeout);
    // The second request (another payload) reaches the pool only after the
    // first one's reply reached the caller.
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        FrameKind::Request => Fate::Delay(Duration::from_secs(1)),
        _ => Fate::Deliver,
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = node
        .ask("p", 2)
        .request_id(id)
        .fingerprint(PayloadFingerprint::from_u128(2))
        .timeout(Duration::from_secs(5))
        .await;
    assert_eq!(
        second.map_err(|e| e.code()),
        Err(ErrorCode::PayloadMismatch)
    );
    let late = late.lock().unwrap();
    assert_eq!(late.len(), 1, "the stale reply reconciled the first ask");
    assert!(
        matches!(&late[0], askpool::LateResult::Reply(Ok(r)) if r == "echo 1"),
        "{late:?}"
    );
}

/// Found by the fault simulation: an ask refused before it was sent (its id
/// is already pending) ends its stage stream with REJECTED.
#[tokio::test(start_paused = true)]
async fn a_refused_ask_ends_its_stage_stream() {
    use askpool::AckStage;
    use futures::StreamExt;
    let tap = Tap::in_process();
    let node = node_on(&tap);
    echo_pool(&node, "p", Duration::from_secs(1));
    let id = RequestId::from_parts(1, 7);
    let first = node.ask("p", 1).request_id(id).send();
    let second = node.ask("p", 1).request_id(id).send();
    let stages = second.stages();
    assert_eq!(second.await.unwrap_err().code(), ErrorCode::InvalidArgument);
    let stages: Vec<AckStage> = stages.map(|e| e.stage).collect().await;
    assert_eq!(stages, vec![AckStage::Sent, AckStage::Rejected]);
    assert_eq!(first.await.unwrap(), "echo 1");
}

#[tokio::test(start_paused = true)]
async fn an_oversize_payload_fails_at_once_and_sends_nothing() {
    let tap = Tap::in_process();
    let node: TestNode = Node::with_transport(
        tap.clone(),
        NodeConfig {
            max_payload_bytes: Some(1_000),
            ..NodeConfig::default()
        },
    );
    let pool = node
        .pool("p")
        .handler(|m: u64, _ctx| async move { Ok(m.to_string()) })
        .unwrap();
    let err = node.ask("p", 1).payload_size(1_001).await.unwrap_err();
    assert_eq!(
        err,
        AskError::OversizePayload {
            size: 1_001,
            limit: 1_000
        }
    );
    assert_eq!(err.code(), ErrorCode::OversizePayload);
    let tell = node.tell("p", 2).payload_size(5_000).await.unwrap_err();
    assert!(matches!(
        tell,
        AskError::OversizePayload { size: 5_000, .. }
    ));
    assert!(tap.sent(FrameKind::Request).is_empty(), "nothing was sent");
    assert_eq!(pool.stats().admitted, 0);
    assert_eq!(node.stats().pending, 0);
    // At the limit, and without a known size, asks go through.
    assert_eq!(node.ask("p", 3).payload_size(1_000).await.unwrap(), "3");
    assert_eq!(node.ask("p", 4).await.unwrap(), "4");
    // No bound at all.
    let unbounded: TestNode = Node::with_config(NodeConfig {
        max_payload_bytes: None,
        ..NodeConfig::default()
    });
    let _pool = unbounded
        .pool("p")
        .handler(|m: u64, _ctx| async move { Ok(m.to_string()) })
        .unwrap();
    let big = unbounded.ask("p", 5).payload_size(usize::MAX).await;
    assert_eq!(big.unwrap(), "5");
}

#[tokio::test(start_paused = true)]
async fn a_handler_passing_on_an_inner_asks_error_fails_its_own_ask_as_handler_failed() {
    // `?` on an inner ask's timeout: the outer ask did not time out, and
    // must not be recorded so (timed out, a dead letter, a late record).
    let node: TestNode = Node::new();
    node.pool("slow")
        .handler(|_m: u64, _ctx| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok("late".to_string())
        })
        .unwrap();
    let inner = node.clone();
    node.pool("outer")
        .handler(move |m: u64, _ctx| {
            let inner = inner.clone();
            async move {
                if m == 1 {
                    inner
                        .ask("slow", m)
                        .timeout(Duration::from_millis(50))
                        .await
                } else {
                    inner.ask("nowhere", m).await
                }
            }
        })
        .unwrap();
    let timed_out = node.ask("outer", 1).timeout(Duration::from_secs(10)).await;
    match timed_out {
        Err(AskError::HandlerFailed { type_name, message }) => {
            assert_eq!(type_name, "AskError::AskTimeout");
            assert!(message.contains("timed out"), "{message}");
        }
        other => panic!("expected HandlerFailed, got {other:?}"),
    }
    let no_route = node.ask("outer", 2).timeout(Duration::from_secs(10)).await;
    assert!(
        matches!(&no_route, Err(AskError::HandlerFailed { type_name, .. }) if type_name == "AskError::NoRoute"),
        "{no_route:?}"
    );
    let stats = node.stats();
    // The inner ask's own timeout is the only one on record.
    assert_eq!(stats.timed_out_records, 1, "{stats:?}");
    assert_eq!(stats.dlq_depth, 1, "the inner ask's letter only: {stats:?}");
}

#[test]
fn a_handler_error_maps_as_the_bindings_map_it() {
    use askpool::CancelReason::*;
    let kept = [
        AskError::unavailable("db down"),
        AskError::InvalidArgument {
            message: "bad".into(),
        },
        AskError::handler_failed("ValueError", "no"),
        AskError::AskCancelled { reason: Worker },
    ];
    for error in kept {
        assert_eq!(error.clone().from_handler_error(), error);
    }
    for error in [
        AskError::AskCancelled { reason: Caller },
        AskError::DeadlineExceeded,
        AskError::PayloadMismatch,
    ] {
        let code = error.code();
        let mapped = error.clone().from_handler_error();
        assert_eq!(
            mapped,
            AskError::from_handler(Some(code), format!("AskError::{code:?}"), error.to_string())
        );
        assert_eq!(mapped.code(), ErrorCode::HandlerFailed);
    }
}
