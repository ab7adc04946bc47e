//! loom models of the table's races, with crossbeam-epoch's own loom support
//! and an explicit `Collector` per table (per model).
//!
//! `RUSTFLAGS="--cfg loom --cfg crossbeam_loom" cargo test -p askpool-dedup \
//!   --test loom --release`. Preemption bounds: small by default (fast
//! tier), larger with `ASKPOOL_LOOM_SLOW=1` (slow tier); an explicit
//! `LOOM_MAX_PREEMPTIONS` overrides both for every model.
#![cfg(loom)]

use std::time::Duration;

use askpool_dedup::{DedupConfig, DedupState, DedupTable};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};
use loom::sync::Arc;
use loom::thread;

#[derive(Clone, Debug, PartialEq)]
enum St {
    Running,
    Done(u32),
}

impl DedupState for St {
    fn is_terminal(&self) -> bool {
        matches!(self, St::Done(_))
    }
}

/// Runs a model with `fast` preemptions (fast tier) or `slow` ones (slow
/// tier), unless `LOOM_MAX_PREEMPTIONS` says otherwise.
fn model_bounded(fast: usize, slow: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    // Every atomic access is a branch of the path; with the phase an atomic
    // byte (read lock-free by lookups), dropping a model's collector (its
    // queue of deferred bags) took a long path past loom's default of 1,000
    // under the slow tier's preemption bound.
    builder.max_branches = 10_000;
    if builder.preemption_bound.is_none() {
        let slow_tier = std::env::var_os("ASKPOOL_LOOM_SLOW").is_some_and(|v| v == "1");
        builder.preemption_bound = Some(if slow_tier { slow } else { fast });
    }
    builder.check(f);
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    model_bounded(2, 3, f);
}

fn table(max_terminal: usize) -> DedupTable<St> {
    DedupTable::new(DedupConfig {
        max_terminal,
        terminal_ttl: Duration::from_secs(10),
    })
}

fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(1),
        request: RequestId::from_parts(0, n),
    }
}

/// Keys `0` and the first other key that land in the same bucket, so that
/// the races also go through one chain.
fn colliding(t: &DedupTable<St>) -> (DedupKey, DedupKey) {
    let a = key(0);
    let b = (1..)
        .map(key)
        .find(|k| t.bucket_index(k) == t.bucket_index(&a))
        .unwrap();
    (a, b)
}

const T0: Timestamp = Timestamp::ZERO;

#[test]
fn two_threads_inserting_the_same_key_one_wins_the_other_sees_it() {
    model(|| {
        let t = Arc::new(table(4));
        let racer = |t: Arc<DedupTable<St>>| {
            move || {
                t.apply(key(0), T0, |cur| match cur {
                    None => (Some(St::Running), None),
                    Some(s) => (None, Some(s.clone())),
                })
            }
        };
        let h = thread::spawn(racer(t.clone()));
        let mine = racer(t.clone())();
        let theirs = h.join().unwrap();
        // Exactly one saw the key absent; the other saw the winner's state.
        match (mine, theirs) {
            (None, Some(St::Running)) | (Some(St::Running), None) => {}
            other => panic!("both or neither won: {other:?}"),
        }
        assert_eq!(t.stats().in_progress, 1);
        assert_eq!(t.len(), 1);
    });
}

#[test]
fn insert_racing_eviction() {
    model(|| {
        // One terminal slot: inserting B evicts A (same chain) while another
        // thread touches A.
        let t = Arc::new(table(1));
        let (a, b) = colliding(&t);
        t.apply(a, T0, |_| (Some(St::Done(1)), ()));
        let t2 = t.clone();
        let h = thread::spawn(move || t2.apply(b, T0, |_| (Some(St::Done(2)), ())));
        let seen = t.apply(a, T0, |cur| match cur {
            None => (Some(St::Running), None),
            Some(s) => (None, Some(s.clone())),
        });
        h.join().unwrap();
        // A was either still cached (a replay) or already evicted (then it
        // came back in progress, which is never evicted).
        assert!(matches!(seen, None | Some(St::Done(1))), "{seen:?}");
        assert_eq!(t.get(&b, T0), Some(St::Done(2)));
        let s = t.stats();
        assert_eq!(s.terminal, 1);
        assert_eq!(s.evicted_capacity, 1);
        match seen {
            None => {
                assert_eq!(t.get(&a, T0), Some(St::Running));
                assert_eq!(s.in_progress, 1);
            }
            Some(_) => {
                assert_eq!(t.get(&a, T0), None);
                assert_eq!(s.in_progress, 0);
            }
        }
    });
}

