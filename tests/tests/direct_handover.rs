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
            ctx.progress(0.5, "half");
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
                    ctx.progress(0.25, "a quarter");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ctx.progress(0.75, "most");
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
                    ctx.progress(1.0, "too late");
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
