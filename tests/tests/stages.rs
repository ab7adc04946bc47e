//! The ACK lifecycle as the caller sees it through `AskHandle::stages()`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use askpool::{
    AckStage, AskError, ErrorCode, Node, NodeConfig, PayloadFingerprint, Progress, RequestId,
    StageEvent, WorkerTransport,
};
use askpool_tests::{Fate, FrameKind, Tap};
use futures::StreamExt;

type TestNode = Node<u64, String>;

fn node() -> TestNode {
    Node::with_config(NodeConfig {
        seed: Some(5),
        ..NodeConfig::default()
    })
}

fn stages_of(events: &[StageEvent]) -> Vec<AckStage> {
    events.iter().map(|e| e.stage).collect()
}

#[tokio::test(start_paused = true)]
async fn a_fulfilled_ask_walks_every_stage_in_order_with_durations() {
    let node = node();
    node.pool("p")
        .handler(|_msg: u64, ctx| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for i in 1..=4 {
                ctx.progress(i as f32 / 5.0, format!("{i}/5")).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(60)).await;
            Ok("done".to_string())
        })
        .unwrap();
    let handle = node.ask("p", 1).send();
    let stream = handle.stages();
    let watcher = tokio::spawn(stream.collect::<Vec<_>>());
    assert_eq!(handle.await.unwrap(), "done");
    let events = watcher.await.unwrap();
    use AckStage::*;
    assert_eq!(
        stages_of(&events),
        vec![Sent, Received, Read, Partial, Partial, Partial, Partial, Fulfilled]
    );
    let fractions: Vec<f32> = events
        .iter()
        .filter_map(|e| e.progress.as_ref().map(|p| p.fraction))
        .collect();
    assert_eq!(
        fractions,
        vec![0.2, 0.4, 0.6, 0.8],
        "progress arrives in order"
    );
    assert_eq!(events[3].progress.as_ref().unwrap().note, "1/5");
    assert_eq!(events[3].since_sent, Duration::from_millis(100));
    assert_eq!(events[4].since_previous, Duration::from_millis(10));
    let last = events.last().unwrap();
    assert_eq!(last.since_sent, Duration::from_millis(200));
    assert_eq!(last.since_previous, Duration::from_millis(70));
}

#[tokio::test(start_paused = true)]
async fn errors_end_in_the_terminal_stage_of_their_code() {
    let node = node();
    node.pool("p")
        .handler(|_msg: u64, _ctx| async { Err(AskError::handler_failed("E", "x")) })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap_err();
    assert_eq!(
        s.collect::<Vec<_>>().await.last().unwrap().stage,
        AckStage::Failed
    );

    let id = RequestId::from_parts(1, 1);
    node.ask("p", 1)
        .request_id(id)
        .fingerprint(PayloadFingerprint::from_u128(1))
        .await
        .unwrap_err();
    let h = node
        .ask("p", 2)
        .request_id(id)
        .fingerprint(PayloadFingerprint::from_u128(2))
        .send();
    let s = h.stages();
    assert_eq!(h.await.unwrap_err(), AskError::PayloadMismatch);
    let stages = stages_of(&s.collect::<Vec<_>>().await);
    assert_eq!(stages, vec![AckStage::Sent, AckStage::Rejected]);
}

