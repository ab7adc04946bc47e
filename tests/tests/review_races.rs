//! Races and runtime corner cases a third review found (each test failed
//! before its fix): deadlines whose sweeper's runtime is dropped, a tell
//! whose Ack comes later, a reply crossing the caller's timeout, a late
//! reply after a stage deadline, acks batched by a task that never ran, a
//! pool closed between admitting a request and queueing it for a preferred
//! worker, `max_in_flight` under concurrent admits, and a late answer for a
//! request id that was evicted and asked again. Then what an audit against
//! the design found: the answer to a caller's own cancel taken for a late
//! outcome, a handler's transient error re-sent as if refused, re-sends in
//! lockstep for related ids, ids on every frame, and a reply lost to a
//! panicking transport (or a handler panicking before its future) that
//! stopped its worker.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use askpool::{AskError, Node};

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    f.poll(&mut Context::from_waker(&waker))
}

/// The sweeper's runtime is dropped after an ask on another runtime
/// entered its deadline: the ask is woken and starts a sweeper on its own
/// runtime (before, nothing did and it hung).
#[test]
fn an_ask_times_out_after_the_sweepers_runtime_is_dropped() {
    let rt1 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let node: Node<u64, u64> = Node::new();
    let _pool = node.pool("p").build().unwrap();
    rt1.block_on(async {
        let mut a = pin!(node.ask("p", 1).timeout(Duration::from_secs(60)).send());
        assert!(poll_once(a.as_mut()).is_pending());
        tokio::task::yield_now().await;
    });
    let node2 = node.clone();
    let ask = rt2.spawn(async move {
        node2
            .ask("p", 2)
            .timeout(Duration::from_millis(300))
            .send()
            .await
    });
    std::thread::sleep(Duration::from_millis(50)); // the ask is queued on the deadline queue
    drop(rt1); // the sweeper goes with it
    let got = rt2.block_on(async { tokio::time::timeout(Duration::from_secs(3), ask).await });
    match got {
        Ok(Ok(Err(AskError::AskTimeout { .. }))) => {}
        other => panic!("expected AskTimeout, got {other:?}"),
    }
}

/// A tell ends at its Ack, so an Ack that arrives after the send returned
/// (batch_acks here; any asynchronous transport) wakes it (before, the tell
/// waited for its next timer: the re-send time, 1 s by default).
#[tokio::test(start_paused = true)]
async fn a_tell_ends_when_its_later_ack_arrives() {
    let node: Node<u64, u64> = Node::new();
    let _pool = node
        .pool("p")
        .config(askpool::PoolConfig {
            batch_acks: true,
            ..Default::default()
        })
        .handler(|m: u64, _ctx| async move { Ok(m) })
        .unwrap();
    // Paused time: the re-send timer (at 0.8 s at the earliest) would show
    // as elapsed time; the flush that brings the Ack takes none.
    let started = tokio::time::Instant::now();
    node.tell("p", 1).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(100), "tell took {took:?}");
}

mod racing {
    use super::*;
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A reply that arrives between the handle deciding AskTimeout and
    /// removing its pending entry is a late outcome (before, it was stored
    /// in the finished handle's slot and lost). The worker replies while the
    /// caller's timeout Cancel goes out: the same instant on two threads.
    /// Routed through the transport, and handed straight to the closed slot
    /// by a transport that hands frames over directly.
    #[tokio::test(start_paused = true)]
    async fn a_reply_crossing_the_timeout_is_a_late_outcome() {
        for direct in [false, true] {
            let tap = Tap::in_process();
            if direct {
                tap.claim_direct();
            }
            let node: Node<u64, u64> =
                Node::with_transport(tap.clone(), askpool::NodeConfig::default());
            let late = Arc::new(AtomicUsize::new(0));
            let seen = late.clone();
            node.on_late_outcome(move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            });
            let pool = node.pool("p").build().unwrap();
            let handle = node.ask("p", 1).timeout(Duration::from_millis(100)).send();
            let id = handle.request_id();
            let ask = tokio::spawn(handle);
            let stash = Arc::new(Mutex::new(pool.next_request().await));
            let replier = Arc::clone(&stash);
            tap.set_rule(move |frame| {
                if frame.kind == FrameKind::Cancel {
                    if let Some(request) = replier.lock().unwrap().take() {
                        request.reply(7);
                    }
                }
                Fate::Deliver
            });
            let err = ask.await.unwrap().unwrap_err();
            assert!(matches!(err, AskError::AskTimeout { .. }), "{err:?}");
            assert!(stash.lock().unwrap().is_none(), "the worker replied");
            assert_eq!(
                late.load(Ordering::SeqCst),
                1,
                "the crossing reply is a late outcome (direct: {direct})"
            );
            assert!(
                node.dead_letter(id).is_none(),
                "the late outcome took the ask's dead letter (direct: {direct})"
            );
            assert_eq!(
                tap.sent(FrameKind::Reply).is_empty(),
                direct,
                "a direct reply passes the tap by"
            );
            node.shutdown();
        }
    }
}

