//! Bounded dedup table for the inbound side of askpool.
//!
//! The table stores one state per [`DedupKey`] and applies transitions that
//! the caller computes (askpool-proto's `inbound::step`) atomically per key.
//! It enforces the memory rules of DESIGN section 3:
//!
//! - Terminal entries are bounded by `max_terminal` (oldest terminal evicted
//!   first) and by `terminal_ttl`, counted from the moment the entry became
//!   terminal, not from arrival. A hit does not refresh either.
//! - In-progress entries are never evicted: the runtime bounds them with the
//!   pool's max in-flight and reads [`DedupStats::in_progress`].
//!
//! This implementation is a mutex around a hash map and a FIFO of terminal
//! entries: simple and correct. Its API is what the runtime depends on, so a
//! lock-free table can replace it without changes elsewhere.

use std::collections::VecDeque;
use std::time::Duration;

use askpool_proto::{DedupKey, InboundState, Timestamp};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// A state the table can store: it must say whether it is terminal.
pub trait DedupState {
    fn is_terminal(&self) -> bool;
}

impl<R> DedupState for InboundState<R> {
    fn is_terminal(&self) -> bool {
        InboundState::is_terminal(self)
    }
}

/// Bounds of a [`DedupTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupConfig {
    /// Most terminal entries kept; the oldest terminal is evicted first.
    pub max_terminal: usize,
    /// How long a terminal entry is kept after it became terminal.
    pub terminal_ttl: Duration,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self {
            max_terminal: 100_000,
            terminal_ttl: Duration::from_secs(120),
        }
    }
}

/// Counts of the entries in a table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupStats {
    pub in_progress: usize,
    pub terminal: usize,
    /// Terminal entries removed because of `max_terminal`.
    pub evicted_capacity: u64,
    /// Terminal entries removed because their TTL passed.
    pub evicted_ttl: u64,
}

struct Slot<S> {
    state: S,
    /// Ties a terminal entry to its FIFO item.
    generation: u64,
}

#[derive(Clone, Copy)]
struct FifoItem {
    key: DedupKey,
    generation: u64,
    since: Timestamp,
}

struct Inner<S> {
    map: FxHashMap<DedupKey, Slot<S>>,
    /// Terminal entries in the order they became terminal, with the time
    /// they did: expiry reads only the front of this queue, never the map,
    /// until something is actually due.
    fifo: VecDeque<FifoItem>,
    next_generation: u64,
    stats: DedupStats,
}

/// A bounded, thread-safe table of per-key protocol states.
pub struct DedupTable<S> {
    config: DedupConfig,
    inner: Mutex<Inner<S>>,
}

impl<S: DedupState> DedupTable<S> {
    pub fn new(config: DedupConfig) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner {
                map: FxHashMap::default(),
                fifo: VecDeque::new(),
                next_generation: 0,
                stats: DedupStats::default(),
            }),
        }
    }

    pub fn config(&self) -> DedupConfig {
        self.config
    }

    /// Applies one transition to `key` atomically: `transition` sees the
    /// current state (`None` when absent or expired) and returns the state to
    /// store (`None` leaves it unchanged) and a value handed back to the
    /// caller. A terminal state is never replaced; only eviction removes it.
    ///
    /// `transition` runs under the table's lock: it must not block or call
    /// back into the table.
    pub fn apply<O>(
        &self,
        key: DedupKey,
        now: Timestamp,
        transition: impl FnOnce(Option<&S>) -> (Option<S>, O),
    ) -> O {
        let mut inner = self.inner.lock();
        self.expire(&mut inner, now);
        let (next, out) = transition(inner.map.get(&key).map(|slot| &slot.state));
        if let Some(next) = next {
            inner.store(key, next, now);
            self.enforce_capacity(&mut inner);
        }
        out
    }

    /// The current state of `key`, if any.
    pub fn get(&self, key: &DedupKey, now: Timestamp) -> Option<S>
    where
        S: Clone,
    {
        let mut inner = self.inner.lock();
        self.expire(&mut inner, now);
        inner.map.get(key).map(|slot| slot.state.clone())
    }

    /// Removes terminal entries whose TTL passed by `now`.
    pub fn evict_expired(&self, now: Timestamp) {
        let mut inner = self.inner.lock();
        self.expire(&mut inner, now);
    }

    pub fn stats(&self) -> DedupStats {
        self.inner.lock().stats
    }

    /// All entries, in-progress and terminal.
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry (a worker restart loses its in-memory state).
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.map.clear();
        inner.fifo.clear();
        inner.stats.in_progress = 0;
        inner.stats.terminal = 0;
    }

    fn expire(&self, inner: &mut Inner<S>, now: Timestamp) {
        while let Some(front) = inner.fifo.front() {
            if front.since + self.config.terminal_ttl > now {
                break;
            }
            let FifoItem {
                key, generation, ..
            } = *front;
            inner.fifo.pop_front();
            // The entry may be gone already (evicted by capacity).
            if inner
                .map
                .get(&key)
                .is_some_and(|slot| slot.generation == generation)
            {
                inner.map.remove(&key);
                inner.stats.terminal -= 1;
                inner.stats.evicted_ttl += 1;
            }
        }
    }

    fn enforce_capacity(&self, inner: &mut Inner<S>) {
        while inner.stats.terminal > self.config.max_terminal {
            let Some(FifoItem {
                key, generation, ..
            }) = inner.fifo.pop_front()
            else {
                break;
            };
            if inner
                .map
                .get(&key)
                .is_some_and(|slot| slot.generation == generation)
            {
                inner.map.remove(&key);
                inner.stats.terminal -= 1;
                inner.stats.evicted_capacity += 1;
            }
        }
    }
}

impl<S: DedupState> Inner<S> {
    fn store(&mut self, key: DedupKey, next: S, now: Timestamp) {
        let terminal = next.is_terminal();
        match self.map.get_mut(&key) {
            Some(slot) => {
                if slot.state.is_terminal() {
                    debug_assert!(false, "a terminal state was asked to change");
                    return;
                }
                slot.state = next;
                if terminal {
                    self.stats.in_progress -= 1;
                    self.stats.terminal += 1;
                    slot.generation = self.next_generation;
                    self.fifo.push_back(FifoItem {
                        key,
                        generation: self.next_generation,
                        since: now,
                    });
                    self.next_generation += 1;
                }
            }
            None => {
                let generation = self.next_generation;
                self.next_generation += 1;
                if terminal {
                    self.stats.terminal += 1;
                    self.fifo.push_back(FifoItem {
                        key,
                        generation,
                        since: now,
                    });
                } else {
                    self.stats.in_progress += 1;
                }
                self.map.insert(
                    key,
                    Slot {
                        state: next,
                        generation,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