#[tokio::test(start_paused = true)]
async fn a_lost_ack_is_covered_by_read() {
    let tap = Tap::in_process();
    tap.set_rule(|f| match f.kind {
        FrameKind::Ack => Fate::Drop,
        _ => Fate::Deliver,
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(transport, NodeConfig::default());
    node.pool("p")
        .handler(|_m: u64, _ctx| async { Ok("ok".to_string()) })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap();
    let stages = stages_of(&s.collect::<Vec<_>>().await);
    assert_eq!(
        stages,
        vec![AckStage::Sent, AckStage::Read, AckStage::Fulfilled]
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_timed_out_and_its_late_outcome_reconciles_the_record() {
    let tap = Tap::in_process();
    // The cancel is lost, so the handler's reply comes back late.
    tap.set_rule(|f| match f.kind {
        FrameKind::Cancel => Fate::Drop,
        _ => Fate::Deliver,
    });
    let transport: Arc<dyn WorkerTransport<u64, String>> = tap.clone();
    let node = Node::with_transport(transport, NodeConfig::default());
    node.pool("p")
        .handler(|_m: u64, _ctx| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok("late".to_string())
        })
        .unwrap();
    let late = Arc::new(Mutex::new(Vec::new()));
    let l = late.clone();
    node.on_late_outcome(move |o| l.lock().unwrap().push(o.stage));
    let h = node.ask("p", 1).timeout(Duration::from_secs(1)).send();
    let s = h.stages();
    assert_eq!(h.await.unwrap_err().code(), ErrorCode::AskTimeout);
    let stages = stages_of(&s.collect::<Vec<_>>().await);
    use AckStage::*;
    assert_eq!(stages, vec![Sent, Received, Read, TimedOut]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(*late.lock().unwrap(), vec![Some(Fulfilled)]);
}

#[tokio::test(start_paused = true)]
async fn without_tracking_the_stream_is_empty() {
    let node: TestNode = Node::with_config(NodeConfig {
        track_stages: false,
        ..NodeConfig::default()
    });
    node.pool("p")
        .handler(|_m: u64, _ctx| async { Ok("ok".to_string()) })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap();
    assert!(s.collect::<Vec<_>>().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn unread_stage_events_are_bounded() {
    let node = node();
    node.pool("p")
        .handler(|_m: u64, ctx| async move {
            for i in 0..500 {
                ctx.progress(i as f32 / 500.0, "tick").unwrap();
            }
            Ok("ok".to_string())
        })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap();
    let events = s.collect::<Vec<_>>().await;
    assert_eq!(events.len(), 64, "the oldest unread events were dropped");
    use AckStage::*;
    assert_eq!(
        stages_of(&events[..3]),
        vec![Sent, Received, Read],
        "the lifecycle stages stay; the oldest progress reports went"
    );
    assert_eq!(events.last().unwrap().stage, Fulfilled);
    let last_partial = &events[events.len() - 2];
    assert_eq!(
        last_partial.progress.as_ref().unwrap().fraction,
        499.0 / 500.0
    );
}

#[tokio::test(start_paused = true)]
async fn progress_carries_its_metadata() {
    let node = node();
    node.pool("p")
        .handler(|_m: u64, ctx| async move {
            ctx.report(askpool::Progress::new(0.45, "2300/5000 records").with("shard", "7"))
                .unwrap();
            Ok("ok".to_string())
        })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap();
    let events = s.collect::<Vec<_>>().await;
    let partial = events
        .iter()
        .find(|e| e.stage == AckStage::Partial)
        .and_then(|e| e.progress.clone())
        .expect("a partial event");
    assert_eq!(partial.fraction, 0.45);
    assert_eq!(partial.note, "2300/5000 records");
    assert_eq!(
        partial.metadata,
        vec![("shard".to_string(), "7".to_string())]
    );
}

/// A fraction out of 0..1 is clamped; a NaN one says nothing and is
/// refused (it reached the PARTIAL stage as NaN through Kotlin), as is a
/// report past the bounds of its note and metadata: neither is reported.
#[tokio::test(start_paused = true)]
async fn progress_is_clamped_and_nan_or_oversize_reports_are_refused() {
    let node = node();
    node.pool("p")
        .handler(|_m: u64, ctx| async move {
            let refused = |r: Result<(), AskError>| match r {
                Err(AskError::InvalidArgument { message }) => message,
                other => panic!("not refused: {other:?}"),
            };
            let nan = refused(ctx.progress(f32::NAN, "nothing"));
            assert!(nan.contains("NaN"), "{nan}");
            ctx.progress(-1.0, "before").unwrap();
            let note = "x".repeat(Progress::MAX_BYTES + 1);
            let long = refused(ctx.progress(0.5, note));
            assert!(
                long.contains(&format!("{} bytes", Progress::MAX_BYTES + 1)),
                "{long}"
            );
            // The note and the metadata count together.
            let half = "y".repeat(Progress::MAX_BYTES / 2);
            let both = Progress::new(0.5, half.clone()).with("k", half);
            refused(ctx.report(both));
            let mut many = Progress::new(0.5, "many");
            for i in 0..=Progress::MAX_METADATA {
                many = many.with(i.to_string(), "");
            }
            let many = refused(ctx.report(many));
            assert!(many.contains("metadata entries"), "{many}");
            // At the bounds exactly: reported.
            let mut full = Progress::new(0.75, "z".repeat(Progress::MAX_BYTES - 1));
            for _ in 1..Progress::MAX_METADATA {
                full = full.with("", "");
            }
            ctx.report(full.with("k", "")).unwrap();
            ctx.progress(2.0, "past").unwrap();
            Ok("ok".to_string())
        })
        .unwrap();
    let h = node.ask("p", 1).send();
    let s = h.stages();
    h.await.unwrap();
    let partial: Vec<_> = s
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .filter_map(|e| e.progress)
        .map(|p| (p.fraction, p.note.len(), p.metadata.len()))
        .collect();
    assert_eq!(
        partial,
        vec![
            (0.0, "before".len(), 0),
            (0.75, Progress::MAX_BYTES - 1, Progress::MAX_METADATA),
            (1.0, "past".len(), 0)
        ]
    );
}

/// A stage source outlives its handle, and a stream opened from it after the
/// ask ended replays the whole record, progress included.
#[tokio::test(start_paused = true)]
async fn a_stage_source_opened_after_the_ask_replays_its_record() {
    let node = node();
    node.pool("p")
        .handler(|_msg: u64, ctx| async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            ctx.progress(0.5, "half").unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok("done".to_string())
        })
        .unwrap();
    let handle = node.ask("p", 1).send();
    let source = handle.stage_source();
    assert_eq!(handle.await.unwrap(), "done");
    let events: Vec<StageEvent> = source.open().collect().await;
    use AckStage::*;
    assert_eq!(
        stages_of(&events),
        vec![Sent, Received, Read, Partial, Fulfilled]
    );
    assert_eq!(events[3].progress.as_ref().unwrap().note, "half");
    assert_eq!(events[4].since_sent, Duration::from_millis(20));
}

/// The pool's processing timeout is a timeout (seed 002: TIMED_OUT is
/// "processing exceeded configured deadline"), though the ask fails
/// `AskCancelled`; and a request the pool had accepted ends FAILED when its
/// node shuts down under it, queued or running, as when its pool closes:
/// REJECTED is a refusal before any processing.
#[tokio::test(start_paused = true)]
async fn processing_timeouts_end_timed_out_and_accepted_asks_cut_short_failed() {
    use AckStage::*;
    let node = node();
    node.pool("hung")
        .config(askpool::PoolConfig {
            concurrency: 1,
            processing_timeout: Some(Duration::from_millis(100)),
            ..askpool::PoolConfig::default()
        })
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    let handle = node.ask("hung", 1).timeout(Duration::from_secs(10)).send();
    let watcher = tokio::spawn(handle.stages().collect::<Vec<_>>());
    assert_eq!(
        handle.await,
        Err(AskError::AskCancelled {
            reason: askpool::CancelReason::ProcessingTimeout
        })
    );
    assert_eq!(
        stages_of(&watcher.await.unwrap()),
        vec![Sent, Received, Read, TimedOut]
    );

    // A handler's refusal is still REJECTED, after READ.
    let picky = self::node();
    picky
        .pool("p")
        .handler(|_msg: u64, _ctx| async {
            Err(AskError::ValidationError {
                message: "no".into(),
            })
        })
        .unwrap();
    let refused = picky.ask("p", 1).send();
    let watcher = tokio::spawn(refused.stages().collect::<Vec<_>>());
    assert_eq!(
        refused.await.unwrap_err().code(),
        ErrorCode::ValidationError
    );
    assert_eq!(
        stages_of(&watcher.await.unwrap()),
        vec![Sent, Received, Read, Rejected]
    );

    let closing = self::node();
    closing
        .pool("p")
        .concurrency(1)
        .handler(|_msg: u64, _ctx| std::future::pending())
        .unwrap();
    let running = closing.ask("p", 1).send();
    let queued = closing.ask("p", 2).send();
    let watchers = [running.stages(), queued.stages()].map(|s| tokio::spawn(s.collect::<Vec<_>>()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    closing.shutdown();
    assert_eq!(running.await.unwrap_err().code(), ErrorCode::Unavailable);
    assert_eq!(queued.await.unwrap_err().code(), ErrorCode::Unavailable);
    let [running, queued] = watchers;
    assert_eq!(
        stages_of(&running.await.unwrap()),
        vec![Sent, Received, Read, Failed]
    );
    assert_eq!(
        stages_of(&queued.await.unwrap()),
        vec![Sent, Received, Failed]
    );
}

/// A relay streams its asks one after another, each from SENT to its
/// terminal stage, and ends once it has ended; opened late it keeps only
/// the most recent `MAX_RELAYED_ASKS` asks (a request asked again for an
/// hour keeps no more), and a second stream while one is open ends at once.
#[tokio::test(start_paused = true)]
async fn a_relay_streams_its_asks_in_turn_and_keeps_a_bounded_number() {
    use askpool::{StageRelay, MAX_RELAYED_ASKS};
    use AckStage::*;
    let node = node();
    node.pool("p")
        .handler(|n: u64, _ctx| async move {
            if n % 2 == 0 {
                Ok(n.to_string())
            } else {
                Err(AskError::handler_failed("Odd", "odd"))
            }
        })
        .unwrap();

    let relay = StageRelay::new();
    let mut live = relay.open();
    assert!(relay.open().next().await.is_none(), "one stream at a time");
    for n in 0..2 {
        let h = node.ask("p", n).send();
        relay.relay(&h);
        let _ = h.await;
    }
    relay.end();
    let mut seen = Vec::new();
    while let Some(e) = live.next().await {
        seen.push(e.stage);
    }
    assert_eq!(
        seen,
        vec![Sent, Received, Read, Fulfilled, Sent, Received, Read, Failed]
    );
    drop(live);

    let relay = StageRelay::new();
    let asks = MAX_RELAYED_ASKS as u64 + 4;
    for n in 0..asks {
        let h = node.ask("p", n * 2).send();
        relay.relay(&h);
        h.await.unwrap();
    }
    relay.end();
    let late: Vec<AckStage> = relay.source().open().map(|e| e.stage).collect().await;
    assert_eq!(late.len(), MAX_RELAYED_ASKS * 4, "{late:?}");
    assert_eq!(
        late.iter().filter(|s| **s == Sent).count(),
        MAX_RELAYED_ASKS
    );
    // Dropped, its stream lets the next one start again from the record.
    let again: Vec<AckStage> = relay.open().map(|e| e.stage).collect().await;
    assert_eq!(again, late);
}

/// A relay's stream waits for the ask being relayed, and for the next ask
/// until the relay ends: it neither ends early nor hangs after the end.
#[tokio::test(start_paused = true)]
async fn a_relay_stream_waits_for_asks_to_come_and_ends_after_the_last() {
    use askpool::StageRelay;
    use AckStage::*;
    let node = node();
    node.pool("p")
        .handler(|n: u64, _ctx| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(n.to_string())
        })
        .unwrap();
    let relay = StageRelay::new();
    let reader = tokio::spawn(relay.open().map(|e| e.stage).collect::<Vec<_>>());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let h = node.ask("p", 1).send();
    relay.relay(&h);
    h.await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!reader.is_finished(), "the relay has not ended");
    relay.end();
    assert_eq!(reader.await.unwrap(), vec![Sent, Received, Read, Fulfilled]);
    // Asks relayed after the end are not streamed.
    let h = node.ask("p", 2).send();
    relay.relay(&h);
    h.await.unwrap();
    assert_eq!(relay.open().count().await, 4);
}
