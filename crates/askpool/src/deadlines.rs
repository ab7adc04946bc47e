//! A deadline queue and the task that sweeps it: many deadlines, one tokio
//! timer.
//!
//! A pool uses one for its running requests' processing deadlines, a node
//! for its asks that wait for nothing but their own deadline. A tokio timer
//! per entry costs an allocation, a registration in the time wheel and, on a
//! multi-thread runtime, often a wake-up of the thread parked on the timer
//! driver: per ask, that was as much as the protocol's own bookkeeping. Here
//! an entry is a push onto an [`ExpiryIndex`] ring under a short lock, and
//! the sweeper's timer is re-armed only when an entry is due before it
//! would wake anyway: deadlines mostly grow, so a busy queue wakes the
//! sweeper about once per timeout, not once per entry.
//!
//! The queue is split into shards (see `shard`): a thread enters its deadlines in its own shard. With
//! one lock and one ring for the whole node, two threads asking at once
//! fought over that lock and that ring's lines on every ask, and their
//! interleaved clock reads arrived out of order, which `try_insert`
//! refuses (the ask then fell back to a tokio timer). One sweeper serves
//! every shard.
//!
//! The sweeper runs on the tokio runtime of the call that first needed it.
//! If that runtime goes away (the task is dropped with it), the next insert
//! or [`DeadlineQueue::keep_alive`] starts a new one on the current runtime,
//! and the entries left waiting are handed to [`DeadlineOwner::orphaned`]:
//! the node wakes those asks, whose next poll starts a sweeper on their own
//! runtime. An ask awaited on another runtime while the sweeper's runtime
//! lives on but is no longer driven (a current-thread runtime outside
//! `block_on`) still waits for that runtime to run again: telling runtimes
//! apart on every ask would cost a shared reference count per ask.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use askpool_proto::Timestamp;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

use crate::clock::NodeClock;
use crate::expiry::{ExpiryIndex, ExpiryKey};
use crate::shard::Sharded;

/// What owns a [`DeadlineQueue`] and acts on its due entries.
pub(crate) trait DeadlineOwner: Send + Sync + 'static {
    type Item: Send + 'static;
    fn deadlines(&self) -> &DeadlineQueue<Self::Item>;
    fn clock(&self) -> &NodeClock;
    /// `item`, entered under `key`, is due (it has left the queue).
    fn fire(&self, key: ExpiryKey, item: Self::Item);
    /// The sweeper ended (its runtime went away) with entries waiting: the
    /// owner may have them start another (see [`Running`]). Default: nothing.
    fn orphaned(&self) {}
}

/// Where a shard's sequence numbers start: its index in the top bits.
const SHARD_SHIFT: u32 = 56;

pub(crate) struct DeadlineQueue<T> {
    shards: Sharded<Mutex<ExpiryIndex<T>>>,
    /// Shared with the sweeper, which waits on it holding no strong
    /// reference to the owner.
    changed: Arc<Notify>,
    /// A sweeper task exists (cleared when it ends, however it ends).
    running: AtomicBool,
    closed: AtomicBool,
    /// When the sweeper next wakes by itself (nanos of a `Timestamp`;
    /// `u64::MAX` while it waits for a first deadline, and while it scans
    /// the shards, so that an entry entered meanwhile wakes it again).
    wakes_at: AtomicU64,
}

impl<T> Default for DeadlineQueue<T> {
    fn default() -> Self {
        Self {
            shards: Sharded::new(|i| {
                Mutex::new(ExpiryIndex::starting_at((i as u64) << SHARD_SHIFT))
            }),
            changed: Arc::default(),
            running: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            wakes_at: AtomicU64::new(u64::MAX),
        }
    }
}

impl<T: Send + 'static> DeadlineQueue<T> {
    /// Enters `item` due at `at`, raising `at` to the latest deadline already
    /// entered if that is later (see [`ExpiryIndex::insert`]).
    pub(crate) fn insert<O>(&self, owner: &Weak<O>, at: Timestamp, item: T) -> ExpiryKey
    where
        O: DeadlineOwner<Item = T>,
    {
        let mut index = self.own_shard();
        let key = index.insert(at, item);
        self.entered(owner, index, key)
    }

    /// Enters `item` due exactly at `at`; gives it back when that would
    /// break the order (an entry due later is queued) or when there is no
    /// runtime to sweep on.
    pub(crate) fn try_insert<O>(
        &self,
        owner: &Weak<O>,
        at: Timestamp,
        item: T,
    ) -> Result<ExpiryKey, T>
    where
        O: DeadlineOwner<Item = T>,
    {
        if self.closed.load(Ordering::Acquire)
            || (!self.running.load(Ordering::Acquire)
                && tokio::runtime::Handle::try_current().is_err())
        {
            return Err(item);
        }
        let mut index = self.own_shard();
        let key = index.try_insert(at, item)?;
        Ok(self.entered(owner, index, key))
    }

    fn entered<O>(
        &self,
        owner: &Weak<O>,
        index: MutexGuard<'_, ExpiryIndex<T>>,
        key: ExpiryKey,
    ) -> ExpiryKey
    where
        O: DeadlineOwner<Item = T>,
    {
        // Wake the sweeper only if it sleeps past this deadline.
        let wake = key.0.as_nanos() < self.wakes_at.load(Ordering::Acquire);
        drop(index);
        if wake {
            let _ = self.keep_alive(owner);
            self.changed.notify_one();
        }
        key
    }

    /// Starts the sweeper if none runs and a tokio runtime is current;
    /// false if none runs and none could be started (no runtime here): an
    /// entry waiting in the queue would then wait for good.
    pub(crate) fn keep_alive<O>(&self, owner: &Weak<O>) -> bool
    where
        O: DeadlineOwner<Item = T>,
    {
        if self.running.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if !self.running.swap(true, Ordering::AcqRel) {
            runtime.spawn(sweep(Running(owner.clone())));
        }
        true
    }
}

