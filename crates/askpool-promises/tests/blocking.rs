//! A store that waits (a SQLite store behind another process's write lock,
//! up to its busy timeout) stalls no runtime: the sweeper, `wait` and the
//! durable asks look at it on tokio's blocking threads, and `wait` and the
//! durable asks look again when it was locked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use askpool::Node;
use askpool_promises::{
    now_millis, spawn_sweeper, CallbackOutcome, CallbackRequest, ClaimRequest, Claimed,
    CompleteRequest, Completed, Completion, CreateRequest, Created, DurableAsk, DurablePromises,
    Lease, MemoryStore, Millis, Promise, PromiseError, Pruned, Result, SearchQuery, Snapshot,
    State, Status, Store, Swept, Task,
};

/// A store whose sweeps and reads wait `wait` (as a SQLite store waits for
/// another process's write), whose first `locked_gets` reads fail `Locked`
/// (its busy timeout passed), and which counts its full reads (`gets`) and
/// its status reads.
#[derive(Default)]
struct SlowStore {
    inner: MemoryStore,
    wait: Duration,
    sweeps: AtomicUsize,
    locked_gets: AtomicUsize,
    gets: AtomicUsize,
    statuses: AtomicUsize,
}

impl SlowStore {
    /// What every read goes through first: the wait, and a lock maybe.
    fn read(&self) -> Result<()> {
        std::thread::sleep(self.wait);
        let locked = self
            .locked_gets
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if locked {
            return Err(PromiseError::Locked {
                path: "slow.db".into(),
            });
        }
        Ok(())
    }
}

impl Store for SlowStore {
    fn create(&self, req: &CreateRequest, now: Millis) -> Result<Created> {
        self.inner.create(req, now)
    }
    fn get(&self, id: &str, now: Millis) -> Result<Promise> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.read()?;
        self.inner.get(id, now)
    }
    fn status(&self, id: &str, now: Millis) -> Result<Status> {
        self.statuses.fetch_add(1, Ordering::SeqCst);
        self.read()?;
        self.inner.status(id, now)
    }
    fn complete(&self, req: &CompleteRequest, now: Millis) -> Result<Completed> {
        self.inner.complete(req, now)
    }
    fn search(&self, query: &SearchQuery, now: Millis) -> Result<Vec<Promise>> {
        self.inner.search(query, now)
    }
    fn register_callback(&self, req: &CallbackRequest, now: Millis) -> Result<CallbackOutcome> {
        self.inner.register_callback(req, now)
    }
    fn claim_task(&self, req: &ClaimRequest, now: Millis) -> Result<Option<Claimed>> {
        self.inner.claim_task(req, now)
    }
    fn heartbeat(&self, lease: &Lease, lease_ms: Millis, now: Millis) -> Result<Task> {
        self.inner.heartbeat(lease, lease_ms, now)
    }
    fn complete_task(&self, lease: &Lease, now: Millis) -> Result<()> {
        self.inner.complete_task(lease, now)
    }
    fn sweep(&self, now: Millis, limit: usize) -> Result<Swept> {
        self.sweeps.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.wait);
        self.inner.sweep(now, limit)
    }
    fn prune(&self, settled_before: Millis, limit: usize) -> Result<Pruned> {
        self.inner.prune(settled_before, limit)
    }
    fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot()
    }
}

/// On a current-thread runtime, a sweep waiting a second for the store
/// leaves the runtime's other tasks running (it stalled them for as long
/// as the store waited: 3 s behind another process's write lock).
#[tokio::test(flavor = "current_thread")]
async fn a_sweep_waiting_for_the_store_does_not_stall_the_runtime() {
    let store = Arc::new(SlowStore {
        wait: Duration::from_millis(1_000),
        ..SlowStore::default()
    });
    let sweeper = spawn_sweeper(
        store.clone() as Arc<dyn Store>,
        Duration::from_millis(10),
        10,
    );
    let longest = longest_tick_gap(Duration::from_millis(1_500)).await;
    sweeper.abort();
    assert!(
        store.sweeps.load(Ordering::SeqCst) >= 1,
        "the sweeper swept"
    );
    assert!(
        longest < Duration::from_millis(500),
        "a 5 ms tick waited {longest:?} behind the sweep"
    );
}

/// The longest gap between 5 ms ticks of this task over `span`.
async fn longest_tick_gap(span: Duration) -> Duration {
    let mut longest = Duration::ZERO;
    let mut last = Instant::now();
    let end = last + span;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = Instant::now();
        longest = longest.max(now - last);
        last = now;
    }
    longest
}

