//! A node's own pools answer its asks straight into their pending slots when
//! the transport hands frames over directly (the in-process transport), and
//! through the transport otherwise. Both ways must end every ask alike.

use std::sync::Arc;
use std::time::Duration;

use askpool::{
    AckStage, AskError, InProcessTransport, Node, NodeConfig, NodeStats, PayloadFingerprint,
    RequestId, WorkerTransport,
};
use askpool_tests::{FrameKind, Tap};
use futures::StreamExt;

type TestNode = Node<u64, String>;

/// An in-process tap that says it hands frames over directly or not.
fn tap(direct: bool) -> Arc<Tap<u64, String>> {
    let tap = Tap::in_process();
    if direct {
        tap.claim_direct();
    }
    tap
}

/// Frames the tap routed back to callers.
fn routed_back(tap: &Tap<u64, String>) -> usize {
    [
        FrameKind::Ack,
        FrameKind::Read,
        FrameKind::Progress,
        FrameKind::Reply,
    ]
    .into_iter()
    .map(|kind| tap.sent(kind).len())
    .sum()
}

fn config() -> NodeConfig {
    NodeConfig {
        seed: Some(11),
        ..NodeConfig::default()
    }
}

fn echo_pool(node: &TestNode) {
    node.pool("p")
        .handler(|m: u64, ctx| async move {
            ctx.progress(0.5, "half").unwrap();
            Ok(format!("r{m}"))
        })
        .unwrap();
}

#[test]
fn only_the_in_process_transport_hands_frames_over_directly() {
    assert!(InProcessTransport::<u64, String>::new().hands_over_directly());
    // A wrapper that does not say so routes every frame (the default).
    assert!(!Tap::<u64, String>::in_process().hands_over_directly());
}

#[tokio::test(start_paused = true)]
async fn a_direct_transport_carries_no_frame_back_for_a_nodes_own_asks() {
    for direct in [true, false] {
        let transport = tap(direct);
        let node: TestNode = Node::with_transport(transport.clone(), config());
        echo_pool(&node);
        let handle = node.ask("p", 7).send();
        let stages = handle.stages();
        assert_eq!(handle.await.unwrap(), "r7");
        use AckStage::*;
        let seen: Vec<AckStage> = stages.map(|e| e.stage).collect().await;
        assert_eq!(seen, vec![Sent, Received, Read, Partial, Fulfilled]);
        let routed = routed_back(&transport);
        if direct {
            assert_eq!(
                routed, 0,
                "Ack, Read, Progress and Reply went straight to the slot"
            );
        } else {
            assert_eq!(routed, 4, "Ack, Read, Progress and Reply were routed");
        }
        node.shutdown();
    }
}

/// Asks of every ending, the same on any node; what each got, the stages
/// it went through, and the node's counters after.
async fn scenario(node: TestNode) -> (Vec<String>, Vec<Vec<AckStage>>, NodeStats) {
    node.pool("p")
        .handler(|m: u64, ctx| async move {
            match m % 10 {
                0 => {
                    ctx.progress(0.25, "a quarter").unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ctx.progress(0.75, "most").unwrap();
                    Ok(format!("ok{m}"))
                }
                1 => Err(AskError::handler_failed("Boom", format!("no {m}"))),
                2 => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(format!("slow{m}"))
                }
                6 => {
                    // Done in the instant its caller's timeout fires.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(format!("edge{m}"))
                }
                3 => {
                    ctx.cancelled().await;
                    // Progress of an ask that ended: no slot takes it.
                    ctx.progress(1.0, "too late").unwrap();
                    Ok("after cancel".into())
                }
                _ => Ok(format!("plain{m}")),
            }
        })
        .unwrap();
    let mut outcomes = Vec::new();
    let mut stages = Vec::new();
    let show = |r: Result<String, AskError>| match r {
        Ok(s) => s,
        Err(e) => format!("{:?}: {e}", e.code()),
    };
    let mut asks: Vec<(u64, Option<Duration>)> = vec![(0, None), (1, None), (2, None)];
    asks.push((12, Some(Duration::from_millis(50))));
    asks.push((4, None));
    asks.push((6, Some(Duration::from_millis(50))));
    for (m, timeout) in asks {
        let mut b = node.ask("p", m);
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        let h = b.send();
        let s = h.stages();
        outcomes.push(show(h.await));
        stages.push(s.map(|e| e.stage).collect::<Vec<_>>().await);
    }
    // Cancelled by its caller while it runs.
    let mut h = node.ask("p", 3).send();
    let s = h.stages();
    tokio::time::sleep(Duration::from_millis(1)).await;
    h.cancel();
    outcomes.push(show(h.await));
    stages.push(s.map(|e| e.stage).collect::<Vec<_>>().await);
    // Dropped while it runs.
    drop(node.ask("p", 13).send());
    // A tell.
    node.tell("p", 5).await.unwrap();
    // One id asked twice (the second answered from the reply cache), then
    // with another payload.
    let id = RequestId::from_parts(1, 2);
    let fp = PayloadFingerprint::from_u128(20);
    for (m, fp) in [(20, fp), (20, fp), (21, PayloadFingerprint::from_u128(21))] {
        let h = node.ask("p", m).request_id(id).fingerprint(fp).send();
        let s = h.stages();
        outcomes.push(show(h.await));
        stages.push(s.map(|e| e.stage).collect::<Vec<_>>().await);
    }
    // Let every handler and timer run out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = node.stats();
    node.shutdown();
    (outcomes, stages, stats)
}

