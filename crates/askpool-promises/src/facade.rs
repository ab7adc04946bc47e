//! [`DurablePromises`]: a store with the wall clock filled in, waiting
//! (`wait`) built in, and the durable asks' settings. The surface bindings
//! wrap: ids are strings, payloads bytes, times milliseconds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use tokio::sync::Notify;

use crate::durable::now_millis;
use crate::error::PromiseError;
use crate::memory::MemoryStore;
use crate::model::{CompleteRequest, Completed, Completion, CreateRequest, Created, Promise};
use crate::skipped_log::SkippedRows;
use crate::sqlite::SqliteStore;
use crate::store::{off_runtime, Result, Store};

#[derive(Clone)]
pub struct DurablePromises {
    store: Arc<dyn Store>,
    /// Woken by every completion made through this value (or a clone), so
    /// waiters in this process hear at once; others find out by polling.
    settled: Arc<Notify>,
    /// Durable asks being asked through this value (or a clone), by id: one
    /// asks, others wait for it (see `durable::ask_and_record`).
    asking: Arc<Mutex<HashSet<String>>>,
    /// How long a durable ask's promise stays pending at most.
    pub timeout: Duration,
    /// How long one ask of a durable ask waits for its outcome before it
    /// gives up, leaving the promise pending for a later await. `None` (the
    /// default): as long as the promise stays pending, so that a slow
    /// handler is not cancelled by its caller's deadline (its outcome would
    /// be lost and the ask run again). A bound suits a transport that may
    /// lose a reply: the ask then ends sooner, and a later await asks again
    /// and is answered from the pool's reply cache.
    pub ask_timeout: Option<Duration>,
    /// How often `wait` and the durable asks look at the store for
    /// completions made elsewhere (another process on the same file), and
    /// how long they pause before looking again at a store found locked.
    pub poll: Duration,
}

impl DurablePromises {
    /// The shortest `timeout` a durable ask takes: shorter, its promise
    /// would time out as it is stored, and the ask could never run.
    pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

