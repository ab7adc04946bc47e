//! A profiling harness for the table's hot paths (not a benchmark: for
//! `valgrind --tool=cachegrind` and `perf record`).
//!
//! `cargo run --release -p askpool-dedup --example profile -- MODE OPS`
//! with MODE one of `lookup` (uniform hits over a full table of 100,000),
//! `keys` (the same loop without the lookup: subtract it), `insert`
//! (unique ids into the full table, each evicting), `storm1` / `storm2`
//! (one or two threads inserting the same fresh ids at capacity, as the
//! bench's duplicate storm), `mutex-storm1` / `mutex-storm2` (the same storm
//! through the `Mutex<HashMap>` + FIFO baseline: what a second core does to
//! a lock-based table on this machine).

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

use askpool_dedup::{DedupConfig, DedupState, DedupTable};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

const CAP: u64 = 100_000;
const NOW: Timestamp = Timestamp::from_nanos(1_000_000_000);

#[derive(Clone, Copy)]
struct V(#[allow(dead_code)] u64);

impl DedupState for V {
    fn is_terminal(&self) -> bool {
        true
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A key as the bench makes them.
fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(7),
        request: RequestId::from_parts(1_700_000_000_000_000 + (n >> 10), splitmix(n)),
    }
}

fn insert(t: &DedupTable<V>, n: u64) -> bool {
    t.apply(key(n), NOW, |cur| match cur {
        None => (Some(V(n)), true),
        Some(_) => (None, false),
    })
}

/// The bench's `Mutex<HashMap>` + FIFO baseline, bounded to `CAP`.
type MutexFifo = Mutex<(FxHashMap<DedupKey, V>, VecDeque<DedupKey>)>;

fn mutex_insert(t: &MutexFifo, n: u64) -> bool {
    let k = key(n);
    let mut g = t.lock();
    let (map, fifo) = &mut *g;
    if map.contains_key(&k) {
        return false;
    }
    map.insert(k, V(n));
    fifo.push_back(k);
    while fifo.len() as u64 > CAP {
        let old = fifo.pop_front().expect("over capacity, so not empty");
        map.remove(&old);
    }
    true
}

/// `threads` threads inserting the same ids `CAP..CAP + ops`.
fn storm(threads: usize, ops: u64, insert: impl Fn(u64) -> bool + Sync) {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for n in CAP..CAP + ops {
                    black_box(insert(n));
                }
            });
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("lookup", String::as_str);
    let ops: u64 = args.get(2).map_or(1_000_000, |s| s.parse().expect("ops"));
    let t = DedupTable::new(DedupConfig {
        max_terminal: CAP as usize,
        ..DedupConfig::default()
    });
    for n in 0..CAP {
        insert(&t, n);
    }
    let start = Instant::now();
    match mode {
        "lookup" | "keys" => {
            let mut x = 1u64;
            for _ in 0..ops {
                x = splitmix(x);
                let k = key(x % CAP);
                if mode == "lookup" {
                    black_box(t.get(&k, NOW));
                } else {
                    black_box(k);
                }
            }
        }
        "insert" => {
            for n in CAP..CAP + ops {
                black_box(insert(&t, n));
            }
        }
        "storm1" | "storm2" => storm(if mode == "storm1" { 1 } else { 2 }, ops, |n| insert(&t, n)),
        "mutex-storm1" | "mutex-storm2" => {
            let m = MutexFifo::default();
            for n in 0..CAP {
                mutex_insert(&m, n);
            }
            let threads = if mode == "mutex-storm1" { 1 } else { 2 };
            let start = Instant::now();
            storm(threads, ops, |n| mutex_insert(&m, n));
            let took = start.elapsed();
            eprintln!(
                "{mode}: {ops} ids in {took:?} ({:.1} ns per id)",
                took.as_nanos() as f64 / ops as f64
            );
            return;
        }
        other => panic!("unknown mode {other}"),
    }
    let took = start.elapsed();
    eprintln!(
        "{mode}: {ops} ops in {took:?} ({:.1} ns per op per thread), len {}",
        took.as_nanos() as f64 / ops as f64,
        t.len()
    );
}