/// A store whose gets wait 300 ms (for the lock) and find it locked the
/// first two times, and promises on it that look again every 20 ms.
fn slow_locked_store() -> (Arc<SlowStore>, DurablePromises) {
    let store = Arc::new(SlowStore {
        wait: Duration::from_millis(300),
        locked_gets: AtomicUsize::new(2),
        ..SlowStore::default()
    });
    let mut promises = DurablePromises::from_arc(store.clone() as Arc<dyn Store>);
    promises.poll = Duration::from_millis(20);
    (store, promises)
}

/// What `task` ended with, within 10 s.
async fn ended<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the task ends")
        .unwrap()
}

/// `wait` on a store that waits for the lock, and is then found locked
/// twice: the runtime's other tasks go on, and the wait ends with the
/// promise settled (it ended with `Locked`, after waiting on the runtime's
/// thread).
#[tokio::test(flavor = "current_thread")]
async fn a_wait_on_a_locked_store_looks_again_and_stalls_nothing() {
    let (store, promises) = slow_locked_store();
    let now = now_millis();
    store
        .inner
        .create(&CreateRequest::new("p", now + 60_000), now)
        .unwrap();
    let waiting = tokio::spawn(async move { promises.wait("p").await });
    let longest = longest_tick_gap(Duration::from_millis(800)).await;
    store
        .inner
        .complete(
            &CompleteRequest::new("p", Completion::Resolve),
            now_millis(),
        )
        .unwrap();
    let settled = ended(waiting)
        .await
        .expect("a locked store is looked at again");
    assert_eq!(settled.state, State::Resolved);
    assert!(
        longest < Duration::from_millis(200),
        "a tick waited {longest:?}"
    );
}

/// A durable ask, and a later await of it, on a store that waits for the
/// lock and is then found locked twice: the runtime's other tasks go on,
/// and both end with the reply. Each look held the runtime's only thread
/// for as long as the store waited, and a look that found the store locked
/// ended the ask with `Unavailable`.
#[tokio::test(flavor = "current_thread")]
async fn durable_asks_on_a_slow_locked_store_stall_nothing() {
    let (_, promises) = slow_locked_store();
    let node = Node::<String, String>::new();
    node.pool("upper")
        .handler(|m: String, _ctx| async move { Ok(m.to_uppercase()) })
        .unwrap();
    let ask = node.ask_durable(&promises, "upper", "hi".into()).unwrap();
    let id = ask.id().to_owned();
    let asked = tokio::spawn(ask);
    let longest = longest_tick_gap(Duration::from_millis(1_200)).await;
    assert_eq!(ended(asked).await, Ok("HI".to_owned()));
    assert!(
        longest < Duration::from_millis(200),
        "a tick waited {longest:?} behind the ask"
    );

    let awaited = tokio::spawn(async move {
        let handle = node.await_durable(&promises, &id);
        handle.unwrap().await
    });
    let longest = longest_tick_gap(Duration::from_millis(600)).await;
    assert_eq!(ended(awaited).await, Ok("HI".to_owned()));
    assert!(
        longest < Duration::from_millis(200),
        "a tick waited {longest:?} behind the await"
    );
}

/// A waiter polls a pending promise by its status, not by reading it whole:
/// its param (here 4 MiB) is read once it settled, not at every poll (a
/// review measured a waiter reading it 10 times a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_polls_a_pending_promise_without_reading_its_param() {
    let store = Arc::new(SlowStore::default());
    let mut promises = DurablePromises::from_arc(store.clone() as Arc<dyn Store>);
    promises.poll = Duration::from_millis(5);
    promises
        .create("big", vec![7; 4 << 20], 60_000, None)
        .unwrap();
    let waiter = {
        let promises = promises.clone();
        tokio::spawn(async move { promises.wait("big").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Settled past these promises (as by another process: no notification,
    // found by polling).
    let resolve = CompleteRequest {
        id: "big".into(),
        completion: Completion::Resolve,
        value: b"done".to_vec(),
        key: None,
    };
    store.inner.complete(&resolve, now_millis()).unwrap();
    let p = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(p.value, Some(b"done".to_vec()));
    let gets = store.gets.load(Ordering::SeqCst);
    let statuses = store.statuses.load(Ordering::SeqCst);
    assert!(
        statuses >= 20,
        "{statuses} status reads in 300 ms of 5 ms polls"
    );
    assert!(
        gets <= 2,
        "{gets} full reads of a promise that settled once"
    );
}
