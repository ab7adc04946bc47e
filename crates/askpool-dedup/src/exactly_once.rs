//! Kameo-style exactly-once helpers (seed 001) on top of [`DedupTable`].
//!
//! [`ExactlyOnceDedup::resolve`] runs a side effect at most once per key
//! while the key is cached and replays its result to every duplicate:
//!
//! - the first call for a key inserts an in-progress entry (lock-free) and
//!   runs the closure *outside* any lock; a concurrent duplicate waits for
//!   that outcome instead of running the closure again;
//! - the result is stored (behind an `Arc`) before it is cloned for return,
//!   so a panicking `Clone` leaves the record in place (the panic gap);
//! - error results are just results: `R = Result<T, E>` is cached and
//!   replayed like any other value;
//! - [`ExactlyOnceDedup::resolve_checked`] compares payload fingerprints:
//!   a different fingerprint is a [`PayloadMismatch`] and the closure does
//!   not run; an entry stored by the unchecked `resolve` fails a checked call
//!   closed (the fingerprint-bypass rule);
//! - if the closure panics, the in-progress entry is removed and waiters
//!   retry (one of them runs it): nothing was recorded, so nothing replays.
//!
//! [`ExactlyOnceBytesDedup`] caches `Bytes`: a replay hands out the cached
//! buffer itself (a reference-count increment, same pointer, no copy).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use askpool_proto::{
    CallerId, DedupKey, FingerprintRecord, PayloadFingerprint, RequestId, Timestamp,
};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::{DedupConfig, DedupState, DedupStats, DedupTable};

/// The 128-bit fingerprint of a payload's bytes (XXH3-128: fast, not
/// cryptographic; it guards against accidental or buggy id reuse). For
/// in-process objects without bytes, build one with
/// [`PayloadFingerprint::from_u128`] from any stable digest.
pub fn fingerprint(bytes: &[u8]) -> PayloadFingerprint {
    PayloadFingerprint::from_u128(xxhash_rust::xxh3::xxh3_128(bytes))
}

/// A message with its idempotency key, as it travels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExactlyOnce<M> {
    pub request_id: RequestId,
    pub message: M,
}

impl<M> ExactlyOnce<M> {
    pub fn new(request_id: RequestId, message: M) -> Self {
        Self {
            request_id,
            message,
        }
    }

    /// The dedup key of this message as sent by `caller`.
    pub fn key(&self, caller: CallerId) -> DedupKey {
        DedupKey {
            caller,
            request: self.request_id,
        }
    }

    /// The fingerprint of the message's bytes.
    pub fn fingerprint(&self) -> PayloadFingerprint
    where
        M: AsRef<[u8]>,
    {
        fingerprint(self.message.as_ref())
    }
}

/// The same key came back with another payload; nothing ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadMismatch {
    pub key: DedupKey,
}

impl fmt::Display for PayloadMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request {} of caller {:?} was sent before with another payload",
            self.key.request, self.key.caller
        )
    }
}

impl std::error::Error for PayloadMismatch {}

/// The taxonomy's error (DESIGN section 6), as a caller sees it.
impl From<PayloadMismatch> for askpool_proto::AskError {
    fn from(_: PayloadMismatch) -> Self {
        askpool_proto::AskError::PayloadMismatch
    }
}

/// Signalled when an in-progress computation ends (stored or abandoned).
struct Done<R> {
    /// `None` while running; `Some(None)` abandoned; `Some(Some(r))` the result.
    flag: Mutex<Option<Option<Arc<R>>>>,
    cv: Condvar,
}

impl<R> Default for Done<R> {
    fn default() -> Self {
        Self {
            flag: Mutex::new(None),
            cv: Condvar::new(),
        }
    }
}

impl<R> Done<R> {
    fn wait(&self) -> Option<Arc<R>> {
        let mut done = self.flag.lock();
        loop {
            if let Some(r) = &*done {
                return r.clone();
            }
            self.cv.wait(&mut done);
        }
    }

    fn set(&self, r: Option<Arc<R>>) {
        let mut f = self.flag.lock();
        if f.is_none() {
            *f = Some(r);
        }
        drop(f);
        self.cv.notify_all();
    }
}

enum Slot<R> {
    InProgress {
        record: FingerprintRecord,
        done: Arc<Done<R>>,
    },
    Finished {
        record: FingerprintRecord,
        reply: Arc<R>,
    },
}

impl<R> DedupState for Slot<R> {
    fn is_terminal(&self) -> bool {
        matches!(self, Slot::Finished { .. })
    }
}

enum Step<R> {
    Run(Arc<Done<R>>),
    Wait(Arc<Done<R>>),
    Hit(Arc<R>),
    Mismatch,
}

/// A bounded replay cache of typed results.
pub struct ExactlyOnceDedup<R> {
    table: DedupTable<Slot<R>>,
    origin: Instant,
}

/// A replay cache of encoded replies: replays return the cached `Bytes`.
pub type ExactlyOnceBytesDedup = ExactlyOnceDedup<Bytes>;

