//! A durable ask's dead letter replayed by the node's plain
//! `replay_dead_letter` (as every binding's DLQ API does): the replay's
//! outcome settles the ask's promise, so nothing asks (and runs) it again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{AskError, Node};
use askpool_promises::{DurableAsk, DurablePromises, State};

type N = Node<String, String>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_durable_asks_dead_letter_settles_its_promise() {
    let node = N::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (counted, gated) = (Arc::clone(&runs), Arc::clone(&gate));
    node.pool("one")
        .concurrency(1)
        .max_in_flight(1)
        .handler(move |msg: String, _ctx| {
            let (runs, gate) = (Arc::clone(&counted), Arc::clone(&gated));
            async move {
                let _permit = gate.acquire().await;
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(msg.to_uppercase())
            }
        })
        .unwrap();
    // Holds the pool's only place: the durable ask is refused BufferFull
    // until its time (`ask_timeout`) runs out, and dead-lettered.
    let blocker = node
        .ask("one", "first".to_owned())
        .timeout(Duration::from_secs(30))
        .send();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut promises = DurablePromises::in_memory();
    promises.ask_timeout = Some(Duration::from_millis(300));
    let ask = node.ask_durable(&promises, "one", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    let failed = ask.await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(promises.get(&id).unwrap().state, State::Pending);
    let letters = node.dead_letters();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let request_id = letters[0].request_id();
    assert_eq!(request_id.to_string(), id);

    gate.add_permits(10);
    assert_eq!(blocker.await.unwrap(), "FIRST");
    let replayed: Result<String, AskError> = node.replay_dead_letter(request_id).unwrap().await;
    assert_eq!(replayed.unwrap(), "HI");
    let p = promises.get(&id).unwrap();
    assert_eq!(
        (p.state, p.value.as_deref()),
        (State::Resolved, Some(&b"HI"[..]))
    );
    // Awaited again (as after a restart): the stored outcome, no new run.
    assert_eq!(
        node.await_durable(&promises, &id).unwrap().await.unwrap(),
        "HI"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
