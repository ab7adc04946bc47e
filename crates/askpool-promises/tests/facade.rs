//! `DurablePromises`, the surface bindings wrap: wall-clock create /
//! complete and `wait`, woken in process and by polling across handles.

use std::time::Duration;

use askpool_promises::{DurablePromises, PromiseError, State};

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_wakes_on_a_completion_in_this_process() {
    let promises = DurablePromises::in_memory();
    promises.create("p", b"in".to_vec(), 60_000, None).unwrap();
    let waiter = {
        let promises = promises.clone();
        tokio::spawn(async move { promises.wait("p").await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "still pending");
    promises
        .resolve("p", b"out".to_vec(), Some("k".into()))
        .unwrap();
    let p = within(waiter).await.unwrap().unwrap();
    assert_eq!((p.state, p.value), (State::Resolved, Some(b"out".to_vec())));
    // The same key replays; another completion is refused.
    assert!(
        promises
            .resolve("p", vec![], Some("k".into()))
            .unwrap()
            .replayed
    );
    assert!(matches!(
        promises.cancel("p", vec![], None),
        Err(PromiseError::AlreadySettled { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_sees_completions_by_another_handle_on_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let mut mine = DurablePromises::open(&path).unwrap();
    mine.poll = Duration::from_millis(10);
    let theirs = DurablePromises::open(&path).unwrap();
    mine.create("p", vec![], 60_000, Some("c".into())).unwrap();
    assert!(
        theirs
            .create("p", vec![], 60_000, Some("c".into()))
            .unwrap()
            .deduplicated
    );
    let waiter = tokio::spawn(async move { mine.wait("p").await });
    theirs.reject("p", b"no".to_vec(), None).unwrap();
    let p = within(waiter).await.unwrap().unwrap();
    assert_eq!(p.state, State::Rejected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ends_at_the_timeout_and_unknown_ids_fail() {
    let promises = DurablePromises::in_memory();
    promises.create("short", vec![], 30, None).unwrap();
    let p = within(promises.wait("short")).await.unwrap();
    assert_eq!(p.state, State::TimedOut);
    assert_eq!(
        within(promises.wait("nope")).await,
        Err(PromiseError::NotFound { id: "nope".into() })
    );
    assert_eq!(
        promises.get("short").unwrap().settled_at,
        Some(p.timeout_at)
    );
}

/// A store keeps every promise until pruned: `prune` deletes those settled
/// longer ago than the retention, timing out the expired ones first, and
/// keeps the rest.
#[test]
fn prune_deletes_what_settled_before_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    for promises in [
        DurablePromises::in_memory(),
        DurablePromises::open(dir.path().join("p.db")).unwrap(),
    ] {
        for i in 0..2_500 {
            let id = format!("done-{i}");
            promises.create(&id, vec![], 60_000, None).unwrap();
            promises.resolve(&id, vec![], None).unwrap();
        }
        promises.create("expired", vec![], 1, None).unwrap();
        promises.create("live", vec![], 60_000, None).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(promises.prune(Duration::from_secs(3600)).unwrap(), 0);
        assert_eq!(promises.get("expired").unwrap().state, State::TimedOut);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(promises.prune(Duration::ZERO).unwrap(), 2_501);
        assert!(matches!(
            promises.get("done-7"),
            Err(PromiseError::NotFound { .. })
        ));
        assert_eq!(promises.get("live").unwrap().state, State::Pending);
        assert_eq!(promises.store().snapshot().unwrap().promises.len(), 1);
    }
}