impl<T> DeadlineQueue<T> {
    /// The calling thread's shard, locked.
    fn own_shard(&self) -> MutexGuard<'_, ExpiryIndex<T>> {
        self.shards.mine().lock()
    }

    /// Removes the entry at `key`; false if it already left (due, or
    /// removed before).
    pub(crate) fn remove(&self, key: ExpiryKey) -> bool {
        // The shard that entered it (any thread may remove it).
        self.shards
            .get((key.1 >> SHARD_SHIFT) as usize)
            .lock()
            .remove(key)
    }

    /// Ends the sweeper; entries left in the queue never fire.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Places held (live entries and removed ones not yet dropped).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    /// Entries waiting for their deadline.
    pub(crate) fn live(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().live()).sum()
    }

    /// The entries waiting for their deadline, copied out (no lock is held
    /// once this returns).
    pub(crate) fn waiting(&self) -> Vec<T>
    where
        T: Clone,
    {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(shard.lock().live_entries().cloned());
        }
        out
    }
}

/// The sweeper task's claim on its queue. Dropped with the task, however it
/// ends (also unpolled, when its runtime is gone), it marks the sweeper
/// gone: the next insert then starts another (it sees no planned wake-up,
/// so it wakes the sweeper, which starts it).
struct Running<O: DeadlineOwner>(Weak<O>);

impl<O: DeadlineOwner> Drop for Running<O> {
    fn drop(&mut self) {
        if let Some(owner) = self.0.upgrade() {
            let queue = owner.deadlines();
            queue.wakes_at.store(u64::MAX, Ordering::Release);
            queue.running.store(false, Ordering::Release);
            if !queue.closed.load(Ordering::Acquire) && queue.live() > 0 {
                owner.orphaned();
            }
        }
    }
}

/// Fires due entries, sleeping until the earliest one. Holds its owner only
/// while it fires: ends when the owner is gone or closes the queue.
async fn sweep<O: DeadlineOwner>(running: Running<O>) {
    loop {
        let Some(owner) = running.0.upgrade() else {
            return;
        };
        let queue = owner.deadlines();
        if queue.closed.load(Ordering::Acquire) {
            return;
        }
        let now = owner.clock().now();
        let mut due = Vec::new();
        // An entry entered in a shard already scanned sees this (its lock
        // comes after the scan's) and wakes the sweeper for another round.
        queue.wakes_at.store(u64::MAX, Ordering::Release);
        let mut next: Option<Timestamp> = None;
        for shard in queue.shards.iter() {
            let mut index = shard.lock();
            while let Some(entry) = index.pop_due(now) {
                due.push(entry);
            }
            next = match (next, index.next_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        queue.wakes_at.store(
            next.map_or(u64::MAX, Timestamp::as_nanos),
            Ordering::Release,
        );
        for (key, item) in due {
            owner.fire(key, item);
        }
        let notify = Arc::clone(&queue.changed);
        let wake_at = next.map(|at| owner.clock().instant(at));
        drop(owner);
        let changed = notify.notified();
        match wake_at {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = changed => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => changed.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Mutex as StdMutex};
    use std::time::Duration;

    struct Owner {
        queue: DeadlineQueue<(u64, Timestamp)>,
        clock: NodeClock,
        fired: StdMutex<Vec<(u64, Timestamp, Timestamp)>>,
        count: AtomicUsize,
    }

    impl DeadlineOwner for Owner {
        type Item = (u64, Timestamp);
        fn deadlines(&self) -> &DeadlineQueue<(u64, Timestamp)> {
            &self.queue
        }
        fn clock(&self) -> &NodeClock {
            &self.clock
        }
        fn fire(&self, _key: ExpiryKey, (id, due): (u64, Timestamp)) {
            let now = self.clock.now();
            self.fired.lock().unwrap().push((id, due, now));
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Threads enter deadlines in their own shards, some while the sweeper
    /// is sweeping, some removed again: every entry left fires once, never
    /// before its deadline, and the shards end empty.
    #[test]
    fn entries_from_many_threads_fire_once_each_and_on_time() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let owner = Arc::new(Owner {
            queue: DeadlineQueue::default(),
            clock: NodeClock::new(false),
            fired: StdMutex::default(),
            count: AtomicUsize::new(0),
        });
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 500;
        let kept: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let owner = Arc::clone(&owner);
                    let rt = rt.handle().clone();
                    s.spawn(move || {
                        let _runtime = rt.enter();
                        let weak = Arc::downgrade(&owner);
                        let mut kept = 0;
                        for i in 0..PER_THREAD {
                            let id = t * PER_THREAD + i;
                            let due = owner.clock.now() + Duration::from_millis(1 + id % 20);
                            let key = owner.queue.insert(&weak, due, (id, due));
                            if i % 5 == 0 {
                                owner.queue.remove(key);
                            } else {
                                kept += 1;
                            }
                            if i % 50 == 0 {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                        kept
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while owner.count.load(Ordering::SeqCst) < kept && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let fired = owner.fired.lock().unwrap().clone();
        assert_eq!(fired.len(), kept, "every entry not removed fired");
        let mut ids: Vec<u64> = fired.iter().map(|f| f.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), kept, "none fired twice");
        assert!(
            ids.iter().all(|id| id % PER_THREAD % 5 != 0),
            "no removed entry fired"
        );
        assert!(
            fired.iter().all(|(_, due, at)| at >= due),
            "none fired early"
        );
        assert_eq!((owner.queue.live(), owner.queue.len()), (0, 0));
        owner.queue.close();
    }
}