#[test]
fn transition_to_terminal_racing_lookup() {
    model(|| {
        let t = Arc::new(table(4));
        let (a, b) = colliding(&t);
        t.apply(a, T0, |_| (Some(St::Running), ()));
        t.apply(b, T0, |_| (Some(St::Running), ()));
        let t2 = t.clone();
        let h = thread::spawn(move || {
            t2.apply(a, T0, |cur| {
                assert_eq!(cur, Some(&St::Running));
                (Some(St::Done(7)), ())
            })
        });
        // A lookup sees the state before or after, never a torn or missing
        // one; the neighbour in the chain is undisturbed.
        let got = t.get(&a, T0);
        assert!(
            matches!(got, Some(St::Running) | Some(St::Done(7))),
            "{got:?}"
        );
        assert_eq!(t.get(&b, T0), Some(St::Running));
        h.join().unwrap();
        assert_eq!(t.get(&a, T0), Some(St::Done(7)));
        let s = t.stats();
        assert_eq!((s.in_progress, s.terminal), (1, 1));
    });
}

/// A one-entry table holding key 0 (terminal, `Done(1)`), looked up once:
/// that first lookup (pinned) notes when the oldest entry is due, so the
/// next ones read with no pin and no lock.
fn one_terminal_entry() -> Arc<DedupTable<St>> {
    let t = Arc::new(table(1));
    t.apply(key(0), T0, |_| (Some(St::Done(1)), ()));
    assert_eq!(t.get(&key(0), T0), Some(St::Done(1)));
    t
}

#[test]
fn lock_free_lookup_racing_eviction_of_the_entry() {
    // `St` has no drop glue, so `get` reads a terminal entry with no pin
    // and no lock: it sees the entry or its absence, never another's state.
    model(|| {
        let t = one_terminal_entry();
        let t2 = t.clone();
        let h = thread::spawn(move || t2.apply(key(1), T0, |_| (Some(St::Done(2)), ())));
        let got = t.get(&key(0), T0);
        assert!(matches!(got, None | Some(St::Done(1))), "{got:?}");
        h.join().unwrap();
        assert_eq!(t.get(&key(0), T0), None);
        assert_eq!(t.get(&key(1), T0), Some(St::Done(2)));
        assert_eq!(t.stats().terminal, 1);
    });
}

#[test]
fn lock_free_lookup_racing_the_reuse_of_its_entrys_slot() {
    // The lookup holds no pin: the entry it reads may be evicted, its slot
    // freed and reused for another key while it reads. It must see the
    // entry or nothing, never the other key's state (the slot's version).
    // The lookup here is the read with no pin alone: with `get`'s pinned
    // fallback after it, loom reported this model nondeterministic whenever
    // the slot was reused (not understood yet); the fallback's own races
    // are the other models'.
    model(|| {
        let t = one_terminal_entry();
        let t2 = t.clone();
        let h = thread::spawn(move || {
            // Evicts key 0, then key 1: key 0's node, the eviction queue's
            // sentinel until then, is retired. Each pin of a loom table
            // tries to advance its epoch, so three pinned lookups free it,
            // and key 3's node may take its slot.
            t2.apply(key(1), T0, |_| (Some(St::Done(2)), ()));
            t2.apply(key(2), T0, |_| (Some(St::Done(3)), ()));
            for _ in 0..3 {
                assert_eq!(t2.get(&key(9), T0), None);
            }
            t2.apply(key(3), T0, |_| (Some(St::Done(4)), ()));
        });
        let got = t.get_unpinned_only(&key(0), T0);
        assert!(matches!(got, None | Some(St::Done(1))), "{got:?}");
        h.join().unwrap();
        assert_eq!(t.get(&key(3), T0), Some(St::Done(4)));
    });
}

#[test]
fn ttl_expiry_racing_reinsert_of_the_same_key() {
    model(|| {
        let t = Arc::new(table(4));
        t.apply(key(0), T0, |_| (Some(St::Done(1)), ()));
        let later = T0 + Duration::from_secs(10);
        let t2 = t.clone();
        let h = thread::spawn(move || t2.evict_expired(later));
        let seen = t.apply(key(0), later, |cur| (Some(St::Done(2)), cur.cloned()));
        h.join().unwrap();
        // The expired entry is gone either way, and the new one stays.
        assert_eq!(seen, None);
        assert_eq!(t.get(&key(0), later), Some(St::Done(2)));
        let s = t.stats();
        assert_eq!((s.terminal, s.evicted_ttl), (1, 1));
    });
}