#[tokio::test(start_paused = true)]
async fn direct_and_routed_frames_end_every_ask_alike() {
    let direct = scenario(Node::with_config(config())).await;
    let routed = scenario(Node::with_transport(Tap::in_process(), config())).await;
    assert_eq!(direct.0, routed.0, "the same outcomes");
    assert_eq!(direct.1, routed.1, "the same stages");
    assert_eq!(direct.2, routed.2, "the same counters");
    // The scenario reaches the paths it means to.
    let codes = &direct.0;
    assert_eq!(codes[0], "ok0");
    assert!(codes[1].starts_with("HandlerFailed"), "{codes:?}");
    assert!(codes[3].starts_with("AskTimeout"), "{codes:?}");
    assert!(codes[6].starts_with("AskCancelled"), "{codes:?}");
    assert_eq!(codes[7], codes[8], "a replay is the first reply");
    assert!(codes[9].starts_with("PayloadMismatch"), "{codes:?}");
    let pool = direct.2.pool("p").unwrap();
    assert_eq!(pool.replays, 1);
    assert_eq!(pool.payload_mismatches, 1);
    assert!(pool.suppressed_replies >= 2, "{pool:?}");
    assert!(direct.2.ignored_frames >= 2, "{:?}", direct.2);
    assert_eq!(direct.2.pending, 0);
}

#[tokio::test(start_paused = true)]
async fn a_routed_node_still_shows_every_frame_to_its_transport() {
    let tap = Tap::in_process();
    let node: TestNode = Node::with_transport(tap.clone(), config());
    echo_pool(&node);
    assert_eq!(node.ask("p", 1).await.unwrap(), "r1");
    for kind in [FrameKind::Ack, FrameKind::Read, FrameKind::Reply] {
        assert_eq!(tap.delivered(kind).len(), 1, "{kind:?}");
    }
    node.shutdown();
}