mod stage_deadline {
    use super::*;
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An ask that failed DeadlineExceeded (recorded TIMED_OUT), whose
    /// cancel was lost and whose worker then replies: the reply reconciles
    /// and its dead letter goes (before, only AskTimeout was reconciled).
    #[tokio::test(start_paused = true)]
    async fn a_late_reply_after_a_stage_deadline_is_reconciled() {
        let tap = Tap::in_process();
        tap.set_rule(|frame| match frame.kind {
            FrameKind::Cancel => Fate::Drop,
            _ => Fate::Deliver,
        });
        let mut config = askpool::NodeConfig::default();
        config.timeouts.read = Some(Duration::from_millis(50));
        let node: Node<u64, u64> = Node::with_transport(tap.clone(), config);
        let late = Arc::new(AtomicUsize::new(0));
        let seen = late.clone();
        node.on_late_outcome(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        let pool = node.pool("p").build().unwrap();
        let err = node
            .ask("p", 1)
            .timeout(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, AskError::DeadlineExceeded), "{err:?}");
        let dl = node.dead_letters().len();
        let r = pool.next_request().await.unwrap();
        r.reply(5);
        assert_eq!(
            (late.load(Ordering::SeqCst), node.dead_letters().len(), dl),
            (1, 0, 1),
            "(late outcomes, dead letters after, dead letters before); ignored frames {}",
            node.stats().ignored_frames
        );
    }
}

mod own_cancel {
    use super::*;
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::{Arc, Mutex};

    /// The pool's answer to the caller's own timeout cancel, arriving after
    /// the ask ended (any delay on the way back), is not a late outcome:
    /// the work was cancelled, not done, so the ask's dead letter stays
    /// (before, it counted as a late outcome and took the letter).
    #[tokio::test(start_paused = true)]
    async fn the_answer_to_a_timeout_cancel_is_not_a_late_outcome() {
        let tap = Tap::in_process();
        tap.set_rule(|frame| match frame.kind {
            FrameKind::Cancelled => Fate::Delay(Duration::from_millis(10)),
            _ => Fate::Deliver,
        });
        let node: Node<u64, u64> =
            Node::with_transport(tap.clone(), askpool::NodeConfig::default());
        let late = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&late);
        node.on_late_outcome(move |outcome| {
            seen.lock().unwrap().push(format!("{:?}", outcome.result));
        });
        let _pool = node
            .pool("p")
            .handler(|m: u64, _ctx| async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(m)
            })
            .unwrap();
        let ask = node.ask("p", 1).timeout(Duration::from_secs(1)).send();
        let id = ask.request_id();
        let err = ask.await.unwrap_err();
        assert!(matches!(err, AskError::AskTimeout { .. }), "{err:?}");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(*late.lock().unwrap(), Vec::<String>::new());
        assert_eq!(node.stats().late_outcomes, 0);
        assert!(node.dead_letter(id).is_some(), "the letter stays");
    }
}

mod cached_transient {
    use super::*;
    use askpool_tests::{FrameKind, Tap};

