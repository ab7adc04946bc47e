//! What a durable ask's id names: one request (a pool and a message), and
//! only a promise that a durable ask made, for as long as that is kept.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{AskError, Node, RequestId};
use askpool_promises::{DurableAsk, DurablePromises, State};

type N = Node<String, String>;

fn echo_node() -> N {
    let node = N::new();
    for pool in ["a", "b"] {
        node.pool(pool)
            .handler(move |msg: String, _ctx| async move { Ok(format!("{pool}:{msg}")) })
            .unwrap();
    }
    node
}

fn fresh_id() -> RequestId {
    RequestId::generate(askpool_promises::now_millis() * 1000, &mut rand::rng())
}

/// The same id and message to another pool is another request: refused as
/// a mismatch, not answered with the first pool's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_id_asked_of_another_pool_is_a_payload_mismatch() {
    let node = echo_node();
    let promises = DurablePromises::in_memory();
    let id = fresh_id();
    let first = node
        .ask_durable_with_id(&promises, id, "a", "hi".into())
        .unwrap();
    assert_eq!(first.await.unwrap(), "a:hi");
    assert!(matches!(
        node.ask_durable_with_id(&promises, id, "b", "hi".into()),
        Err(AskError::PayloadMismatch)
    ));
}

/// A promise made some other way, under an id that parses as a request id:
/// awaiting it as a durable ask is refused, and the promise is left as it
/// was (not asked of a pool named "", nor rejected with the failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_a_promise_no_durable_ask_made_is_refused() {
    let node = echo_node();
    let promises = DurablePromises::in_memory();
    let id = fresh_id().to_string();
    promises
        .create(&id, b"mine".to_vec(), 60_000, None)
        .unwrap();
    let outcome = match node.await_durable(&promises, &id) {
        Ok(handle) => handle.await,
        Err(e) => Err(e),
    };
    assert!(
        matches!(outcome, Err(AskError::InvalidArgument { .. })),
        "{outcome:?}"
    );
    assert_eq!(promises.get(&id).unwrap().state, State::Pending);
}

/// A caller restarted before its pool is registered again: the await fails
/// `NoRoute`, but that says where this node is, not what became of the
/// request, so the promise stays pending and a later await, once the pool
/// is back, asks and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_leaves_a_durable_ask_pending_for_a_later_await() {
    let promises = DurablePromises::in_memory();
    let id = fresh_id();
    let bare = N::new();
    let outcome = bare
        .ask_durable_with_id(&promises, id, "a", "hi".into())
        .unwrap()
        .await;
    assert!(
        matches!(outcome, Err(AskError::NoRoute { .. })),
        "{outcome:?}"
    );
    assert_eq!(promises.get(&id.to_string()).unwrap().state, State::Pending);
    let node = echo_node();
    let again = node
        .await_durable(&promises, &id.to_string())
        .unwrap()
        .await;
    assert_eq!(again.unwrap(), "a:hi");
}

/// A request id parses in either case, and a durable ask's promise is
/// stored under its canonical (lowercase) form: awaiting it by the id in
/// upper case finds it rather than failing `NotFound`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_awaited_in_upper_case_finds_its_promise() {
    let node = echo_node();
    let promises = DurablePromises::in_memory();
    let id = fresh_id();
    let first = node
        .ask_durable_with_id(&promises, id, "a", "hi".into())
        .unwrap();
    assert_eq!(first.await.unwrap(), "a:hi");
    let upper = id.to_string().to_uppercase();
    let again = node.await_durable(&promises, &upper).unwrap().await;
    assert_eq!(again.unwrap(), "a:hi");
}

/// A pruned durable ask is forgotten, by the user's choice: its id names
/// no promise any more, so asked again under it, it is a new request. The
/// pool that answered it replays its cached reply (the handler does not
/// run); a pool without it (another process, or after the cache let the
/// reply go) runs the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pruned_durable_ask_is_a_new_request_under_its_id() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counting = || {
        let node = N::new();
        let runs = Arc::clone(&runs);
        node.pool("a")
            .handler(move |msg: String, _ctx| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move { Ok(format!("a:{msg}")) }
            })
            .unwrap();
        node
    };
    let (promises, id) = (DurablePromises::in_memory(), fresh_id());
    let ask = |node: &N| node.ask_durable_with_id(&promises, id, "a", "hi".into());
    // Settled before `prune(ZERO)`'s now, to the millisecond.
    let prune = || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(promises.prune(Duration::ZERO).unwrap(), 1);
        assert!(promises.get(&id.to_string()).is_err(), "forgotten");
    };
    let node = counting();
    assert_eq!(ask(&node).unwrap().await.unwrap(), "a:hi");
    assert_eq!(ask(&node).unwrap().await.unwrap(), "a:hi");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "answered from its promise");

    prune().await;
    assert_eq!(ask(&node).unwrap().await.unwrap(), "a:hi");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the pool's reply cache answered"
    );

    prune().await;
    assert_eq!(ask(&counting()).unwrap().await.unwrap(), "a:hi");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the handler ran again");
}
