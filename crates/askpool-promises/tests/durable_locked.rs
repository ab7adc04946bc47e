//! A durable ask's outcome arriving while another connection holds the
//! store's write lock (past the store's busy timeout): recording it is
//! tried again for a while, so a passing lock loses nothing; a lock that
//! outlasts that leaves the promise pending, the caller is told the outcome
//! was not recorded, and an await (after a restart too) asks again.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use askpool::{AskError, Node};
use askpool_promises::{DurableAsk, DurablePromises, SqliteOptions, SqliteStore, State};
use rusqlite::Connection;

type N = Node<String, String>;

fn promises(path: &Path) -> DurablePromises {
    let store = SqliteStore::open_with(
        path,
        SqliteOptions {
            busy_timeout: Duration::from_millis(50),
        },
    )
    .unwrap();
    let mut promises = DurablePromises::new(store);
    promises.poll = Duration::from_millis(100);
    promises
}

/// Takes the write lock of the file at `path` from another connection
/// and gives it back after `hold`.
fn hold_write_lock(path: &Path, hold: Duration) -> JoinHandle<()> {
    let other = Connection::open(path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        other.execute_batch("COMMIT").unwrap();
    })
}

/// A node whose pool "upper" upper-cases, counting its runs; a run takes
/// the store's write lock for `hold` (once `hold` is set) just before its
/// reply, which arrives while the lock is held.
fn locking_node(
    path: &Path,
    hold: Option<Duration>,
    runs: &Arc<AtomicUsize>,
    locks: &Arc<parking_lot::Mutex<Vec<JoinHandle<()>>>>,
) -> N {
    let node = N::new();
    let (path, runs, locks) = (path.to_owned(), Arc::clone(runs), Arc::clone(locks));
    node.pool("upper")
        .handler(move |m: String, _ctx| {
            runs.fetch_add(1, Ordering::SeqCst);
            if let Some(hold) = hold {
                locks.lock().push(hold_write_lock(&path, hold));
            }
            async move { Ok(m.to_uppercase()) }
        })
        .unwrap();
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_meeting_a_passing_lock_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let (runs, locks) = (Arc::default(), Arc::default());
    let node = locking_node(&path, Some(Duration::from_millis(250)), &runs, &locks);
    let promises = promises(&path);
    let ask = node.ask_durable(&promises, "upper", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    assert_eq!(ask.await, Ok("HI".to_owned()));
    let p = promises.get(&id).unwrap();
    assert_eq!(
        (p.state, p.value.as_deref()),
        (State::Resolved, Some(&b"HI"[..]))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(locks.lock().len(), 1, "the reply met the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_cannot_be_recorded_is_asked_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let (runs, locks) = (Arc::default(), Arc::default());
    let id = {
        let node = locking_node(&path, Some(Duration::from_secs(3)), &runs, &locks);
        let ask = node
            .ask_durable(&promises(&path), "upper", "hi".into())
            .unwrap();
        let id = ask.id().to_owned();
        match ask.await {
            Err(AskError::Unavailable { reason }) => {
                assert!(reason.contains("not recorded"), "{reason}");
                assert!(reason.contains(&id), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        id
    };
    for lock in std::mem::take(&mut *locks.lock()) {
        lock.join().unwrap();
    }
    let promises = promises(&path);
    assert_eq!(promises.get(&id).unwrap().state, State::Pending);
    // A restarted caller (a new node on the same file).
    let node = locking_node(&path, None, &runs, &locks);
    let again = node.await_durable(&promises, &id).unwrap().await;
    assert_eq!(again, Ok("HI".to_owned()));
    assert_eq!(promises.get(&id).unwrap().state, State::Resolved);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "its pool went with the first node: the handler ran again"
    );
}