    /// A handler's transient error is its request's outcome, cached like
    /// any reply: the caller gets it at once and re-sends nothing, even
    /// when it comes after the delivery deadline (before, the ask was
    /// re-sent, answered from the cache each time, and surfaced seconds
    /// late; or failed DeadlineExceeded and lost the handler's error).
    /// Only a pool's refusal (nothing cached) is re-sent.
    #[tokio::test(start_paused = true)]
    async fn a_handlers_transient_error_is_final() {
        for work in [Duration::ZERO, Duration::from_secs(12)] {
            let tap = Tap::in_process();
            let node: Node<u64, u64> =
                Node::with_transport(tap.clone(), askpool::NodeConfig::default());
            let _pool = node
                .pool("p")
                .handler(move |_m: u64, _ctx| async move {
                    tokio::time::sleep(work).await;
                    Err::<u64, _>(AskError::unavailable("downstream is down"))
                })
                .unwrap();
            let started = tokio::time::Instant::now();
            let err = node
                .ask("p", 1)
                .timeout(Duration::from_secs(60))
                .await
                .unwrap_err();
            assert!(
                matches!(&err, AskError::Unavailable { reason } if reason.contains("downstream")),
                "after {work:?}: {err:?}"
            );
            assert_eq!(started.elapsed(), work, "at once");
            assert_eq!(tap.sent(FrameKind::Request).len(), 1, "never re-sent");
            assert!(tap.sent(FrameKind::Cancel).is_empty());
        }
    }
}

mod jitter {
    use super::*;
    use askpool::{NodeConfig, RequestId};
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    /// When each request frame went out, by (caller, request id).
    type Sends = Arc<Mutex<BTreeMap<(u64, u128), Vec<Duration>>>>;

    /// Asks whose ids share a half (ids a user builds), or the same id
    /// asked by two callers, re-send on schedules of their own (before, the
    /// jitter was seeded by the nonce alone, so they re-sent in lockstep).
    #[tokio::test(start_paused = true)]
    async fn asks_with_related_ids_do_not_resend_in_lockstep() {
        let tap = Tap::in_process();
        let sends: Sends = Arc::default();
        let log = Arc::clone(&sends);
        let start = tokio::time::Instant::now();
        tap.set_rule(move |frame| {
            if frame.kind != FrameKind::Request {
                return Fate::Deliver;
            }
            let key = (frame.ids.caller_id.as_u64(), frame.ids.request_id.as_u128());
            log.lock()
                .unwrap()
                .entry(key)
                .or_default()
                .push(start.elapsed());
            Fate::Drop
        });
        let a: Node<u64, u64> = Node::with_transport(tap.clone(), NodeConfig::default());
        let b: Node<u64, u64> = Node::with_transport(tap.clone(), NodeConfig::default());
        let _pool = a
            .pool("p")
            .handler(|m: u64, _ctx| async move { Ok(m) })
            .unwrap();
        let ask = |node: &Node<u64, u64>, id| {
            node.ask("p", 1)
                .request_id(id)
                .timeout(Duration::from_secs(10))
                .send()
        };
        let (shared_nonce, other_time) = (RequestId::from_parts(1, 7), RequestId::from_parts(2, 7));
        let results = futures::future::join_all([
            ask(&a, shared_nonce),
            ask(&a, other_time),
            ask(&b, shared_nonce),
        ])
        .await;
        assert!(
            results.iter().all(Result::is_err),
            "every request was dropped"
        );
        let sends = sends.lock().unwrap();
        let schedules: Vec<&Vec<Duration>> = sends.values().collect();
        assert_eq!(schedules.len(), 3);
        assert!(
            schedules.iter().all(|s| s.len() >= 2),
            "re-sent: {schedules:?}"
        );
        for (i, x) in schedules.iter().enumerate() {
            for y in &schedules[i + 1..] {
                assert_ne!(x[1], y[1], "the same re-send time: {schedules:?}");
            }
        }
    }
}

mod ids_on_every_frame {
    use super::*;
    use askpool::{AskIds, CausationId, CorrelationId, NodeConfig, RequestId};
    use askpool_tests::{FrameKind, Tap};
    use std::sync::{Arc, Mutex};

