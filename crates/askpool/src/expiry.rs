//! Entries in deadline order, for a sweeper that only looks at the front: a
//! pool's running requests (processing deadlines) and a node's asks that
//! wait for nothing but their deadline.
//!
//! Both get their deadlines as "now plus a timeout that rarely varies", so
//! deadlines arrive in insertion order: a ring in insertion order is already
//! sorted. To keep the order exact, a deadline earlier than the last one is
//! either raised to it ([`insert`](ExpiryIndex::insert): a pool's processing
//! deadlines, where that is the skew of two threads' clock reads,
//! nanoseconds) or refused ([`try_insert`](ExpiryIndex::try_insert): an
//! ask, which then keeps a timer of its own). An entry that ends is removed by marking its
//! place empty, found by binary search on its sequence number; empty places
//! leave from the front, and the ring is compacted once they outnumber the
//! live entries, so it never holds more than `2 * live + COMPACT_SLACK`
//! places. Unlike a `BTreeMap`, nothing is allocated per request once the
//! ring has grown to the pool's working size.

use std::collections::VecDeque;

use askpool_proto::{AskIds, Timestamp};

/// A position in the index: the deadline, and a sequence number that makes
/// it unique (and orders the ring).
pub(crate) type ExpiryKey = (Timestamp, u64);

/// What a pool's index keeps per running request.
#[derive(Clone, Copy)]
pub(crate) struct Expiring {
    pub(crate) ids: AskIds,
    pub(crate) expects_reply: bool,
}

/// Empty places tolerated beyond the live count before a compaction.
const COMPACT_SLACK: usize = 64;

pub(crate) struct ExpiryIndex<T> {
    /// In sequence (and so deadline) order; `None` marks a removed entry.
    ring: VecDeque<(ExpiryKey, Option<T>)>,
    live: usize,
    next_seq: u64,
    last_deadline: Timestamp,
}

impl<T> Default for ExpiryIndex<T> {
    fn default() -> Self {
        Self {
            ring: VecDeque::new(),
            live: 0,
            next_seq: 0,
            last_deadline: Timestamp::ZERO,
        }
    }
}

impl<T> ExpiryIndex<T> {
    /// An index whose sequence numbers start at `first_seq` (so that the
    /// shards of one queue hand out keys that never collide).
    pub(crate) fn starting_at(first_seq: u64) -> Self {
        Self {
            next_seq: first_seq,
            ..Self::default()
        }
    }

    /// Enters an entry due at `at` (or at the latest deadline so far, if
    /// that is later).
    pub(crate) fn insert(&mut self, at: Timestamp, what: T) -> ExpiryKey {
        let at = at.max(self.last_deadline);
        self.push(at, what)
    }

    /// Enters an entry due at `at`, unless an entry already entered is due
    /// later: then `what` comes back.
    pub(crate) fn try_insert(&mut self, at: Timestamp, what: T) -> Result<ExpiryKey, T> {
        if at < self.last_deadline {
            return Err(what);
        }
        Ok(self.push(at, what))
    }

    fn push(&mut self, at: Timestamp, what: T) -> ExpiryKey {
        self.last_deadline = at;
        let key = (at, self.next_seq);
        self.next_seq += 1;
        self.ring.push_back((key, Some(what)));
        self.live += 1;
        key
    }

    /// Removes the entry at `key`; false if it is not there (already popped
    /// by the sweeper, or removed).
    #[inline]
    pub(crate) fn remove(&mut self, key: ExpiryKey) -> bool {
        // Mostly the front (entries end in about the order they came): no
        // search then, and the entry leaves the ring at once (emptied in
        // place, it would be moved out twice: by the take, then the pop).
        let at = match self.ring.front() {
            Some((k, Some(_))) if *k == key => {
                self.ring.pop_front();
                self.live -= 1;
                self.settle();
                return true;
            }
            Some((k, _)) if k.1 == key.1 => 0,
            _ => self.ring.partition_point(|(k, _)| k.1 < key.1),
        };
        let Some((k, what)) = self.ring.get_mut(at) else {
            return false;
        };
        if *k != key || what.take().is_none() {
            return false;
        }
        self.live -= 1;
        self.settle();
        true
    }