/// Counts the wake-ups of a task, and so (by its `Arc`) who holds its waker.
struct CountingWake(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWake {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A pool kept after its node is gone (a pull worker) keeps nothing of the
/// node's caller side (late hook, dead letters, timed-out records): the
/// pool lets go of it when it closes (review of the direct hand-over).
#[test]
fn a_worker_outliving_its_node_keeps_none_of_the_nodes_caller_state() {
    let node: TestNode = Node::new();
    let token = Arc::new(());
    let held = Arc::clone(&token);
    node.on_late_outcome(move |_| {
        let _ = &held;
    });
    let pool = node.pool("p").build().unwrap();
    let worker = pool.worker("w").unwrap();
    drop(pool);
    drop(node);
    assert_eq!(
        Arc::strong_count(&token),
        1,
        "the late hook went with the node"
    );
    drop(worker);
}

/// An ask that ended leaves nothing of its caller (its task's waker, its
/// spans, its stage log) in the request its pool still holds: a tell acked
/// at once, queued with nobody pulling (review of the direct hand-over).
#[tokio::test]
async fn a_finished_tell_leaves_nothing_of_its_caller_in_the_pool() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let node: TestNode = Node::new();
    let pool = node.pool("p").build().unwrap();
    let counter = Arc::new(CountingWake(Default::default()));
    let waker = Waker::from(Arc::clone(&counter));
    let mut tell = node.tell("p", 1).send();
    let mut cx = Context::from_waker(&waker);
    assert!(
        std::pin::Pin::new(&mut tell).poll(&mut cx).is_ready(),
        "acked at once"
    );
    drop(tell);
    drop(waker);
    assert_eq!(Arc::strong_count(&counter), 1, "no one holds the waker");
    assert_eq!(pool.stats().queued, 1, "the request still waits");
    drop(pool);
}

mod equivalence {
    use std::time::Duration;

    use askpool::{AskError, Node, NodeConfig, PayloadFingerprint, PoolConfig, RequestId};
    use askpool_tests::Tap;
    use futures::StreamExt;

    type N = Node<u64, u64>;

    fn show(r: Result<u64, AskError>) -> String {
        match r {
            Ok(v) => format!("ok {v}"),
            Err(e) => format!("{:?}", e.code()),
        }
    }

    /// An id reused after its pool was closed and made again while the first
    /// request runs, with and without fingerprints; batch_acks; a tell; a
    /// shutdown under a running handler (from the review of the direct
    /// hand-over).
    async fn scenario(node: N) -> (Vec<String>, Vec<Vec<askpool::AckStage>>, String) {
        let mut out = Vec::new();
        let mut stages = Vec::new();
        let id = RequestId::from_parts(9, 9);
        for fp in [None, Some((1u128, 2u128))] {
            let p1 = node.pool("p").build().unwrap();
            let mut a = node.ask("p", 1).request_id(id);
            if let Some((f, _)) = fp {
                a = a.fingerprint(PayloadFingerprint::from_u128(f));
            }
            let a = a.send();
            let ra = p1.next_request().await.unwrap();
            p1.close(); // ra keeps running
            drop(a); // its cancel finds no pool
            let p2 = node.pool("p").build().unwrap();
            let mut b = node
                .ask("p", 2)
                .request_id(id)
                .timeout(Duration::from_millis(50));
            if let Some((_, f)) = fp {
                b = b.fingerprint(PayloadFingerprint::from_u128(f));
            }
            let b = b.send();
            let s = b.stages();
            ra.reply(111); // the first request's late reply
            out.push(show(b.await));
            stages.push(s.map(|e| e.stage).collect().await);
            p2.close();
        }
        // batch_acks and a tell
        let p = node
            .pool("q")
            .config(PoolConfig {
                batch_acks: true,
                ..PoolConfig::default()
            })
            .handler(|m: u64, ctx| async move {
                ctx.progress(0.5, "x").unwrap();
                Ok(m + 1)
            })
            .unwrap();
        for m in 0..3u64 {
            let h = node.ask("q", m).send();
            let s = h.stages();
            out.push(show(h.await));
            stages.push(s.map(|e| e.stage).collect().await);
        }
        node.tell("q", 7).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // shutdown while a handler runs
        let r = node.pool("r").build().unwrap();
        let h = tokio::spawn(node.ask("r", 5).send());
        let req = r.next_request().await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stats = format!("{:?}", node.stats());
        node.shutdown();
        req.reply(6);
        out.push(show(h.await.unwrap()));
        drop(p);
        (out, stages, stats)
    }

    #[tokio::test(start_paused = true)]
    async fn direct_and_routed_alike_on_id_reuse_batch_acks_tells_shutdown() {
        let cfg = || NodeConfig {
            seed: Some(3),
            ..NodeConfig::default()
        };
        let direct = scenario(Node::with_config(cfg())).await;
        let routed = scenario(Node::with_transport(Tap::in_process(), cfg())).await;
        assert_eq!(direct.0, routed.0);
        assert_eq!(direct.1, routed.1);
        assert_eq!(direct.2, routed.2);
    }
}

mod mt_stress {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use askpool::{
        AskError, DedupConfig, Node, NodeConfig, PayloadFingerprint, PoolConfig, RequestId,
    };
    use rand::Rng;

    /// Ids reused back to back (each ask its own fingerprint and message),
    /// replies racing timeouts and drops, on two threads: no ask ever gets
    /// another's reply, nothing stays pending.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reused_ids_never_get_anothers_reply() {
        let node: Node<u64, u64> = Node::with_config(NodeConfig {
            breaker: None,
            ..NodeConfig::default()
        });
        node.pool("p")
            .config(PoolConfig {
                concurrency: 4,
                dedup: DedupConfig {
                    max_terminal: 4,
                    terminal_ttl: Duration::from_micros(1),
                },
                ..PoolConfig::default()
            })
            .handler(|m: u64, ctx| async move {
                let us = rand::rng().random_range(0..1500);
                tokio::time::sleep(Duration::from_micros(us)).await;
                ctx.progress(0.5, "half").unwrap();
                Ok(m * 10)
            })
            .unwrap();
        let wrong = Arc::new(AtomicU64::new(0));
        let ok = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(1));
        let mut tasks = Vec::new();
        for k in 0..8u64 {
            let (node, wrong, ok, next) = (node.clone(), wrong.clone(), ok.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let id = RequestId::from_parts(77, k);
                for _ in 0..400 {
                    let m = next.fetch_add(1, Ordering::Relaxed);
                    let h = node
                        .ask("p", m)
                        .request_id(id)
                        .fingerprint(PayloadFingerprint::from_u128(m as u128))
                        .timeout(Duration::from_micros(rand::rng().random_range(200..2000)))
                        .send();
                    let r: Result<u64, AskError> = if m % 5 == 0 {
                        match tokio::time::timeout(Duration::from_micros(300), h).await {
                            Ok(r) => r,
                            Err(_) => continue,
                        }
                    } else {
                        h.await
                    };
                    match r {
                        Ok(v) if v == m * 10 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {}
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = node.stats();
        assert!(ok.load(Ordering::Relaxed) > 0, "{:?}", stats.pools[0]);
        assert_eq!(wrong.load(Ordering::Relaxed), 0);
        assert_eq!(stats.pending, 0);
        node.shutdown();
    }
}

/// A timed-out ask's dead letter keeps a replay hook holding the last clone
/// of its node. The pool's late reply is reconciled and takes the letter;
/// the node goes with it, and its drop empties the caller side
/// (`CallerSide::forget`), which locks the dead-letter queue: the letter
/// must be dropped after that lock is released, or the replying thread
/// deadlocks (second review of the direct hand-over). Routed and direct.
mod late_reply_drops_the_last_node {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use askpool::{AskError, Node, NodeConfig};
    use askpool_tests::{Fate, FrameKind, Tap};

    struct Flag(Arc<AtomicUsize>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn run(direct: bool) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let transport = Tap::<u64, u64>::in_process();
        if direct {
            transport.claim_direct();
        }
        // The timeout's cancel is lost: the pool answers after all.
        transport.set_rule(|f| {
            if f.kind == FrameKind::Cancel {
                Fate::Drop
            } else {
                Fate::Deliver
            }
        });
        let node: Node<u64, u64> = Node::with_transport(transport, NodeConfig::default());
        let dropped = Arc::new(AtomicUsize::new(0));
        let late = Arc::new(AtomicUsize::new(0));
        let request = rt.block_on(async {
            let pool = node.pool("p").build().unwrap();
            let kept = (node.clone(), Flag(dropped.clone()));
            let seen = late.clone();
            node.on_late_outcome(move |_| {
                seen.fetch_add(1, Ordering::SeqCst);
            });
            let handle = node
                .ask("p", 1)
                .timeout(Duration::from_millis(50))
                .on_replay_outcome(move |_| {
                    let _ = &kept;
                })
                .send();
            let id = handle.request_id();
            let ask = tokio::spawn(handle);
            let request = pool.next_request().await.unwrap();
            let err = ask.await.unwrap().unwrap_err();
            assert!(matches!(err, AskError::AskTimeout { .. }), "{err:?}");
            assert!(node.dead_letter(id).is_some(), "a letter holds the hook");
            drop(pool);
            request
        });
        drop(node);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            request.reply(7);
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "the late reply deadlocked (direct: {direct})"
        );
        assert_eq!(late.load(Ordering::SeqCst), 1, "a late outcome");
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the hook went");
    }

    #[test]
    fn routed() {
        run(false);
    }

    #[test]
    fn direct() {
        run(true);
    }
}