#[test]
fn concurrent_evictions_share_the_queue() {
    // Three inserts with evictions: a much larger state space.
    model_bounded(1, 2, || {
        // Two inserts into a full table of one: both push onto the queue and
        // both evict; a node leaves the chain and the queue in either order.
        let t = Arc::new(table(1));
        let (a, b) = colliding(&t);
        let c = key(u64::MAX);
        t.apply(a, T0, |_| (Some(St::Done(1)), ()));
        let t2 = t.clone();
        let h = thread::spawn(move || t2.apply(b, T0, |_| (Some(St::Done(2)), ())));
        t.apply(c, T0, |_| (Some(St::Done(3)), ()));
        h.join().unwrap();
        let s = assert_one_slot_counts_exact(&t, &[a, b, c]);
        assert_eq!(s.evicted_capacity as usize, 3 - s.terminal);
    });
}

/// After racing terminal inserts into a table of one terminal slot, with
/// `keys` inserted oldest first: the oldest is gone and the terminal count
/// is what the table holds, at most one.
fn assert_one_slot_counts_exact(
    t: &DedupTable<St>,
    keys: &[DedupKey],
) -> askpool_dedup::DedupStats {
    let s = t.stats();
    let present = keys.iter().filter(|k| t.get(k, T0).is_some()).count();
    assert_eq!(t.get(&keys[0], T0), None, "the oldest goes first");
    assert!(s.terminal <= 1 && present == s.terminal, "{s:?} {present}");
    s
}

/// Found in review: `clear()` popped queued nodes without evicting them, so
/// an entry made terminal after the sweep passed its bucket stayed cached,
/// counted, and out of reach of TTL and capacity eviction for good.
#[test]
fn clear_racing_a_terminal_insert_leaves_nothing_unevictable() {
    model(|| {
        let t = Arc::new(table(4));
        let t2 = t.clone();
        let inserter = thread::spawn(move || {
            t2.apply(key(0), Timestamp::ZERO, |_| (Some(St::Done(1)), ()));
        });
        t.clear();
        inserter.join().unwrap();
        t.evict_expired(Timestamp::ZERO + Duration::from_secs(10));
        assert_eq!(t.stats().terminal, 0, "orphaned: {:?}", t.stats());
    });
}

/// An insert at capacity counts its entry only after queueing it, and then
/// evicts the oldest in its place without touching the count. TTL expiry
/// racing it may take the new entry off the count before it is counted, or
/// take the oldest first: whatever the order, the count ends exact.
#[test]
fn evicting_insert_racing_ttl_expiry_keeps_the_count_exact() {
    // A large state space (an eviction on each side): bound 1 in the fast
    // tier (a few seconds), 3 in the slow one (about four minutes here).
    model_bounded(1, 3, || {
        let t = Arc::new(table(1));
        let (a, b) = colliding(&t);
        t.apply(a, T0, |_| (Some(St::Done(1)), ()));
        let later = T0 + Duration::from_secs(10);
        let t2 = t.clone();
        // Due at `later`: both A and B (stamped at T0) expire there.
        let h = thread::spawn(move || t2.evict_expired(later));
        t.apply(b, T0, |_| (Some(St::Done(2)), ()));
        h.join().unwrap();
        let s = assert_one_slot_counts_exact(&t, &[a, b]);
        assert_eq!(s.evicted_capacity + s.evicted_ttl, 2 - s.terminal as u64);
        // And the table still works at capacity after it.
        t.apply(key(u64::MAX), later, |_| (Some(St::Done(3)), ()));
        let s = t.stats();
        assert_eq!(s.terminal, 1, "{s:?}");
        assert_eq!(t.get(&key(u64::MAX), later), Some(St::Done(3)));
    });
}

#[test]
fn two_bounded_inserts_of_different_keys_take_the_last_place_once() {
    model(|| {
        let t = Arc::new(table(4));
        let (a, b) = colliding(&t);
        let racer = |t: Arc<DedupTable<St>>, k: DedupKey| {
            move || {
                t.apply_bounded(k, T0, 1, |cur, has_room| match cur {
                    None if has_room => (Some(St::Running), true),
                    _ => (None, false),
                })
            }
        };
        let other = thread::spawn(racer(t.clone(), b));
        let mine = racer(t.clone(), a)();
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "exactly one of the two started");
        assert_eq!(t.in_progress(), 1);
    });
}