    /// Takes the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Timestamp) -> Option<(ExpiryKey, T)> {
        self.drop_empty_front();
        match self.ring.front() {
            Some(((at, _), _)) if *at <= now => {}
            _ => return None,
        }
        let (key, what) = self.ring.pop_front()?;
        self.live -= 1;
        self.settle();
        what.map(|what| (key, what))
    }

    /// The earliest deadline still indexed (the front: every change leaves
    /// a live entry there, or an empty ring).
    pub(crate) fn next_deadline(&self) -> Option<Timestamp> {
        self.ring.front().map(|((at, _), _)| *at)
    }

    /// Places held, live or not: what the index costs in memory. Zero
    /// exactly when no entry is live.
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Entries not yet removed or popped.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The entries not yet removed or popped, in deadline order.
    pub(crate) fn live_entries(&self) -> impl Iterator<Item = &T> {
        self.ring.iter().filter_map(|(_, what)| what.as_ref())
    }

    fn drop_empty_front(&mut self) {
        while matches!(self.ring.front(), Some((_, None))) {
            self.ring.pop_front();
        }
    }

    /// Restores the ring's shape after a removal: a live front, and at most
    /// `2 * live + COMPACT_SLACK` places (compaction is linear, and runs at
    /// most once per `live + COMPACT_SLACK` removals).
    fn settle(&mut self) {
        self.drop_empty_front();
        if self.ring.len() > 2 * self.live + COMPACT_SLACK {
            self.ring.retain(|(_, what)| what.is_some());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use askpool_proto::{CallerId, RequestId};
    use std::collections::BTreeMap;

    fn what(n: u64) -> Expiring {
        Expiring {
            ids: AskIds::new(RequestId::from_parts(n, n), CallerId::from_u64(1)),
            expects_reply: true,
        }
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_duration(std::time::Duration::from_millis(ms))
    }

    /// Random inserts (with out-of-order clocks), removals and sweeps
    /// against a `BTreeMap`: the same entries come out due at the same
    /// instants, and the ring stays within its bound.
    #[test]
    fn matches_a_sorted_map_and_stays_bounded() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut index = ExpiryIndex::<Expiring>::default();
        let mut model: BTreeMap<u64, Timestamp> = BTreeMap::new();
        let mut keys: Vec<ExpiryKey> = Vec::new();
        let mut clock = 0u64;
        for step in 0..200_000u64 {
            match rng.random_range(0..10) {
                0..=4 => {
                    clock += rng.random_range(0..3);
                    // A clock read a little behind the last one.
                    let read = clock.saturating_sub(rng.random_range(0..2));
                    let key = index.insert(at(read + 100), what(step));
                    assert!(key.0 >= at(read + 100));
                    if let Some(&prev) = model.values().next_back() {
                        assert!(key.0 >= prev, "deadlines never go down");
                    }
                    model.insert(key.1, key.0);
                    keys.push(key);
                }
                5..=7 if !keys.is_empty() => {
                    let key = keys.swap_remove(rng.random_range(0..keys.len()));
                    assert_eq!(index.remove(key), model.remove(&key.1).is_some());
                    assert!(!index.remove(key), "a second removal finds nothing");
                }
                _ => {
                    let now = at(clock);
                    while let Some((key, _)) = index.pop_due(now) {
                        assert_eq!(model.remove(&key.1), Some(key.0));
                        assert!(key.0 <= now);
                    }
                    assert!(model.values().all(|d| *d > now), "everything due came out");
                }
            }
            assert_eq!(index.live, model.len());
            assert!(index.len() <= 2 * model.len() + COMPACT_SLACK);
            assert_eq!(index.next_deadline(), model.values().min().copied());
        }
        for key in keys {
            index.remove(key);
        }
        assert_eq!(index.len(), 0, "empty once nothing runs");
    }

    #[test]
    fn try_insert_refuses_an_earlier_deadline_and_keeps_the_order() {
        let mut index = ExpiryIndex::default();
        let a = index.try_insert(at(10), 1).unwrap();
        assert_eq!(index.try_insert(at(9), 2), Err(2));
        let b = index.try_insert(at(10), 3).unwrap();
        assert_eq!((a.0, b.0), (at(10), at(10)));
        assert_eq!(index.live(), 2);
        assert_eq!(index.pop_due(at(10)), Some((a, 1)));
        assert_eq!(index.pop_due(at(10)), Some((b, 3)));
        assert_eq!(index.pop_due(at(10)), None);
    }
}
