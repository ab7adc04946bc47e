//! Per-thread shards of what every request writes.
//!
//! A line that both cores write on every request moves between their caches
//! each time (about a hundred nanoseconds a move on this kind of machine):
//! with callers on two threads, such lines cost more than the work done
//! under them. A thread keeps to its own shard, so its writes stay in its own
//! cache; readers (stats, sweeps) visit every shard, rarely.
//!
//! Public for the bindings, which keep per-ask state of their own.

use std::cell::Cell;
use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;

/// The most shards anything has (a power of two).
pub const MAX_SHARDS: usize = 16;

/// Shards per sharded thing: the machine's threads, rounded up to a power
/// of two, at most [`MAX_SHARDS`].
pub fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .next_power_of_two()
            .min(MAX_SHARDS)
    })
}

/// The calling thread's shard among `count` (a power of two): threads are
/// numbered in the order they first ask, so the runtime's few threads get
/// different shards.
#[inline]
pub fn thread_shard(count: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let number = NUMBER.with(|number| {
        if number.get() == usize::MAX {
            number.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        number.get()
    });
    number & (count - 1)
}

/// One `T` per shard, each on lines of its own.
pub struct Sharded<T> {
    shards: Box<[CachePadded<T>]>,
}

impl<T> Sharded<T> {
    /// [`shard_count`] shards; `make(i)` makes shard `i`.
    pub fn new(make: impl FnMut(usize) -> T) -> Self {
        Self {
            shards: (0..shard_count()).map(make).map(CachePadded::new).collect(),
        }
    }

    /// The calling thread's shard.
    #[inline]
    pub fn mine(&self) -> &T {
        &self.shards[thread_shard(self.shards.len())]
    }

    /// Shard `i` (`i < len()`).
    pub fn get(&self, i: usize) -> &T {
        &self.shards[i]
    }

    /// The calling thread's shard number.
    pub fn my_index(&self) -> usize {
        thread_shard(self.shards.len())
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|shard| &**shard)
    }
}

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Self::new(|_| T::default())
    }
}

/// A map in shards that its user picks by key: keys that carry the shard
/// of the thread that made them (a request id's nonce, a Kotlin token's
/// stripe) keep each thread's entries in its own shard.
pub struct ShardedMap<K, V> {
    shards: Sharded<Mutex<FxHashMap<K, V>>>,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        Self {
            shards: Sharded::new(|_| Mutex::new(FxHashMap::default())),
        }
    }
}

impl<K: Eq + Hash, V> ShardedMap<K, V> {
    /// How many shards there are (a power of two).
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Shard `index` (below [`shards`](Self::shards)), locked.
    pub fn lock(&self, index: usize) -> MutexGuard<'_, FxHashMap<K, V>> {
        self.shards.get(index).lock()
    }

    /// Entries in every shard.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value, cloned out of the locks.
    pub fn values(&self) -> Vec<V>
    where
        V: Clone,
    {
        let mut values = Vec::new();
        for shard in self.shards.iter() {
            values.extend(shard.lock().values().cloned());
        }
        values
    }
}

/// A counter that threads add to without sharing a line. Signed: a count
/// that goes up on one thread and down on another leaves one stripe below
/// zero; only the sum means anything.
#[derive(Default)]
pub struct StripedCounter {
    stripes: Sharded<AtomicI64>,
}

impl StripedCounter {
    /// Inline: counted on every request, from generic code compiled in the
    /// user's crate (where a plain function is not inlined).
    #[inline]
    pub fn add(&self, n: i64) {
        self.stripes.mine().fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.load(Ordering::Relaxed))
            .sum()
    }

    /// The sum as a count that never goes below zero.
    pub fn count(&self) -> u64 {
        u64::try_from(self.get()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_striped_counter_sums_the_adds_of_every_thread() {
        let counter = Arc::new(StripedCounter::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || (0..10_000).for_each(|_| counter.add(1)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        counter.add(5);
        assert_eq!(counter.get(), 40_005);
    }

    #[test]
    fn a_striped_counter_sums_ups_and_downs_made_on_different_threads() {
        let gauge = Arc::new(StripedCounter::default());
        let up = {
            let gauge = Arc::clone(&gauge);
            std::thread::spawn(move || (0..1_000).for_each(|_| gauge.add(1)))
        };
        up.join().unwrap();
        (0..990).for_each(|_| gauge.add(-1));
        assert_eq!(gauge.get(), 10);
    }

    #[test]
    fn threads_get_shards_in_range_and_keep_them() {
        let count = shard_count();
        assert!(count.is_power_of_two() && count <= MAX_SHARDS);
        let mine = thread_shard(count);
        assert!(mine < count);
        assert_eq!(thread_shard(count), mine, "a thread keeps its shard");
        let other = std::thread::spawn(move || thread_shard(count))
            .join()
            .unwrap();
        assert!(other < count);
    }
}
