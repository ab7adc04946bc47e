use super::*;
use askpool_proto::{CallerId, RequestId};

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

fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(1),
        request: RequestId::from_parts(0, n),
    }
}

fn at(secs: u64) -> Timestamp {
    Timestamp::ZERO + Duration::from_secs(secs)
}

fn table(max_terminal: usize, ttl_secs: u64) -> DedupTable<St> {
    DedupTable::new(DedupConfig {
        max_terminal,
        terminal_ttl: Duration::from_secs(ttl_secs),
    })
}

fn put(t: &DedupTable<St>, k: u64, now: Timestamp, s: St) {
    t.apply(key(k), now, |_| (Some(s), ()));
}

#[test]
fn insert_if_absent_sees_the_existing_state() {
    let t = table(10, 60);
    let first = t.apply(key(1), at(0), |cur| match cur {
        None => (Some(St::Running), true),
        Some(_) => (None, false),
    });
    let second = t.apply(key(1), at(0), |cur| match cur {
        None => (Some(St::Running), true),
        Some(_) => (None, false),
    });
    assert!(first && !second);
    assert_eq!(t.stats().in_progress, 1);
}

#[test]
fn ttl_counts_from_becoming_terminal_not_from_arrival() {
    let t = table(10, 60);
    put(&t, 1, at(0), St::Running);
    // The handler runs longer than the TTL.
    put(&t, 1, at(100), St::Done(7));
    assert_eq!(t.get(&key(1), at(159)), Some(St::Done(7)));
    assert_eq!(t.get(&key(1), at(160)), None);
    assert_eq!(t.stats().evicted_ttl, 1);
    assert_eq!(t.stats().terminal, 0);
}

#[test]
fn in_progress_entries_are_never_evicted() {
    let t = table(2, 1);
    put(&t, 1, at(0), St::Running);
    for k in 2..10 {
        put(&t, k, at(k), St::Done(k as u32));
    }
    assert_eq!(t.get(&key(1), at(1_000)), Some(St::Running));
    let s = t.stats();
    assert_eq!((s.in_progress, s.terminal), (1, 0));
}

#[test]
fn capacity_evicts_oldest_terminal_first_and_hits_do_not_refresh() {
    let t = table(3, 1_000);
    for k in 1..=3 {
        put(&t, k, at(k), St::Done(k as u32));
    }
    // A hit on the oldest must not save it.
    assert!(t.get(&key(1), at(4)).is_some());
    put(&t, 4, at(5), St::Done(4));
    assert_eq!(t.get(&key(1), at(5)), None);
    for k in 2..=4 {
        assert!(t.get(&key(k), at(5)).is_some(), "key {k}");
    }
    let s = t.stats();
    assert_eq!((s.terminal, s.evicted_capacity), (3, 1));
}

#[test]
fn eviction_order_follows_becoming_terminal_not_insertion() {
    let t = table(1, 1_000);
    put(&t, 1, at(0), St::Running);
    put(&t, 2, at(1), St::Done(2));
    put(&t, 1, at(2), St::Done(1));
    // Key 2 became terminal first, so it goes first.
    assert_eq!(t.get(&key(2), at(3)), None);
    assert_eq!(t.get(&key(1), at(3)), Some(St::Done(1)));
}

#[test]
fn fifo_stays_bounded_under_churn() {
    let t = table(100, 5);
    for k in 0..100_000u64 {
        put(&t, k, at(k / 50), St::Done(0));
    }
    let inner = t.inner.lock();
    assert!(inner.map.len() <= 100);
    assert!(inner.fifo.len() <= 100, "fifo {}", inner.fifo.len());
}

#[test]
fn reinserted_key_after_expiry_has_a_fresh_lifetime() {
    let t = table(10, 10);
    put(&t, 1, at(0), St::Done(1));
    assert_eq!(t.get(&key(1), at(10)), None);
    put(&t, 1, at(11), St::Done(2));
    assert_eq!(t.get(&key(1), at(20)), Some(St::Done(2)));
    assert_eq!(t.get(&key(1), at(21)), None);
}