    pub fn new(store: impl Store + 'static) -> Self {
        Self::from_arc(Arc::new(store))
    }

    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            settled: Arc::new(Notify::new()),
            asking: Arc::default(),
            timeout: Duration::from_secs(3600),
            ask_timeout: None,
            poll: Duration::from_millis(100),
        }
    }

    /// Promises in the SQLite file at `path` (created if missing).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(Self::new(SqliteStore::open(path)?))
    }

    /// Promises in memory, gone with the process.
    pub fn in_memory() -> Self {
        Self::new(MemoryStore::new())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Creates a promise that times out `timeout_ms` from now.
    pub fn create(
        &self,
        id: &str,
        param: Vec<u8>,
        timeout_ms: u64,
        key: Option<String>,
    ) -> Result<Created> {
        let now = now_millis();
        let mut req = CreateRequest::new(id, now.saturating_add(timeout_ms)).param(param);
        req.key = key;
        self.store.create(&req, now)
    }

    pub fn get(&self, id: &str) -> Result<Promise> {
        self.store.get(id, now_millis())
    }

    pub fn resolve(&self, id: &str, value: Vec<u8>, key: Option<String>) -> Result<Completed> {
        self.complete(id, Completion::Resolve, value, key)
    }

    pub fn reject(&self, id: &str, value: Vec<u8>, key: Option<String>) -> Result<Completed> {
        self.complete(id, Completion::Reject, value, key)
    }

    pub fn cancel(&self, id: &str, value: Vec<u8>, key: Option<String>) -> Result<Completed> {
        self.complete(id, Completion::Cancel, value, key)
    }

    pub fn complete(
        &self,
        id: &str,
        completion: Completion,
        value: Vec<u8>,
        key: Option<String>,
    ) -> Result<Completed> {
        let mut req = CompleteRequest::new(id, completion).value(value);
        req.key = key;
        let done = self.store.complete(&req, now_millis())?;
        self.settled.notify_waiters();
        Ok(done)
    }

    /// Deletes the promises settled more than `older_than` ago (with what
    /// hangs on them), after timing out the pending ones whose timeout has
    /// passed; returns how many were deleted. A store keeps every promise
    /// until it is pruned: call this on a schedule (a retention period, as
    /// Temporal's) to bound it. A pruned durable ask is forgotten: asked
    /// again under its id, it is a new request, answered from the pool's
    /// reply cache while that keeps the reply, else by its handler running
    /// again. Keep promises at least as long as their ids may be asked again.
    /// A corrupt row met on the way is skipped (see [`Store::sweep`]),
    /// neither deleted nor counted; a call that skipped any logs a warning
    /// naming them (two at most: its sweep's and its prune's).
    pub fn prune(&self, older_than: Duration) -> Result<usize> {
        const BATCH: usize = 1_000;
        let now = now_millis();
        let mut skipped = SkippedRows::default();
        loop {
            let swept = self.store.sweep(now, BATCH)?;
            skipped.add(swept.skipped, &swept.corrupt);
            if swept.timed_out < BATCH {
                break;
            }
        }
        skipped.warn("prune's sweep");
        let older_than = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let before = now.saturating_sub(older_than);
        let mut pruned = 0;
        let mut skipped = SkippedRows::default();
        loop {
            let done = self.store.prune(before, BATCH)?;
            skipped.add(done.skipped, &done.corrupt);
            pruned += done.pruned;
            if done.pruned < BATCH {
                skipped.warn("prune");
                return Ok(pruned);
            }
        }
    }

    /// Returns at the next completion made through this value, or after
    /// `poll` (a completion made elsewhere is found by looking). Needs a
    /// tokio runtime.
    pub(crate) async fn next_completion_or_poll(&self) {
        self.next_completion_within(self.poll).await;
    }

    /// As [`next_completion_or_poll`](Self::next_completion_or_poll), but
    /// after `times` polls: for what a completion elsewhere only cuts
    /// short (a durable ask in flight), not what waits for it.
    pub(crate) async fn next_completion_or_polls(&self, times: u32) {
        self.next_completion_within(self.poll.saturating_mul(times))
            .await;
    }

    async fn next_completion_within(&self, poll: Duration) {
        let poll = poll.max(Duration::from_millis(1));
        let _ = tokio::time::timeout(poll, self.settled.notified()).await;
    }

    /// Whether someone holds the right to ask durable ask `id`.
    pub(crate) fn is_claimed(&self, id: &str) -> bool {
        self.asking.lock().contains(id)
    }

    /// The right to ask durable ask `id` while the guard lives; `None` if
    /// someone holds it.
    pub(crate) fn claim(&self, id: &str) -> Option<Claim> {
        self.asking.lock().insert(id.to_owned()).then(|| Claim {
            asking: Arc::clone(&self.asking),
            id: id.to_owned(),
        })
    }

    /// The promise as the store has it now, looked at on tokio's blocking
    /// threads (a store shared with other processes waits for their
    /// writes); `None` if the store was locked by another writer past its
    /// busy timeout, which is no answer about the promise: look again later.
    pub(crate) async fn look(&self, id: &str) -> Result<Option<Promise>> {
        let (store, key, now) = (Arc::clone(&self.store), id.to_owned(), now_millis());
        match off_runtime(move || store.get(&key, now)).await {
            Ok(p) => Ok(Some(p)),
            Err(PromiseError::Locked { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The promise's [`Status`](crate::Status), read without its param and
    /// value; `None` while the store is locked (looked at again later).
    async fn look_status(&self, id: &str) -> Result<Option<crate::Status>> {
        let (store, key, now) = (Arc::clone(&self.store), id.to_owned(), now_millis());
        match off_runtime(move || store.status(&key, now)).await {
            Ok(s) => Ok(Some(s)),
            Err(PromiseError::Locked { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The promise if it has settled (or its timeout was due, and reading
    /// it settled it); `None` while it is pending or the store is locked.
    /// A pending promise is told by its status alone: a waiter polling for
    /// one with a large param or value does not read them every time.
    pub(crate) async fn look_settled(&self, id: &str) -> Result<Option<Promise>> {
        match self.look_status(id).await? {
            Some(status) if status.settled => {
                Ok(self.look(id).await?.filter(|p| p.state.is_settled()))
            }
            _ => Ok(None),
        }
    }

    /// The promise, looked at again at the next poll (or completion) while
    /// the store is locked.
    pub(crate) async fn current(&self, id: &str) -> Result<Promise> {
        loop {
            if let Some(p) = self.look(id).await? {
                return Ok(p);
            }
            self.next_completion_or_poll().await;
        }
    }

    /// The promise once it has settled (resolved, rejected, canceled, or
    /// timed out at its deadline). Needs a tokio runtime. Each look at the
    /// store runs on tokio's blocking threads, and a look that found the
    /// store locked is made again at the next poll, not an error: the
    /// promise is still there to wait for.
    pub async fn wait(&self, id: &str) -> Result<Promise> {
        loop {
            // Registered before the look, so a completion in between wakes it.
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Its status first: a pending promise's param is not read at
            // every poll.
            let until_timeout = match self.look_status(id).await? {
                Some(status) if status.settled => match self.look(id).await? {
                    Some(p) if p.state.is_settled() => return Ok(p),
                    _ => self.poll,
                },
                Some(status) => {
                    Duration::from_millis(status.timeout_at.saturating_sub(now_millis()))
                }
                None => self.poll,
            };
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(self.poll.min(until_timeout)) => {}
            }
        }
    }
}

/// See [`DurablePromises::claim`]; released on drop.
pub(crate) struct Claim {
    asking: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.asking.lock().remove(&self.id);
    }
}

impl std::fmt::Debug for DurablePromises {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurablePromises")
            .field("timeout", &self.timeout)
            .field("ask_timeout", &self.ask_timeout)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl From<SqliteStore> for DurablePromises {
    fn from(store: SqliteStore) -> Self {
        Self::new(store)
    }
}
