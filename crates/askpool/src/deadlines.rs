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
//! The sweeper runs on the tokio runtime of the call that first needed it.
//! If that runtime goes away (the task is dropped with it), the next insert
//! or [`DeadlineQueue::keep_alive`] starts a new one on the current runtime.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;

use askpool_proto::Timestamp;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::clock::NodeClock;
use crate::expiry::{ExpiryIndex, ExpiryKey};

/// What owns a [`DeadlineQueue`] and acts on its due entries.
pub(crate) trait DeadlineOwner: Send + Sync + 'static {
    type Item: Send + 'static;
    fn deadlines(&self) -> &DeadlineQueue<Self::Item>;
    fn clock(&self) -> &NodeClock;
    /// `item`, entered under `key`, is due (it has left the queue).
    fn fire(&self, key: ExpiryKey, item: Self::Item);
}

pub(crate) struct DeadlineQueue<T> {
    index: Mutex<ExpiryIndex<T>>,
    changed: Notify,
    /// A sweeper task exists (cleared when it ends, however it ends).
    running: AtomicBool,
    closed: AtomicBool,
    /// When the sweeper next wakes by itself (nanos of a `Timestamp`;
    /// `u64::MAX` while it waits for a first deadline). Written under the
    /// index lock.
    wakes_at: AtomicU64,
}

impl<T> Default for DeadlineQueue<T> {
    fn default() -> Self {
        Self {
            index: Mutex::default(),
            changed: Notify::new(),
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
        let mut index = self.index.lock();
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
        let mut index = self.index.lock();
        let key = index.try_insert(at, item)?;
        Ok(self.entered(owner, index, key))
    }

    fn entered<O>(
        &self,
        owner: &Weak<O>,
        index: parking_lot::MutexGuard<'_, ExpiryIndex<T>>,
        key: ExpiryKey,
    ) -> ExpiryKey
    where
        O: DeadlineOwner<Item = T>,
    {
        // Wake the sweeper only if it sleeps past this deadline.
        let wake = key.0.as_nanos() < self.wakes_at.load(Ordering::Acquire);
        drop(index);
        if wake {
            self.keep_alive(owner);
            self.changed.notify_one();
        }
        key
    }

    /// Starts the sweeper if none runs and a tokio runtime is current.
    pub(crate) fn keep_alive<O>(&self, owner: &Weak<O>)
    where
        O: DeadlineOwner<Item = T>,
    {
        if self.running.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(sweep(Running(owner.clone())));
    }
}

impl<T> DeadlineQueue<T> {
    /// Removes the entry at `key`; false if it already left (due, or
    /// removed before).
    pub(crate) fn remove(&self, key: ExpiryKey) -> bool {
        self.index.lock().remove(key)
    }

    /// Ends the sweeper; entries left in the queue never fire.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Places held (live entries and removed ones not yet dropped).
    pub(crate) fn len(&self) -> usize {
        self.index.lock().len()
    }

    /// Entries waiting for their deadline.
    pub(crate) fn live(&self) -> usize {
        self.index.lock().live()
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
        }
    }
}

/// Fires due entries, sleeping until the earliest one. Ends when its owner is
/// gone or closes the queue.
async fn sweep<O: DeadlineOwner>(running: Running<O>) {
    let Some(owner) = running.0.upgrade() else {
        return;
    };
    let queue = owner.deadlines();
    loop {
        if queue.closed.load(Ordering::Acquire) {
            return;
        }
        let now = owner.clock().now();
        let mut due = Vec::new();
        let next = {
            let mut index = queue.index.lock();
            while let Some(entry) = index.pop_due(now) {
                due.push(entry);
            }
            let next = index.next_deadline();
            queue.wakes_at.store(
                next.map_or(u64::MAX, Timestamp::as_nanos),
                Ordering::Release,
            );
            next
        };
        for (key, item) in due {
            owner.fire(key, item);
        }
        let changed = queue.changed.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = changed => {}
                    _ = tokio::time::sleep_until(owner.clock().instant(at)) => {}
                }
            }
            None => changed.await,
        }
    }
}