impl<R: Clone> ExactlyOnceDedup<R> {
    pub fn new(config: DedupConfig) -> Self {
        Self {
            table: DedupTable::new(config),
            origin: Instant::now(),
        }
    }

    pub fn stats(&self) -> DedupStats {
        self.table.stats()
    }

    /// How many calls wait for `key`'s computation to end (for tests that
    /// must start a duplicate's wait before the computation ends).
    #[doc(hidden)]
    pub fn waiting(&self, key: DedupKey) -> usize {
        self.table.apply(key, self.now(), |current| match current {
            // The entry holds one reference and the running call another;
            // each waiting call holds one more.
            Some(Slot::InProgress { done, .. }) => {
                (None, Arc::strong_count(done).saturating_sub(2))
            }
            _ => (None, 0),
        })
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Runs `compute` once for `key` and replays its result to duplicates.
    pub fn resolve(&self, key: DedupKey, compute: impl FnOnce() -> R) -> R {
        match self.run(key, None, compute) {
            Ok(reply) => reply,
            Err(_) => unreachable!("an unchecked request is admitted by every entry"),
        }
    }

    /// Like [`resolve`](Self::resolve), refusing a key reused with another
    /// payload (or first stored unchecked).
    pub fn resolve_checked(
        &self,
        key: DedupKey,
        fingerprint: PayloadFingerprint,
        compute: impl FnOnce() -> R,
    ) -> Result<R, PayloadMismatch> {
        self.run(key, Some(fingerprint), compute)
    }

    /// [`resolve_checked`](Self::resolve_checked) with the fingerprint of
    /// `payload`'s bytes.
    pub fn resolve_payload(
        &self,
        key: DedupKey,
        payload: &[u8],
        compute: impl FnOnce() -> R,
    ) -> Result<R, PayloadMismatch> {
        self.run(key, Some(fingerprint(payload)), compute)
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    fn run(
        &self,
        key: DedupKey,
        fp: Option<PayloadFingerprint>,
        compute: impl FnOnce() -> R,
    ) -> Result<R, PayloadMismatch> {
        let mut compute = Some(compute);
        loop {
            let step = self.table.apply(key, self.now(), |current| match current {
                None => {
                    let done = Arc::new(Done::default());
                    let slot = Slot::InProgress {
                        record: FingerprintRecord::of(fp),
                        done: done.clone(),
                    };
                    (Some(slot), Step::Run(done))
                }
                Some(Slot::InProgress { record, done }) if record.admits(fp) => {
                    (None, Step::Wait(done.clone()))
                }
                Some(Slot::Finished { record, reply }) if record.admits(fp) => {
                    (None, Step::Hit(reply.clone()))
                }
                Some(_) => (None, Step::Mismatch),
            });
            match step {
                Step::Mismatch => return Err(PayloadMismatch { key }),
                // Cloned outside the entry's lock.
                Step::Hit(reply) => return Ok(R::clone(&reply)),
                Step::Wait(done) => {
                    if let Some(reply) = done.wait() {
                        return Ok(R::clone(&reply));
                    }
                }
                Step::Run(done) => {
                    let compute = compute.take().expect("runs at most once");
                    return Ok(self.compute_and_store(key, fp, done, compute));
                }
            }
        }
    }

    fn compute_and_store(
        &self,
        key: DedupKey,
        fp: Option<PayloadFingerprint>,
        done: Arc<Done<R>>,
        compute: impl FnOnce() -> R,
    ) -> R {
        /// Gives the key back if `compute` panics, and wakes the waiters.
        struct Abandon<'a, R> {
            table: &'a DedupTable<Slot<R>>,
            key: DedupKey,
            done: &'a Arc<Done<R>>,
            armed: bool,
        }
        impl<R> Drop for Abandon<'_, R> {
            fn drop(&mut self) {
                if self.armed {
                    let mine = |slot: &Slot<R>| matches!(slot, Slot::InProgress { done, .. } if Arc::ptr_eq(done, self.done));
                    drop(self.table.remove_in_progress(&self.key, mine));
                }
                self.done.set(None);
            }
        }
        let mut abandon = Abandon {
            table: &self.table,
            key,
            done: &done,
            armed: true,
        };
        let reply = Arc::new(compute());
        let stored = reply.clone();
        self.table.apply(key, self.now(), |current| match current {
            Some(Slot::InProgress { done: d, .. }) if Arc::ptr_eq(d, &done) => {
                let slot = Slot::Finished {
                    record: FingerprintRecord::of(fp),
                    reply: stored,
                };
                (Some(slot), ())
            }
            // Cleared meanwhile (and maybe taken by another call): the
            // result goes back to this caller only.
            _ => (None, ()),
        });
        abandon.armed = false;
        done.set(Some(reply.clone()));
        drop(abandon);
        // The record is in place: a panicking `Clone` cannot undo it.
        R::clone(&reply)
    }
}
