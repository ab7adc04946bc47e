//! Synchronisation primitives, switched to loom's under `--cfg loom`.
//!
//! Everything the table's correctness depends on goes through this module:
//! its counters, the per-entry lock and the epoch collector. The per-entry
//! lock is a spin lock on an atomic, loom's under loom (which then explores
//! every interleaving of it), and under loom every table has its own
//! `Collector`.

#[cfg(loom)]
use loom::thread;
#[cfg(not(loom))]
use std::thread;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

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
            // This thread's own handle on crossbeam's default collector,
            // pinned inline: `crossbeam_epoch::pin()` goes through an
            // out-of-line `with_handle` (about 10 instructions of a
            // 130-instruction lookup). If the handle is gone (the thread
            // is exiting), crossbeam's own path.
            HANDLE
                .try_with(|handle| handle.pin())
                .unwrap_or_else(|_| crossbeam_epoch::pin())
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    static HANDLE: crossbeam_epoch::LocalHandle = crossbeam_epoch::default_collector().register();
}

/// A one-byte lock guarding one entry's state. A new entry is created with
/// its lock already held (a reserved entry), so insert-if-absent never waits.
///
/// A spin lock, not a parking one: it is held only while a transition
/// closure runs, which must not block, so waiting is short. Taking it is one
/// compare-and-swap, releasing it a plain store, and a reserved entry is born
/// locked without any atomic write: one read-modify-write per hit instead of
/// a parking lock's two, and none for a new entry's lock.
pub(crate) struct NodeLock {
    flag: AtomicBool,
}

impl NodeLock {
    /// A lock that is held by its creator.
    #[cfg(loom)]
    pub(crate) fn new_locked() -> Self {
        Self {
            flag: AtomicBool::new(true),
        }
    }

    /// Makes the lock of a slot's new node held by its creator (the slot's
    /// previous node is gone: nobody else takes this lock).
    #[inline]
    pub(crate) fn init_locked(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_> {
        while self
            .flag
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.wait();
        }
        LockGuard { lock: self }
    }

    /// Waits, reading only, until the lock looks free: a few rounds of
    /// exponential spinning, then yielding the core, then short sleeps. A
    /// holder is only ever preempted, never blocked, so the sleeps are for
    /// a machine with more runnable threads than cores: there a waiter that
    /// kept yielding would still take its share of the cores from everyone,
    /// the preempted holder included.
    #[cold]
    fn wait(&self) {
        // Under loom every round just yields: the count goes unused.
        #[cfg_attr(loom, allow(unused_mut))]
        let mut round = 0u32;
        while self.flag.load(Ordering::Relaxed) {
            #[cfg(not(loom))]
            {
                if round < 6 {
                    for _ in 0..1u32 << round {
                        std::hint::spin_loop();
                    }
                } else if round < 16 {
                    thread::yield_now();
                } else {
                    thread::sleep(std::time::Duration::from_micros(50));
                }
                round = round.saturating_add(1);
            }
            #[cfg(loom)]
            {
                let _ = round;
                thread::yield_now();
            }
        }
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
