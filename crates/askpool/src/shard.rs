//! Per-thread shards of what every request writes.
//!
//! A line that both cores write on every request moves between their caches
//! each time (about a hundred nanoseconds a move on this kind of machine):
//! with callers on two threads, such lines cost more than the work done
//! under them. A thread keeps to its own shard, so its writes stay in its own
//! cache; readers (stats, sweeps) visit every shard, rarely.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

/// The most shards anything has (a power of two).
pub(crate) const MAX_SHARDS: usize = 16;

/// Shards per sharded thing: the machine's threads, rounded up to a power
/// of two, at most [`MAX_SHARDS`].
pub(crate) fn shard_count() -> usize {
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
pub(crate) fn thread_shard(count: usize) -> usize {
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

/// A counter that threads add to without sharing a line.
pub(crate) struct StripedCounter {
    stripes: Box<[CachePadded<AtomicU64>]>,
}

impl Default for StripedCounter {
    fn default() -> Self {
        Self {
            stripes: (0..shard_count())
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }
}

impl StripedCounter {
    pub(crate) fn add(&self, n: u64) {
        self.stripes[thread_shard(self.stripes.len())].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.load(Ordering::Relaxed))
            .sum()
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