    /// DESIGN section 2: the ids travel unchanged. Every frame back to the
    /// caller (Ack, Read, Progress, Reply, a replayed Reply, Cancelled), the
    /// handler's context and a dead letter's replay carry the ask's request,
    /// correlation, causation and caller ids.
    #[tokio::test(start_paused = true)]
    async fn every_frame_carries_the_asks_ids() {
        let tap = Tap::in_process();
        let node: Node<u64, u64> = Node::with_transport(tap.clone(), NodeConfig::default());
        let seen: Arc<Mutex<Vec<AskIds>>> = Arc::default();
        let in_handler = Arc::clone(&seen);
        let _pool = node
            .pool("p")
            .handler(move |m: u64, ctx| {
                in_handler.lock().unwrap().push(*ctx.ids());
                async move {
                    ctx.progress(0.5, "half").unwrap();
                    if m == 0 {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Ok(m)
                }
            })
            .unwrap();
        let ask = |m: u64, id: u128, timeout: Duration| {
            node.ask("p", m)
                .request_id(RequestId::from_u128(id))
                .correlation_id(CorrelationId::from_u128(id + 1))
                .causation_id(CausationId::from_u128(id + 2))
                .timeout(timeout)
                .send()
        };
        let expect = |id: u128| AskIds {
            request_id: RequestId::from_u128(id),
            correlation_id: CorrelationId::from_u128(id + 1),
            causation_id: Some(CausationId::from_u128(id + 2)),
            caller_id: node.caller_id(),
        };
        let long = Duration::from_secs(30);
        // Live: Ack, Read, Progress, Reply; then a replay from the cache.
        assert_eq!(ask(1, 100, long).await.unwrap(), 1);
        assert_eq!(ask(1, 100, long).await.unwrap(), 1);
        // Timed out (a dead letter), its cancel answered Cancelled; then
        // replayed from the dead-letter queue: the pool answers Cancelled
        // again (the request was cancelled, first terminal state wins).
        assert!(ask(0, 200, Duration::from_millis(50)).await.is_err());
        tokio::time::sleep(Duration::from_millis(10)).await;
        let replay = node.replay_dead_letter(RequestId::from_u128(200)).unwrap();
        let err = replay.await.unwrap_err();
        assert!(matches!(err, AskError::AskCancelled { .. }), "{err:?}");
        assert_eq!(tap.sent(FrameKind::Cancelled).len(), 2);
        for kind in [
            FrameKind::Ack,
            FrameKind::Read,
            FrameKind::Progress,
            FrameKind::Reply,
            FrameKind::Cancelled,
            FrameKind::Request,
            FrameKind::Cancel,
        ] {
            let frames = tap.sent(kind);
            assert!(!frames.is_empty(), "no {kind:?} frame");
            for f in frames {
                let id = f.ids.request_id.as_u128();
                assert_eq!(f.ids, expect(id), "{kind:?}");
            }
        }
        assert_eq!(tap.sent(FrameKind::Reply).len(), 2, "live and replayed");
        let handler_ids = seen.lock().unwrap().clone();
        assert_eq!(handler_ids.len(), 2, "one run per request id");
        for ids in handler_ids {
            assert_eq!(ids, expect(ids.request_id.as_u128()));
        }
    }
}

mod panic_gap {
    use super::*;
    use askpool::{NodeConfig, RequestId};
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    /// DESIGN section 3: the terminal record is written before the reply is
    /// handed to the transport. A transport that panics on the reply loses
    /// that frame only: the ask asked again is answered from the cache
    /// (the handler ran once), and the pool goes on serving.
    #[tokio::test(start_paused = true)]
    async fn a_reply_lost_to_a_panicking_transport_is_replayed() {
        let tap = Tap::in_process();
        let panicked = Arc::new(AtomicBool::new(false));
        let once = Arc::clone(&panicked);
        tap.set_rule(move |frame| {
            if frame.kind == FrameKind::Reply && !once.swap(true, Ordering::SeqCst) {
                panic!("the transport broke while sending a reply");
            }
            Fate::Deliver
        });
        let node: Node<u64, u64> = Node::with_transport(tap.clone(), NodeConfig::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let _pool = node
            .pool("p")
            .handler(move |m: u64, _ctx| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok(m * 10) }
            })
            .unwrap();
        let id = RequestId::from_u128(42);
        let first = node
            .ask("p", 4)
            .request_id(id)
            .timeout(Duration::from_millis(200))
            .await;
        assert!(panicked.load(Ordering::SeqCst));
        assert!(
            matches!(first, Err(AskError::AskTimeout { .. })),
            "{first:?}"
        );
        let again = node.ask("p", 4).request_id(id).await.unwrap();
        assert_eq!(again, 40, "replayed from the cache");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
        let fresh = node.ask("p", 5).timeout(Duration::from_secs(5)).await;
        assert_eq!(fresh.unwrap(), 50, "the pool still serves");
    }

