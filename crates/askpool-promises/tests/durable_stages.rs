//! A durable ask's stages (DESIGN section 4: every caller can watch its
//! ask's stages): the asks its handle makes, streamed one after another.

use std::sync::Arc;
use std::time::Duration;

use askpool::{AckStage, AskError, Node, RequestId};
use askpool_promises::{DurableAsk, DurablePromises};
use futures::StreamExt;
use tokio::sync::Semaphore;

use AckStage::*;

type N = Node<String, String>;

fn fresh_id() -> RequestId {
    RequestId::generate(askpool_promises::now_millis() * 1000, &mut rand::rng())
}

/// A node whose pool "gated" reports progress, then answers once `gate`
/// gives it a permit.
fn gated_node() -> (N, Arc<Semaphore>) {
    let (node, gate, _) = watched_node();
    (node, gate)
}

/// As `gated_node`, with a permit added to the third semaphore each time
/// the handler has reported its progress.
fn watched_node() -> (N, Arc<Semaphore>, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(Semaphore::new(0));
    let node = N::new();
    let (gated, starts) = (Arc::clone(&gate), Arc::clone(&started));
    node.pool("gated")
        .handler(move |msg: String, ctx| {
            let (gate, started) = (Arc::clone(&gated), Arc::clone(&starts));
            async move {
                ctx.progress(0.5, "half")?;
                started.add_permits(1);
                let _permit = gate.acquire().await;
                Ok(msg.to_uppercase())
            }
        })
        .unwrap();
    (node, gate, started)
}

async fn stages_of(stream: askpool::StageStream<String>) -> Vec<AckStage> {
    tokio::time::timeout(Duration::from_secs(10), stream.map(|e| e.stage).collect())
        .await
        .expect("the stream ends")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_ask_streams_its_stages_and_ends_with_its_outcome() {
    let (node, gate) = gated_node();
    let promises = DurablePromises::in_memory();
    let ask = node.ask_durable(&promises, "gated", "hi".into()).unwrap();
    let reader = tokio::spawn(stages_of(ask.stages()));
    assert!(ask.stages().next().await.is_none(), "one stream at a time");
    gate.add_permits(1);
    assert_eq!(ask.await.unwrap(), "HI");
    assert_eq!(
        reader.await.unwrap(),
        vec![Sent, Received, Read, Partial, Fulfilled]
    );
}

/// Opened after the outcome (or after the handle is gone), the stream
/// replays the record; a handle answered from the store made no ask, and
/// its stream ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_stream_replays_the_record_and_a_stored_answer_has_none() {
    let (node, gate) = gated_node();
    gate.add_permits(1);
    let promises = DurablePromises::in_memory();
    let ask = node.ask_durable(&promises, "gated", "hi".into()).unwrap();
    let (id, source) = (ask.id().to_owned(), ask.stage_source());
    assert_eq!(ask.await.unwrap(), "HI");
    assert_eq!(
        stages_of(source.open()).await,
        vec![Sent, Received, Read, Partial, Fulfilled]
    );
    let again = node.await_durable(&promises, &id).unwrap();
    let source = again.stage_source();
    assert_eq!(again.await.unwrap(), "HI");
    assert_eq!(stages_of(source.open()).await, vec![]);
}

/// A durable ask that failed transiently (no pool of that name yet) shows
/// that ask; the await that asks it again shows the new ask, from SENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_made_again_by_an_await_streams_the_new_ask() {
    let promises = DurablePromises::in_memory();
    let id = fresh_id();
    let bare = N::new();
    let first = bare
        .ask_durable_with_id(&promises, id, "gated", "hi".into())
        .unwrap();
    let source = first.stage_source();
    assert!(matches!(first.await, Err(AskError::NoRoute { .. })));
    let failed = stages_of(source.open()).await;
    assert_eq!(failed.first(), Some(&Sent), "{failed:?}");
    assert!(failed.last().unwrap().is_terminal(), "{failed:?}");

    let (node, gate) = gated_node();
    let again = node.await_durable(&promises, &id.to_string()).unwrap();
    let reader = tokio::spawn(stages_of(again.stages()));
    gate.add_permits(1);
    assert_eq!(again.await.unwrap(), "HI");
    assert_eq!(
        reader.await.unwrap(),
        vec![Sent, Received, Read, Partial, Fulfilled]
    );
}

/// A dropped handle's ask goes on (detached), and a stream opened on it
/// follows that ask to its end rather than waiting for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_handles_stream_follows_its_ask_to_the_end() {
    let (node, gate, started) = watched_node();
    let promises = DurablePromises::in_memory();
    let ask = node.ask_durable(&promises, "gated", "hi".into()).unwrap();
    let (id, stream) = (ask.id().to_owned(), ask.stages());
    let reader = tokio::spawn(stages_of(stream));
    // Its handler running before the handle goes.
    started.acquire().await.unwrap().forget();
    drop(ask);
    gate.add_permits(1);
    assert_eq!(
        reader.await.unwrap(),
        vec![Sent, Received, Read, Partial, Fulfilled]
    );
    let settled = promises.wait(&id).await.unwrap();
    assert_eq!(settled.value.as_deref(), Some(&b"HI"[..]));
}

/// A handle dropped at once, before its detached task has asked (a caller
/// that stops waiting straight away): the ask still runs, and a stream
/// opened on the handle follows it; it does not end with nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_handle_dropped_before_its_ask_started_still_streams_that_ask() {
    let (node, gate) = gated_node();
    let promises = DurablePromises::in_memory();
    let ask = node.ask_durable(&promises, "gated", "hi".into()).unwrap();
    let (id, source, live) = (ask.id().to_owned(), ask.stage_source(), ask.stages());
    drop(ask);
    gate.add_permits(1);
    let settled = tokio::time::timeout(Duration::from_secs(10), promises.wait(&id))
        .await
        .expect("the ask is recorded")
        .unwrap();
    assert_eq!(settled.value.as_deref(), Some(&b"HI"[..]));
    let all = vec![Sent, Received, Read, Partial, Fulfilled];
    assert_eq!(stages_of(live).await, all);
    assert_eq!(stages_of(source.open()).await, all);
}

/// An await dropped before it was ever polled makes no ask: its stream
/// ends (it does not wait for an ask that will never come).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_await_dropped_unpolled_ends_its_stream() {
    let (node, _gate) = gated_node();
    let promises = DurablePromises::in_memory();
    let handle = node
        .await_durable(&promises, &fresh_id().to_string())
        .unwrap();
    let stream = handle.stages();
    drop(handle);
    assert_eq!(stages_of(stream).await, vec![]);
}
