//! Durable asks across a caller restart: drop the node, reopen the same
//! SQLite file in a new node, await the same outcome by id.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool::{AskError, Node, RequestId};
use askpool_promises::{DurableAsk, DurablePromises, SqliteStore, State, Store};

type N = Node<String, String>;

fn promises(path: &std::path::Path) -> DurablePromises {
    DurablePromises::new(SqliteStore::open(path).unwrap())
}

/// A node whose pool "upper" upper-cases, counting finished runs and
/// checking that the request id is the promise id.
fn upper_node(runs: &Arc<AtomicUsize>) -> N {
    let node = N::new();
    let runs = Arc::clone(runs);
    node.pool("upper")
        .handler(move |msg: String, ctx| {
            let runs = Arc::clone(&runs);
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(format!("{}:{}", msg.to_uppercase(), ctx.request_id()))
            }
        })
        .unwrap();
    node
}

/// The durable ask `id` resolved with "HI".
fn assert_resolved_hi(promises: &DurablePromises, id: &str) {
    let p = promises.get(id).unwrap();
    assert_eq!(
        (p.state, p.value.as_deref()),
        (State::Resolved, Some(&b"HI"[..]))
    );
}

/// A node whose pool "slow" upper-cases once `gate` lets it (a permit per
/// run), counting its runs; the pool keeps replies for `terminal_ttl`.
fn gated_node(terminal_ttl: Duration) -> (N, Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let node = N::new();
    let (counted, gated) = (Arc::clone(&runs), Arc::clone(&gate));
    node.pool("slow")
        .dedup(askpool::DedupConfig {
            terminal_ttl,
            ..askpool::DedupConfig::default()
        })
        .handler(move |msg: String, _ctx| {
            let (runs, gate) = (Arc::clone(&counted), Arc::clone(&gated));
            async move {
                let _permit = gate.acquire().await;
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(msg.to_uppercase())
            }
        })
        .unwrap();
    (node, runs, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_outcome_survives_the_restart_and_the_handler_ran_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.db");
    let runs = Arc::new(AtomicUsize::new(0));
    let (id, first) = {
        let node = upper_node(&runs);
        let ask = node
            .ask_durable(&promises(&path), "upper", "hello".into())
            .unwrap();
        let id = ask.id().to_owned();
        (id, ask.await.unwrap())
    };
    assert_eq!(
        first,
        format!("HELLO:{id}"),
        "the request id is the promise id"
    );
    // A new process, in effect: new node, new store handle on the same file.
    let node = upper_node(&runs);
    let store = promises(&path);
    assert_eq!(
        node.await_durable(&store, &id).unwrap().await.unwrap(),
        first
    );
    let again = node
        .ask_durable_with_id(&store, id.parse().unwrap(), "upper", "hello".into())
        .unwrap();
    assert_eq!(again.await.unwrap(), first);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(
        store
            .store()
            .get(&id, askpool_promises::now_millis())
            .unwrap()
            .state,
        State::Resolved
    );
    assert!(matches!(
        node.ask_durable_with_id(&store, id.parse().unwrap(), "upper", "other".into()),
        Err(AskError::PayloadMismatch)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_durable_ask_is_asked_again_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.db");
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let id = {
        // The first caller's worker never finishes: the caller goes down
        // with the ask outstanding.
        let node = N::new();
        let signal = Arc::clone(&started);
        node.pool("upper")
            .handler(move |_msg: String, _ctx| {
                let started = Arc::clone(&signal);
                async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Ok(String::new())
                }
            })
            .unwrap();
        let store = promises(&path);
        let ask = node.ask_durable(&store, "upper", "hello".into()).unwrap();
        let id = ask.id().to_owned();
        let waiting = tokio::spawn(ask);
        started.notified().await;
        node.shutdown();
        let outcome = waiting.await.unwrap();
        assert!(
            matches!(outcome, Err(AskError::Unavailable { .. })),
            "{outcome:?}"
        );
        let p = store
            .store()
            .get(&id, askpool_promises::now_millis())
            .unwrap();
        assert_eq!(
            p.state,
            State::Pending,
            "a transient failure settles nothing"
        );
        id
    };
    let node = upper_node(&runs);
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        node.await_durable(&promises(&path), &id).unwrap(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(reply, format!("HELLO:{id}"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one finished run in all");
    let p = promises(&path)
        .store()
        .get(&id, askpool_promises::now_millis())
        .unwrap();
    assert_eq!(p.value.as_deref(), Some(reply.as_bytes()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failure_rejects_the_promise_and_replays_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.db");
    let runs = Arc::new(AtomicUsize::new(0));
    let failing = |runs: &Arc<AtomicUsize>| {
        let node = N::new();
        let runs = Arc::clone(runs);
        node.pool("strict")
            .handler(move |_msg: String, _ctx| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Err(AskError::handler_failed("ValueError", "no")) }
            })
            .unwrap();
        node
    };
    let id = RequestId::from_parts(42, 7);
    let first = failing(&runs)
        .ask_durable_with_id(&promises(&path), id, "strict", "x".into())
        .unwrap()
        .await;
    let expected = Err(AskError::handler_failed("ValueError", "no"));
    assert_eq!(first, expected);
    let node = failing(&runs);
    let store = promises(&path);
    assert_eq!(
        node.await_durable(&store, &id.to_string()).unwrap().await,
        expected
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let p = store.store().get(&id.to_string(), 0).unwrap();
    assert_eq!(p.state, State::Rejected);
    assert!(matches!(
        node.await_durable(&store, "not-an-id"),
        Err(AskError::InvalidArgument { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_times_out_promises_nobody_touches() {
    use askpool_promises::{CreateRequest, MemoryStore};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = askpool_promises::now_millis();
    for i in 0..5 {
        store
            .create(&CreateRequest::new(format!("p{i}"), now + 20), now)
            .unwrap();
    }
    store
        .create(&CreateRequest::new("later", now + 3_600_000), now)
        .unwrap();
    let sweeper = askpool_promises::spawn_sweeper(Arc::clone(&store), Duration::from_millis(10), 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        // The raw snapshot: only the sweeper can have timed them out.
        let snap = store.snapshot().unwrap();
        let timed_out = snap
            .promises
            .iter()
            .filter(|p| p.state == State::TimedOut)
            .count();
        if timed_out == 5 {
            assert_eq!(
                snap.promises
                    .iter()
                    .find(|p| p.id == "later")
                    .unwrap()
                    .state,
                State::Pending
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not swept: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sweeper.abort();
}

/// The worker process lives on while the caller restarts (same caller
/// identity, here from the same seed): the re-sent ask carries the same
/// request id, joins the run still in progress, and the handler starts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_caller_joins_the_run_in_progress() {
    use askpool::{InProcessTransport, NodeConfig, WorkerTransport};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("durable.db");
    let transport: Arc<dyn WorkerTransport<String, String>> = Arc::new(InProcessTransport::new());
    let starts = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let worker = N::with_transport(Arc::clone(&transport), NodeConfig::default());
    {
        let (starts, started, gate) =
            (Arc::clone(&starts), Arc::clone(&started), Arc::clone(&gate));
        worker
            .pool("slow")
            .handler(move |msg: String, _ctx| {
                starts.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                let gate = Arc::clone(&gate);
                async move {
                    let _permit = gate.acquire().await;
                    Ok(msg.to_uppercase())
                }
            })
            .unwrap();
    }
    let caller = || {
        let config = NodeConfig {
            seed: Some(7),
            ..NodeConfig::default()
        };
        N::with_transport(Arc::clone(&transport), config)
    };
    let id = {
        let first = caller();
        let ask = first
            .ask_durable(&promises(&path), "slow", "hi".into())
            .unwrap();
        let id = ask.id().to_owned();
        let waiting = tokio::spawn(ask);
        started.notified().await;
        first.shutdown();
        assert!(
            waiting.await.unwrap().is_err(),
            "the first caller went down"
        );
        id
    };
    let second = caller();
    let ask = second.await_durable(&promises(&path), &id).unwrap();
    let waiting = tokio::spawn(ask);
    gate.add_permits(1);
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, "HI");
    assert_eq!(starts.load(Ordering::SeqCst), 1, "the handler started once");
    assert_resolved_hi(&promises(&path), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_durable_message_is_refused_before_it_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = promises(&dir.path().join("durable.db"));
    let node = N::with_config(askpool::NodeConfig {
        max_payload_bytes: Some(8),
        ..askpool::NodeConfig::default()
    });
    let id: RequestId = "000000000000000000000000000000d1".parse().unwrap();
    let refused = node.ask_durable_with_id(&store, id, "upper", "more than eight bytes".into());
    assert!(
        matches!(
            refused,
            Err(AskError::OversizePayload { size: 21, limit: 8 })
        ),
        "{:?}",
        refused.err()
    );
    assert_nothing_stored(&store, id);
}

fn assert_nothing_stored(store: &DurablePromises, id: RequestId) {
    let now = askpool_promises::now_millis();
    assert!(
        store.store().get(&id.to_string(), now).is_err(),
        "nothing was stored"
    );
}

/// A pool name no pool can have is refused before anything is stored: its
/// promise would be asked again (and refused) after every restart.
#[tokio::test]
async fn a_pool_name_no_pool_can_have_is_refused_before_it_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = promises(&dir.path().join("durable.db"));
    let node = N::new();
    for (n, pool) in [String::new(), "p".repeat(256)].into_iter().enumerate() {
        let id: RequestId = format!("000000000000000000000000000000e{n}")
            .parse()
            .unwrap();
        let refused = node.ask_durable_with_id(&store, id, &pool, "hi".into());
        assert!(
            matches!(refused, Err(AskError::InvalidArgument { .. })),
            "{:?}",
            refused.err()
        );
        assert_nothing_stored(&store, id);
    }
}

/// A caller that stops waiting (a timeout around the handle, a cancelled
/// task) does not cancel the durable ask: the handler's reply settles the
/// promise, and asking for the outcome by id answers it without a second
/// run, even once the pool's record of the request has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_durable_handle_still_settles_its_promise() {
    let dir = tempfile::tempdir().unwrap();
    let store = promises(&dir.path().join("durable.db"));
    let (node, runs, gate) = gated_node(Duration::from_millis(50));
    let ask = node.ask_durable(&store, "slow", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    assert!(
        tokio::time::timeout(Duration::from_millis(20), ask)
            .await
            .is_err(),
        "the caller gave up waiting"
    );
    gate.add_permits(1);
    let settled = async {
        loop {
            let p = store
                .store()
                .get(&id, askpool_promises::now_millis())
                .unwrap();
            if p.state != State::Pending {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), settled)
        .await
        .expect("the promise settles without a waiter");
    assert_resolved_hi(&store, &id);
    // Past the pool's record of the request: only the promise remembers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = node.await_durable(&store, &id).unwrap().await.unwrap();
    assert_eq!(again, "HI");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// A caller that stopped waiting asks for the outcome by id while the first
/// run is still in flight on this node: it joins that run (before, the
/// second ask of the id was refused as already pending, and the refusal
/// rejected the promise for good, the real reply thrown away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_a_durable_ask_still_in_flight_joins_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = promises(&dir.path().join("durable.db"));
    let (node, runs, gate) = gated_node(askpool::DedupConfig::default().terminal_ttl);
    let ask = node.ask_durable(&store, "slow", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    assert!(tokio::time::timeout(Duration::from_millis(20), ask)
        .await
        .is_err());
    let again = node.await_durable(&store, &id).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    gate.add_permits(1);
    let again = tokio::time::timeout(Duration::from_secs(10), again)
        .await
        .expect("in time");
    assert_eq!(again.unwrap(), "HI");
    assert_resolved_hi(&store, &id);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A reply too large for a promise rejects it with DecodeFailure, once:
/// asked again later it is not run again (before, the store refused the
/// completion, the promise stayed pending, and it ran again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_too_large_to_store_rejects_the_promise() {
    let store = DurablePromises::in_memory();
    let runs = Arc::new(AtomicUsize::new(0));
    let node: Node<Vec<u8>, Vec<u8>> = Node::new();
    {
        let runs = Arc::clone(&runs);
        node.pool("big")
            .dedup(askpool::DedupConfig {
                terminal_ttl: Duration::from_millis(10),
                ..askpool::DedupConfig::default()
            })
            .handler(move |_msg: Vec<u8>, _ctx| {
                runs.fetch_add(1, Ordering::SeqCst);
                async move { Ok(vec![0u8; askpool_promises::rules::MAX_VALUE_BYTES + 1]) }
            })
            .unwrap();
    }
    let ask = node.ask_durable(&store, "big", vec![1]).unwrap();
    let id = ask.id().to_owned();
    let first = ask.await.unwrap_err();
    assert!(matches!(first, AskError::DecodeFailure { .. }), "{first:?}");
    assert_eq!(store.get(&id).unwrap().state, State::Rejected);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = node.await_durable(&store, &id).unwrap().await.unwrap_err();
    assert!(matches!(again, AskError::DecodeFailure { .. }), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Two callers await one pending durable ask at the same instant on two
/// threads: one asks, the other waits for its outcome, and both get the
/// reply (before, both could find it not pending and ask; the second ask
/// was refused as already pending and the refusal rejected the promise).
#[test]
fn concurrent_awaits_of_one_durable_ask_ask_once() {
    use askpool_promises::{now_millis, CreateRequest};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    for round in 0..400 {
        let _entered = rt.enter();
        let store = DurablePromises::in_memory();
        let (node, runs, gate) = gated_node(Duration::from_secs(60));
        let id = RequestId::generate(now_millis() * 1000, &mut rand::rng()).to_string();
        let request = CreateRequest::new(id.clone(), now_millis() + 60_000)
            .param(b"hi".to_vec())
            .key(id.clone())
            .tag("askpool:pool", "slow");
        store.store().create(&request, now_millis()).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let awaits: Vec<_> = (0..2)
            .map(|_| {
                let (node, store, id, barrier) = (
                    node.clone(),
                    store.clone(),
                    id.clone(),
                    Arc::clone(&barrier),
                );
                let runtime = rt.handle().clone();
                std::thread::spawn(move || {
                    let _entered = runtime.enter();
                    barrier.wait();
                    node.await_durable(&store, &id).unwrap()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect();
        gate.add_permits(10);
        for handle in awaits {
            let reply = rt
                .block_on(tokio::time::timeout(Duration::from_secs(10), handle))
                .expect("in time");
            assert_eq!(reply.unwrap(), "HI", "round {round}");
        }
        assert_eq!(store.get(&id).unwrap().state, State::Resolved);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_timeout_under_a_millisecond_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let runs = Arc::new(AtomicUsize::new(0));
    let node = upper_node(&runs);
    for timeout in [Duration::ZERO, Duration::from_micros(999)] {
        let mut store = promises(&path);
        store.timeout = timeout;
        let id = RequestId::from_parts(42, 9);
        let refused = node.ask_durable_with_id(&store, id, "upper", "hi".into());
        assert!(
            matches!(refused, Err(AskError::InvalidArgument { .. })),
            "{timeout:?}"
        );
        assert!(
            store.store().get(&id.to_string(), 0).is_err(),
            "nothing stored"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_ask_waits_as_long_as_its_promise_not_the_nodes_default_timeout() {
    // The handler takes longer than the node's default ask timeout. Timed
    // out at that default, the ask was cancelled and asked again later,
    // its finished work lost, until the promise's own timeout.
    let runs = Arc::new(AtomicUsize::new(0));
    let node = N::with_config(askpool::NodeConfig {
        default_timeout: Duration::from_millis(100),
        ..askpool::NodeConfig::default()
    });
    let r = Arc::clone(&runs);
    node.pool("slow")
        .handler(move |m: String, _ctx| {
            let r = Arc::clone(&r);
            async move {
                tokio::time::sleep(Duration::from_millis(400)).await;
                r.fetch_add(1, Ordering::SeqCst);
                Ok(m.to_uppercase())
            }
        })
        .unwrap();
    let promises = DurablePromises::in_memory();
    let ask = node.ask_durable(&promises, "slow", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    assert_eq!(ask.await, Ok("HI".to_string()));
    assert_eq!(promises.get(&id).unwrap().state, State::Resolved);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promise_settled_elsewhere_first_is_the_asks_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let node = N::new();
    let (g, s) = (Arc::clone(&gate), Arc::clone(&started));
    node.pool("gated")
        .handler(move |m: String, _ctx| {
            let (g, s) = (Arc::clone(&g), Arc::clone(&s));
            async move {
                s.notify_one();
                let _pass = g.acquire().await;
                Ok(m.to_uppercase())
            }
        })
        .unwrap();
    let store = promises(&path);
    let ask = node.ask_durable(&store, "gated", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    started.notified().await;
    // Settled by hand while the handler runs (`askpool promises resolve`).
    promises(&path)
        .resolve(&id, b"by hand".to_vec(), None)
        .unwrap();
    gate.add_permits(1);
    let first = ask.await;
    assert_eq!(first, Ok("by hand".to_string()));
    let later = node.await_durable(&store, &id).unwrap().await;
    assert_eq!(first, later, "the ask and a later await read one outcome");
}

/// A promise rejected or canceled by hand (`askpool promises reject ID
/// --value TEXT`) holds the text, not a stored error: the ask's caller
/// reads the text in its `FailedPrecondition` (it read an empty code and
/// message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_by_hand_reaches_the_caller_with_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let node = N::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let (held, starts) = (Arc::clone(&gate), Arc::clone(&started));
    node.pool("gated")
        .handler(move |m: String, _ctx| {
            let (gate, starts) = (Arc::clone(&held), Arc::clone(&starts));
            async move {
                starts.add_permits(1);
                // One permit per run: not given back for the next ask.
                gate.acquire().await.unwrap().forget();
                Ok(m)
            }
        })
        .unwrap();
    let store = promises(&path);
    let by_hand = promises(&path);
    // Settled by hand while the handler runs; the handler then finishes.
    let settle = async |how: &str, value: &[u8]| {
        let ask = node.ask_durable(&store, "gated", "hi".into()).unwrap();
        let id = ask.id().to_owned();
        started.acquire().await.unwrap().forget();
        match how {
            "reject" => by_hand.reject(&id, value.to_vec(), None).unwrap(),
            _ => by_hand.cancel(&id, value.to_vec(), None).unwrap(),
        };
        gate.add_permits(1);
        (ask, id)
    };
    let message = |outcome: Result<String, AskError>| match outcome {
        Err(AskError::FailedPrecondition { message }) => message,
        other => panic!("{other:?}"),
    };
    let (ask, _) = settle("reject", b"out of stock").await;
    assert_eq!(message(ask.await), "durable ask rejected: out of stock");
    let (ask, _) = settle("reject", &[0xff, 0, 1]).await;
    assert_eq!(
        message(ask.await),
        "durable ask rejected (a value of 3 bytes)"
    );
    let (ask, _) = settle("reject", b"").await;
    assert_eq!(message(ask.await), "durable ask rejected");
    let (ask, id) = settle("cancel", b"customer left").await;
    assert_eq!(
        message(ask.await),
        format!("durable ask {id} was canceled: customer left")
    );
}

/// A caller that awaits a durable ask already in flight with a short
/// timeout, again and again, leaves nothing behind: each such await only
/// waits, in its handle (each left a task polling the store until the
/// promise settled). The first ask still runs when its handle is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_awaits_of_a_pending_durable_ask_leave_no_tasks() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let node = N::new();
    let held = Arc::clone(&gate);
    node.pool("slow")
        .handler(move |msg: String, _ctx| {
            let gate = Arc::clone(&held);
            async move {
                let _pass = gate.acquire().await;
                Ok(msg.to_uppercase())
            }
        })
        .unwrap();
    let promises = DurablePromises::in_memory();
    let metrics = tokio::runtime::Handle::current().metrics();
    let first = node.ask_durable(&promises, "slow", "hi".into()).unwrap();
    let id = first.id().to_owned();
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let tasks = metrics.num_alive_tasks();
    for _ in 0..1_000 {
        let again = node.await_durable(&promises, &id).unwrap();
        let _ = tokio::time::timeout(Duration::from_millis(1), again).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        metrics.num_alive_tasks() <= tasks,
        "{} tasks, {tasks} before",
        metrics.num_alive_tasks()
    );
    // The dropped first ask was made, and its outcome recorded.
    gate.add_permits(1);
    let outcome = node.await_durable(&promises, &id).unwrap().await;
    assert_eq!(outcome, Ok("HI".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweeper_with_a_zero_period_sweeps_instead_of_panicking() {
    use askpool_promises::{CreateRequest, MemoryStore};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let now = askpool_promises::now_millis();
    store
        .create(&CreateRequest::new("short", now + 20), now)
        .unwrap();
    let sweeper = askpool_promises::spawn_sweeper(Arc::clone(&store), Duration::ZERO, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.snapshot().unwrap().promises[0].state != State::TimedOut {
        assert!(
            !sweeper.is_finished(),
            "the sweeper ended: {:?}",
            sweeper.await
        );
        assert!(tokio::time::Instant::now() < deadline, "not swept");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sweeper.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promise_settled_elsewhere_while_the_ask_fails_is_the_asks_outcome() {
    // The ask ends in a failure that settles nothing (refused by a full
    // pool until its ask_timeout), after the promise was settled by hand.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let node = N::new();
    let g = Arc::clone(&gate);
    let pool = node
        .pool("narrow")
        .max_in_flight(1)
        .handler(move |m: String, _ctx| {
            let g = Arc::clone(&g);
            async move {
                let _pass = g.acquire().await;
                Ok(m)
            }
        })
        .unwrap();
    let blocker = node
        .ask("narrow", "first".to_owned())
        .timeout(Duration::from_secs(30))
        .send();
    let mut store = DurablePromises::in_memory();
    // Attempts at about 0, 1 and 3 s, then it gives up (a fourth would
    // come after its time): the hand settles it long before that.
    store.ask_timeout = Some(Duration::from_secs(6));
    let ask = node.ask_durable(&store, "narrow", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pool.stats().rejected_full == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.resolve(&id, b"by hand".to_vec(), None).unwrap();
    assert_eq!(ask.await, Ok("by hand".to_string()));
    gate.add_permits(1);
    assert_eq!(blocker.await.unwrap(), "first");
}

/// A node whose pool "stuck" starts its handler (and says so), which then
/// never answers, until its request is cancelled.
fn stuck_node(started: &Arc<tokio::sync::Notify>, cancelled: &Arc<AtomicUsize>) -> N {
    let node = N::new();
    let (started, cancelled) = (Arc::clone(started), Arc::clone(cancelled));
    node.pool("stuck")
        .handler(move |_m: String, ctx| {
            let (started, cancelled) = (Arc::clone(&started), Arc::clone(&cancelled));
            async move {
                started.notify_one();
                ctx.request_cancelled().await;
                cancelled.fetch_add(1, Ordering::SeqCst);
                Ok(String::new())
            }
        })
        .unwrap();
    node
}

/// A durable ask whose promise is settled by hand while its handler runs
/// (an operator cancels it, here or in another process sharing the file)
/// ends with that outcome, at once through the same promises and at a poll
/// otherwise, instead of waiting for the handler or the promise's timeout
/// (an hour by default); its ask is cancelled at the pool. (A review found
/// the caller still waiting after 3 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_ask_settled_by_hand_ends_with_that_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    for elsewhere in [false, true] {
        let (started, cancelled) = (Arc::new(tokio::sync::Notify::new()), Arc::default());
        let node = stuck_node(&started, &cancelled);
        let mine = promises(&path);
        let ask = node.ask_durable(&mine, "stuck", "hi".into()).unwrap();
        let id = ask.id().to_owned();
        started.notified().await;
        // Another process's promises on the same file (no notification).
        let by = if elsewhere {
            promises(&path)
        } else {
            mine.clone()
        };
        by.cancel(&id, b"operator".to_vec(), None).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), ask).await;
        match ended {
            Ok(Err(AskError::FailedPrecondition { message })) => {
                assert!(message.contains("canceled: operator"), "{message}")
            }
            other => panic!("elsewhere {elsewhere}: {other:?}"),
        }
        assert_eq!(mine.get(&id).unwrap().state, State::Canceled);
        // Its handler was told.
        for _ in 0..200 {
            if cancelled.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(cancelled.load(Ordering::SeqCst), 1, "elsewhere {elsewhere}");
    }
}
