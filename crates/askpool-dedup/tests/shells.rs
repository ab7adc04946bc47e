//! Regression test: entries removed early on access must not leave their
//! node shells queued behind a head that is not yet due.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use askpool_dedup::{DedupConfig, DedupState, DedupTable};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

#[derive(Clone)]
struct Done;
impl DedupState for Done {
    fn is_terminal(&self) -> bool {
        true
    }
}

fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(1),
        request: RequestId::from_parts(0, n),
    }
}

/// One entry stamped with a later clock heads the FIFO; entries behind it
/// that expire are removed on access, but their node shells stay queued
/// (not counted in `terminal`, so capacity never pops them) until the head
/// expires.
#[test]
fn removed_shells_pile_up_behind_a_late_head() {
    let ttl = Duration::from_secs(10);
    let t = DedupTable::<Done>::new(DedupConfig {
        max_terminal: 1_000,
        terminal_ttl: ttl,
    });
    let s = |n: u64| Timestamp::ZERO + Duration::from_millis(n);
    t.apply(key(u64::MAX), s(60_000), |_| (Some(Done), ()));
    let base = LIVE.load(Ordering::Relaxed);
    for k in 0..200_000u64 {
        t.apply(key(k), s(k / 10), |_| (Some(Done), ()));
        // An access at the entry's own expiry: with a late head the entry
        // may live on (expiry stamps never go down the queue), but it must
        // not leave anything behind when it goes.
        let _ = t.get(&key(k), s(k / 10) + ttl);
    }
    let grew = LIVE.load(Ordering::Relaxed) - base;
    assert!(
        grew < 1_000 * 200,
        "grew {grew} bytes with <=2 terminal entries cached"
    );
}