    /// A handler that panics before it returns its future fails that
    /// request like one that panics while it runs, and its worker goes on
    /// (before, the panic ended the worker's loop: its pool stopped).
    #[tokio::test(start_paused = true)]
    async fn a_handler_panicking_before_its_future_fails_only_its_request() {
        let node: Node<u64, u64> = Node::new();
        let _pool = node
            .pool("p")
            .handler(|m: u64, _ctx| {
                assert!(m != 0, "zero is not a message");
                async move { Ok(m) }
            })
            .unwrap();
        match node.ask("p", 0).await {
            Err(AskError::HandlerFailed { type_name, message }) => {
                assert_eq!(type_name, "panic");
                assert!(message.contains("zero is not a message"), "{message}");
            }
            other => panic!("expected HandlerFailed, got {other:?}"),
        }
        let next = node.ask("p", 3).timeout(Duration::from_secs(5)).await;
        assert_eq!(next.unwrap(), 3, "the worker goes on");
    }
}

mod stale_refusal {
    use super::*;
    use askpool::{NodeConfig, RetryPolicy};
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Attempt 1 is refused BufferFull and the refusal comes back late;
    /// attempt 2 is admitted and acked before it. The late refusal must not
    /// end the ask (no attempts left) nor re-open its re-sends (a passed
    /// delivery deadline then failed it): the pool holds the request.
    async fn stale_refusal(config: NodeConfig, max_attempts: u32) -> Result<u64, AskError> {
        let tap = Tap::in_process();
        let delayed = Arc::new(AtomicBool::new(false));
        let once = Arc::clone(&delayed);
        tap.set_rule(move |frame| {
            if frame.kind == FrameKind::Refused && !once.swap(true, Ordering::SeqCst) {
                return Fate::Delay(Duration::from_secs(3));
            }
            Fate::Deliver
        });
        let node: Node<u64, u64> = Node::with_transport(tap.clone(), config);
        let _pool = node
            .pool("p")
            .max_in_flight(1)
            .handler(|m: u64, _ctx| async move {
                tokio::time::sleep(Duration::from_millis(m)).await;
                Ok(m)
            })
            .unwrap();
        let blocker = node.ask("p", 500).timeout(Duration::from_secs(60)).send();
        tokio::task::yield_now().await;
        let policy = RetryPolicy {
            max_attempts,
            initial_delay: Duration::from_secs(1),
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let ask = node
            .ask("p", 5_000)
            .retry(policy)
            .timeout(Duration::from_secs(60))
            .send();
        let (blocked, result) = futures::join!(blocker, ask);
        assert_eq!(blocked.unwrap(), 500);
        assert!(delayed.load(Ordering::SeqCst), "the refusal came back late");
        result
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_refusal_does_not_end_an_acked_ask() {
        let result = stale_refusal(NodeConfig::default(), 2).await;
        assert_eq!(result.unwrap(), 5_000, "attempt 2 was admitted and ran");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_refusal_does_not_reopen_a_passed_delivery_deadline() {
        let mut config = NodeConfig::default();
        config.timeouts.delivery = Some(Duration::from_secs(2));
        let result = stale_refusal(config, 4).await;
        assert_eq!(
            result.unwrap(),
            5_000,
            "acked at 1 s, within its delivery deadline"
        );
    }
}

/// The batch_acks flush task is spawned on whatever runtime delivered the
/// first ack; dropped unrun, it flushes all the same (before, no ack of that
/// pool was ever sent again and the buffer grew without bound).
#[test]
fn batched_acks_go_on_after_a_flush_task_is_dropped() {
    let node: Node<u64, u64> = Node::new();
    let _pool = node
        .pool("p")
        .config(askpool::PoolConfig {
            batch_acks: true,
            ..Default::default()
        })
        .build()
        .unwrap();
    {
        let rt1 = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt1.block_on(async {
            let t = node.tell("p", 1).send(); // ack buffered, flush spawned on rt1
            std::mem::forget(t); // keep it from cancelling; irrelevant to the bug
        });
    } // rt1 dropped with the flush task unrun
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let got = rt2.block_on(async { node.tell("p", 2).timeout(Duration::from_secs(3)).await });
    assert!(got.is_ok(), "tell 2 never acknowledged: {got:?}");
}

mod close_race {
    use super::*;
    use askpool_tests::{Fate, FrameKind, Tap};
    use std::sync::{Arc, Mutex};

    /// Closes the pool while it sends its Ack, i.e. between admission and
    /// enqueue (another thread closing at that instant), with a pull worker
    /// kept alive (as a binding's handle may be) that never pulls.
    async fn run(preferred: bool) -> (Result<u64, AskError>, usize) {
        let tap = Tap::in_process();
        let node: Node<u64, u64> =
            Node::with_transport(tap.clone(), askpool::NodeConfig::default());
        let pool = Arc::new(node.pool("p").build().unwrap());
        let _w = pool.worker("w").unwrap();
        let to_close = Mutex::new(Some(Arc::clone(&pool)));
        tap.set_rule(move |frame| {
            if frame.kind == FrameKind::Ack {
                if let Some(pool) = to_close.lock().unwrap().take() {
                    pool.close();
                }
            }
            Fate::Deliver
        });
        let b = node.ask("p", 1).timeout(Duration::from_secs(2));
        let b = if preferred {
            b.preferred_worker("w")
        } else {
            b
        };
        let r = b.await;
        (r, pool.stats().in_flight)
    }

    /// The shared-queue variant (fixed after the second review).
    #[tokio::test(start_paused = true)]
    async fn a_close_between_admit_and_queue_cancels_the_request() {
        let (r, in_flight) = run(false).await;
        assert!(matches!(r, Err(AskError::AskCancelled { .. })), "{r:?}");
        assert_eq!(in_flight, 0);
    }

    /// The same race with a preferred worker whose `Worker` lives on and
    /// never pulls: the request is cancelled (before, it landed in the inbox
    /// behind the Closed sentinel and stayed in flight forever).
    #[tokio::test(start_paused = true)]
    async fn a_close_between_admit_and_a_preferred_workers_inbox_cancels_the_request() {
        let (r, in_flight) = run(true).await;
        assert!(
            matches!(r, Err(AskError::AskCancelled { .. })),
            "{r:?} (in flight {in_flight})"
        );
        assert_eq!(in_flight, 0);
    }
}

/// `max_in_flight` holds when several threads admit different keys at once
/// (before, each admit checked the count inside its own key's lock, so all
/// of them could pass it).
#[test]
fn max_in_flight_holds_under_concurrent_admits() {
    let mut worst = 0;
    for _ in 0..200 {
        let node: Node<u64, u64> = Node::new();
        let pool = node.pool("p").max_in_flight(1).build().unwrap();
        let barrier = std::sync::Barrier::new(4);
        let handles: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|i| {
                    let (node, barrier) = (&node, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        node.ask("p", i).send()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        worst = worst.max(pool.stats().in_flight);
        drop(handles);
    }
    assert!(worst <= 1, "in flight reached {worst} with max_in_flight 1");
}

/// A request cancelled while its handler runs, whose entry is then evicted
/// and whose request id is asked again: the old handler's late answer goes
/// nowhere, and the new request's own answer is the one its caller gets
/// (before, the old answer ended the new request).
#[tokio::test(start_paused = true)]
async fn a_late_answer_for_a_reused_key_does_not_end_the_new_request() {
    let node: Node<u64, u64> = Node::new();
    let pool = node
        .pool("p")
        .dedup(askpool::DedupConfig {
            max_terminal: 1,
            ..Default::default()
        })
        .build()
        .unwrap();
    let id = askpool::RequestId::from_parts(1, 42);
    let mut first = node.ask("p", 1).request_id(id).send();
    let stale = pool.next_request().await.unwrap();
    first.cancel();
    assert!(matches!(first.await, Err(AskError::AskCancelled { .. })));
    // Another finished request evicts the cancelled one's entry.
    let other = tokio::spawn(node.ask("p", 2).send());
    pool.next_request().await.unwrap().reply(20);
    assert_eq!(other.await.unwrap().unwrap(), 20);
    // The same id again: a new request, with a handler of its own.
    let second = tokio::spawn(node.ask("p", 3).request_id(id).send());
    let fresh = pool.next_request().await.unwrap();
    stale.reply(10);
    fresh.reply(30);
    assert_eq!(second.await.unwrap().unwrap(), 30);
    assert_eq!(pool.stats().in_flight, 0);
}
