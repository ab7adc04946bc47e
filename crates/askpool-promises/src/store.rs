//! The [`Store`] trait: the operations of the protocol, each atomic, each
//! given `now`. Implemented by [`MemoryStore`](crate::MemoryStore) (the
//! reference model) and [`SqliteStore`](crate::SqliteStore).
//!
//! The API is synchronous: SQLite is. A store shared with other processes
//! waits for their writes (up to its busy timeout), so async code calls it
//! on tokio's blocking threads, as the sweeper, `DurablePromises::wait` and
//! the durable asks do (the one exception: the `create` that starts a
//! durable ask, see [`DurableAsk`](crate::DurableAsk)).

use crate::error::PromiseError;
use crate::model::{
    CallbackOutcome, CallbackRequest, ClaimRequest, Claimed, CompleteRequest, Completed,
    CreateRequest, Created, Lease, Millis, Promise, SearchQuery, Snapshot, Task,
};

pub type Result<T> = std::result::Result<T, PromiseError>;

/// Runs `op`, a call of a store, on tokio's blocking threads, for async
/// code: a store shared with other processes waits for their writes (up to
/// its busy timeout), which must not stall the runtime. A panic in `op` is
/// a storage failure.
pub(crate) async fn off_runtime<T: Send + 'static>(
    op: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(op).await.unwrap_or_else(|e| {
        Err(PromiseError::Storage {
            message: format!("a store operation panicked: {e}"),
        })
    })
}

/// See [`Store::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Settled, or its timeout is due.
    pub settled: bool,
    pub timeout_at: Millis,
}

/// What one [`Store::sweep`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// How many expired promises it timed out.
    pub timed_out: usize,
    /// How many expired promises it skipped. They stay pending, met by
    /// every sweep until the file is repaired. Reported here, not logged
    /// (every sweep would log them again): the sweeper and
    /// `DurablePromises::prune` log them.
    pub skipped: usize,
    /// The first [`MAX_REPORTED_CORRUPT`] of those, each as the `Corrupt`
    /// error that stopped it (naming the promise, or the rowid of a row
    /// whose id cannot be read, and the column): a file with many corrupt
    /// rows does not make a report of them all.
    pub corrupt: Vec<PromiseError>,
}

/// How many of the promises a sweep or a prune skipped it reports with
/// their error ([`Swept::corrupt`], [`Pruned::corrupt`]).
pub const MAX_REPORTED_CORRUPT: usize = 32;

/// What one [`Store::prune`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// How many promises it deleted.
    pub pruned: usize,
    /// How many prunable promises it skipped (as [`Swept::skipped`]):
    /// those whose id cannot be read (prune reads nothing else of a row).
    /// They stay in the file.
    pub skipped: usize,
    /// The first [`MAX_REPORTED_CORRUPT`] of those, as [`Swept::corrupt`].
    pub corrupt: Vec<PromiseError>,
}

pub trait Store: Send + Sync {
    /// Creates a promise (idempotent by key); see [`rules`](crate::rules).
    fn create(&self, req: &CreateRequest, now: Millis) -> Result<Created>;
    /// The promise, timed out first if its time has come.
    fn get(&self, id: &str, now: Millis) -> Result<Promise>;
    /// Whether the promise has settled (or its timeout is due: `get` then
    /// settles it), and its timeout, without reading its param and value:
    /// what a waiter polls.
    fn status(&self, id: &str, now: Millis) -> Result<Status> {
        let p = self.get(id, now)?;
        Ok(Status {
            settled: p.state.is_settled(),
            timeout_at: p.timeout_at,
        })
    }
    /// Resolves, rejects or cancels a promise, once; replays on its key.
    fn complete(&self, req: &CompleteRequest, now: Millis) -> Result<Completed>;
    fn search(&self, query: &SearchQuery, now: Millis) -> Result<Vec<Promise>>;
    /// Registers `Resume(awaiter, awaited)`, or answers that the awaited
    /// promise has already settled.
    fn register_callback(&self, req: &CallbackRequest, now: Millis) -> Result<CallbackOutcome>;
    /// Claims the next claimable task of a pool for a worker, if any.
    fn claim_task(&self, req: &ClaimRequest, now: Millis) -> Result<Option<Claimed>>;
    /// Extends a held lease to `now + lease_ms`.
    fn heartbeat(&self, lease: &Lease, lease_ms: Millis, now: Millis) -> Result<Task>;
    /// Completes a held resume task (invoke tasks complete with their
    /// promise).
    fn complete_task(&self, lease: &Lease, now: Millis) -> Result<()>;
    /// Times out up to `limit` expired pending promises, oldest deadline
    /// first. A promise that is corrupt in the file (its row, or a row its
    /// timeout reads, holds what the store never writes) is skipped, none
    /// of its timeout written, and reported; the sweep goes on past it, so
    /// `timed_out == limit` means more may be due. Any other failure fails
    /// the sweep, which then writes nothing.
    fn sweep(&self, now: Millis, limit: usize) -> Result<Swept>;
    /// Deletes up to `limit` promises settled before `settled_before` that
    /// no task refers to, by id, with the stale callbacks they had
    /// registered as awaiters. What keeps a long-running store bounded. An
    /// id is an idempotency key only while its promise is kept: once
    /// pruned, a create under it makes a new promise (and a durable ask
    /// under it is a new request, whose handler may run again). Corrupt
    /// rows are skipped and reported as by [`sweep`](Store::sweep).
    fn prune(&self, settled_before: Millis, limit: usize) -> Result<Pruned>;
    /// Everything stored, in canonical order, without applying timeouts.
    fn snapshot(&self) -> Result<Snapshot>;
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn create(&self, req: &CreateRequest, now: Millis) -> Result<Created> {
        (**self).create(req, now)
    }
    fn get(&self, id: &str, now: Millis) -> Result<Promise> {
        (**self).get(id, now)
    }
    fn status(&self, id: &str, now: Millis) -> Result<Status> {
        (**self).status(id, now)
    }
    fn complete(&self, req: &CompleteRequest, now: Millis) -> Result<Completed> {
        (**self).complete(req, now)
    }
    fn search(&self, query: &SearchQuery, now: Millis) -> Result<Vec<Promise>> {
        (**self).search(query, now)
    }
    fn register_callback(&self, req: &CallbackRequest, now: Millis) -> Result<CallbackOutcome> {
        (**self).register_callback(req, now)
    }
    fn claim_task(&self, req: &ClaimRequest, now: Millis) -> Result<Option<Claimed>> {
        (**self).claim_task(req, now)
    }
    fn heartbeat(&self, lease: &Lease, lease_ms: Millis, now: Millis) -> Result<Task> {
        (**self).heartbeat(lease, lease_ms, now)
    }
    fn complete_task(&self, lease: &Lease, now: Millis) -> Result<()> {
        (**self).complete_task(lease, now)
    }
    fn sweep(&self, now: Millis, limit: usize) -> Result<Swept> {
        (**self).sweep(now, limit)
    }
    fn prune(&self, settled_before: Millis, limit: usize) -> Result<Pruned> {
        (**self).prune(settled_before, limit)
    }
    fn snapshot(&self) -> Result<Snapshot> {
        (**self).snapshot()
    }
}
