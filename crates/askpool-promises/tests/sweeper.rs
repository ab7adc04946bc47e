//! The sweeper never stalls the runtime it runs on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use askpool_promises::{
    spawn_sweeper, CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest,
    Completed, CreateRequest, Created, Lease, MemoryStore, Millis, Promise, Result, SearchQuery,
    Snapshot, Store, Task,
};

/// A store whose sweep waits, as a SQLite store waits for another
/// process's write (up to its busy timeout).
struct SlowSweep {
    inner: MemoryStore,
    wait: Duration,
    sweeps: AtomicUsize,
}

impl Store for SlowSweep {
    fn create(&self, req: &CreateRequest, now: Millis) -> Result<Created> {
        self.inner.create(req, now)
    }
    fn get(&self, id: &str, now: Millis) -> Result<Promise> {
        self.inner.get(id, now)
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
    fn sweep(&self, now: Millis, limit: usize) -> Result<usize> {
        self.sweeps.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.wait);
        self.inner.sweep(now, limit)
    }
    fn prune(&self, settled_before: Millis, limit: usize) -> Result<usize> {
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
    let store = Arc::new(SlowSweep {
        inner: MemoryStore::new(),
        wait: Duration::from_millis(1_000),
        sweeps: AtomicUsize::new(0),
    });
    let sweeper = spawn_sweeper(
        store.clone() as Arc<dyn Store>,
        Duration::from_millis(10),
        10,
    );
    let mut longest = Duration::ZERO;
    let mut last = Instant::now();
    let end = last + Duration::from_millis(1_500);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = Instant::now();
        longest = longest.max(now - last);
        last = now;
    }
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
