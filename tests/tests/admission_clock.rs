//! A pool admits a request at its own reading of the clock, taken when it
//! admits it: not at the caller's, which comes before the payload's clone
//! (user code, `M::clone`) and the breaker's lock, time a processing
//! deadline and the RECEIVED stage must not lose. (A speed-up that reused
//! the caller's reading cut the handler below short, found by a review.)

use std::time::Duration;

use askpool::{AckStage, Node, NodeConfig, PoolConfig};
use futures::StreamExt;

/// A payload whose clone takes real time (a big buffer, a deep copy).
#[derive(Debug)]
struct SlowClone(u64);

impl Clone for SlowClone {
    fn clone(&self) -> Self {
        std::thread::sleep(Duration::from_millis(300));
        SlowClone(self.0)
    }
}

fn node_with_pool() -> Node<SlowClone, String> {
    let node: Node<SlowClone, String> = Node::with_config(NodeConfig::default());
    node.pool("p")
        .config(PoolConfig {
            processing_timeout: Some(Duration::from_millis(200)),
            ..PoolConfig::default()
        })
        .handler(|m: SlowClone, _ctx| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(format!("r{}", m.0))
        })
        .unwrap();
    node
}

/// The handler runs 50 ms of its 200 ms processing timeout: it must not be
/// cut short. The pool's deadline is counted from the caller's reading,
/// 300 ms before the pool admitted the request, so it is past on arrival.
#[tokio::test]
async fn a_processing_timeout_counts_from_admission_not_from_the_callers_reading() {
    let node = node_with_pool();
    let result = node
        .ask("p", SlowClone(7))
        .timeout(Duration::from_secs(5))
        .await;
    assert_eq!(result, Ok("r7".to_string()), "{result:?}");
    node.shutdown();
}

/// RECEIVED is when the pool admitted the request: 300 ms after SENT here.
#[tokio::test]
async fn received_is_stamped_when_the_pool_admits_the_request() {
    let node = node_with_pool();
    let handle = node
        .ask("p", SlowClone(8))
        .timeout(Duration::from_secs(5))
        .send();
    let stages = handle.stages();
    let _ = handle.await;
    let events: Vec<_> = stages.collect().await;
    let received = events
        .iter()
        .find(|e| e.stage == AckStage::Received)
        .expect("a RECEIVED event");
    assert!(
        received.since_previous >= Duration::from_millis(250),
        "RECEIVED {:?} after SENT, the clone took 300 ms",
        received.since_previous
    );
    node.shutdown();
}
