//! Multi-thread stress: duplicate storms (many threads racing the same ids),
//! exactly one execution per id, and states that count their drops.

use std::sync::atomic::{AtomicIsize, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use askpool_dedup::{DedupConfig, DedupState, DedupTable, ExactlyOnceDedup};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};

const THREADS: usize = 8;

fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(n % 5),
        request: RequestId::from_parts(n.wrapping_mul(0x9e37_79b9), n),
    }
}

/// A state that counts live instances.
struct Counted {
    done: bool,
    live: Arc<AtomicIsize>,
}

impl Counted {
    fn new(live: &Arc<AtomicIsize>, done: bool) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self {
            done,
            live: live.clone(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        assert!(self.live.fetch_sub(1, Ordering::SeqCst) > 0, "double drop");
    }
}

impl DedupState for Counted {
    fn is_terminal(&self) -> bool {
        self.done
    }
}

/// Every thread walks the same ids (each from its own offset) and does what
/// the inbound side does: the first to see an id absent runs it, everyone
/// else gets a duplicate; the runner then makes it terminal.
fn storm(ids: u64, max_terminal: usize, rounds: usize) -> (Vec<u32>, Arc<AtomicIsize>, u64) {
    let live = Arc::new(AtomicIsize::new(0));
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..ids).map(|_| AtomicU32::new(0)).collect());
    let duplicates = Arc::new(AtomicU64::new(0));
    {
        let table = Arc::new(DedupTable::<Counted>::new(DedupConfig {
            max_terminal,
            terminal_ttl: Duration::from_secs(3_600),
        }));
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (table, runs, live, barrier, duplicates) = (
                    table.clone(),
                    runs.clone(),
                    live.clone(),
                    barrier.clone(),
                    duplicates.clone(),
                );
                std::thread::spawn(move || {
                    barrier.wait();
                    for round in 0..rounds {
                        for i in 0..ids {
                            // Neighbouring threads hit the same ids at the
                            // same time.
                            let id = (i + (t as u64 / 2) * 7 + round as u64) % ids;
                            let now = Timestamp::from_nanos(i);
                            let run = table.apply(key(id), now, |cur| match cur {
                                None => (Some(Counted::new(&live, false)), true),
                                Some(_) => (None, false),
                            });
                            if run {
                                runs[id as usize].fetch_add(1, Ordering::SeqCst);
                                table.apply(key(id), now, |cur| {
                                    assert!(cur.is_some_and(|c| !c.done));
                                    (Some(Counted::new(&live, true)), ())
                                });
                            } else {
                                duplicates.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = table.stats();
        assert_eq!(s.in_progress, 0);
        assert!(s.terminal <= max_terminal, "{s:?}");
        assert_eq!(table.len(), s.terminal);
        assert_eq!(live.load(Ordering::SeqCst) as usize, s.terminal);
    }
    let runs = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    (runs, live, duplicates.load(Ordering::Relaxed))
}

#[test]
fn duplicate_storm_runs_each_id_exactly_once() {
    let ids = 20_000;
    let (runs, live, duplicates) = storm(ids, ids as usize, 2);
    assert!(runs.iter().all(|&r| r == 1), "an id ran twice or never");
    assert_eq!(duplicates, ids * (THREADS as u64 * 2 - 1));
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "leaked or double-dropped states"
    );
}

#[test]
fn duplicate_storm_under_eviction_pressure_stays_bounded_and_leak_free() {
    // The cache holds far fewer ids than the storm: ids get evicted and may
    // legitimately run again, but the table stays in bounds and every state
    // is dropped exactly once.
    let (runs, live, _) = storm(5_000, 64, 3);
    assert!(runs.iter().all(|&r| r >= 1));
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn exactly_once_storm_runs_each_id_once_and_replays_to_all() {
    let ids = 5_000u64;
    let dedup = Arc::new(ExactlyOnceDedup::<u64>::new(DedupConfig {
        max_terminal: ids as usize,
        terminal_ttl: Duration::from_secs(3_600),
    }));
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..ids).map(|_| AtomicU32::new(0)).collect());
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (dedup, runs, barrier) = (dedup.clone(), runs.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..ids {
                    let id = (i + t as u64 % 2) % ids;
                    let got = dedup.resolve(key(id), || {
                        runs[id as usize].fetch_add(1, Ordering::SeqCst);
                        // Long enough for duplicates to find it in progress.
                        if id % 64 == 0 {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        id * 3
                    });
                    assert_eq!(got, id * 3);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(runs.iter().all(|r| r.load(Ordering::SeqCst) == 1));
    assert_eq!(dedup.stats().in_progress, 0);
}

#[test]
fn churn_with_ttl_clear_and_lookups_is_leak_free() {
    // Every operation at once on a tiny table: inserts, transitions, TTL
    // expiry from clocks that differ per thread, lookups, clears.
    let live = Arc::new(AtomicIsize::new(0));
    {
        let table = Arc::new(DedupTable::<Counted>::new(DedupConfig {
            max_terminal: 16,
            terminal_ttl: Duration::from_micros(50),
        }));
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (table, live, barrier) = (table.clone(), live.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for i in 0..20_000u64 {
                        let id = (i * 7 + t) % 200;
                        let now = Timestamp::from_nanos(i * 1_000 + t * 3_000);
                        match i % 11 {
                            0 => table.evict_expired(now),
                            1 if t == 0 && i % 1_000 == 1 => table.clear(),
                            2..=4 => {
                                let _ = table.apply(key(id), now, |cur| {
                                    (None::<Counted>, cur.map(|c| c.done))
                                });
                            }
                            _ => {
                                let done = i % 3 == 0;
                                table.apply(key(id), now, |cur| match cur {
                                    Some(c) if c.done => (None, ()),
                                    _ => (Some(Counted::new(&live, done)), ()),
                                });
                            }
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = table.stats();
        assert_eq!(table.len(), s.in_progress + s.terminal);
        assert_eq!(live.load(Ordering::SeqCst) as usize, table.len());
        table.clear();
        assert_eq!(live.load(Ordering::SeqCst), 0);
        assert!(table.is_empty());
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
}
