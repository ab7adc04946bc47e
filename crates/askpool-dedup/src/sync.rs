//! Synchronisation primitives, switched to loom's under `--cfg loom`.
//!
//! Everything the table's correctness depends on goes through this module:
//! its counters, the per-entry lock and the epoch collector. Under loom the
//! per-entry lock is a spin lock on a loom atomic (loom explores every
//! interleaving of it), and every table has its own `Collector`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crossbeam_epoch::Guard;

/// The epoch domain of one table. In production every table shares
/// crossbeam's default collector (a thread-local handle, no registration per
/// call); under loom each table owns a `Collector`, so that each model starts
/// from a clean epoch state and frees all of its garbage when it ends.
pub(crate) struct Epoch {
    #[cfg(loom)]
    collector: crossbeam_epoch::Collector,
}

impl Epoch {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(loom)]
            collector: crossbeam_epoch::Collector::new(),
        }
    }

    #[inline]
    pub(crate) fn pin(&self) -> Guard {
        #[cfg(loom)]
        {
            self.collector.register().pin()
        }
        #[cfg(not(loom))]
        {
            crossbeam_epoch::pin()
        }
    }
}

/// A one-byte lock guarding one entry's state. A new entry is created with
/// its lock already held (a reserved entry), so insert-if-absent never waits.
pub(crate) struct NodeLock {
    #[cfg(not(loom))]
    raw: parking_lot::RawMutex,
    #[cfg(loom)]
    flag: AtomicBool,
}

#[cfg(not(loom))]
use parking_lot::lock_api::RawMutex as _;

impl NodeLock {
    /// A lock that is held by its creator.
    pub(crate) fn new_locked() -> Self {
        #[cfg(not(loom))]
        {
            let raw = parking_lot::RawMutex::INIT;
            // A fresh lock nobody else can see: this always succeeds, and a
            // held parking_lot lock without waiters may be moved.
            let taken = raw.try_lock();
            debug_assert!(taken);
            Self { raw }
        }
        #[cfg(loom)]
        {
            Self {
                flag: AtomicBool::new(true),
            }
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_> {
        #[cfg(not(loom))]
        self.raw.lock();
        #[cfg(loom)]
        while self
            .flag
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            loom::thread::yield_now();
        }
        LockGuard { lock: self }
    }

    /// Takes over a lock that the caller holds (the creator of a reserved
    /// entry).
    ///
    /// # Safety
    /// The lock must be held by the current thread and not owned by any
    /// other guard.
    #[inline]
    pub(crate) unsafe fn adopt(&self) -> LockGuard<'_> {
        LockGuard { lock: self }
    }

    #[inline]
    unsafe fn unlock(&self) {
        #[cfg(not(loom))]
        self.raw.unlock();
        #[cfg(loom)]
        self.flag.store(false, Ordering::Release);
    }
}

/// Releases a [`NodeLock`] on drop (also when a transition closure panics).
pub(crate) struct LockGuard<'a> {
    lock: &'a NodeLock,
}

impl Drop for LockGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: a guard exists only while its lock is held by this thread.
        unsafe { self.lock.unlock() }
    }
}
