//! `cargo bench -p askpool-dedup --bench dedup` (`cargo xtask bench dedup`).
//!
//! Workloads (issue 3), every one on every table, one run, one hasher
//! (`FxBuildHasher`) for all, 16-byte request ids in a `DedupKey`:
//! - `lookup_uniform`, `lookup_zipf`: a hit, keys uniform or Zipf(0.99);
//! - `insert_at_capacity`: insert-if-absent of unique ids into a full table,
//!   so every insert evicts;
//! - `storm_1t`, `storm_2t`: duplicate storm, one or two threads inserting
//!   the same fresh ids (the second finds each one the first inserted);
//! - `mixed`: 90% lookup / 9% insert / 1% transition (insert in progress,
//!   then make it terminal) at capacity.
//!
//! Baselines: `Mutex<HashMap>` + FIFO (the previous implementation), dashmap
//! and papaya (unbounded maps: the bench removes the oldest id itself, which
//! it knows), quick_cache (bounded, no TTL), moka sync cache with a TTL.
//! The ratio table at the end is askpool's time over the baseline's
//! (below 1.0: askpool is faster), and the 2-thread/1-thread throughput.

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use askpool_dedup::{DedupConfig, DedupState, DedupTable};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};
use criterion::Criterion;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustc_hash::{FxBuildHasher, FxHashMap};

const CAP: usize = 100_000;
const NOW: Timestamp = Timestamp::from_nanos(1_000_000_000);

fn key(n: u64) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(7),
        // A RequestId as generated: time in the high half, random low half.
        request: RequestId::from_parts(1_700_000_000_000_000 + (n >> 10), splitmix(n)),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Clone, Copy)]
struct V {
    value: u64,
    done: bool,
}

impl DedupState for V {
    fn is_terminal(&self) -> bool {
        self.done
    }
}

/// What every table is asked to do.
trait Table: Sync {
    fn name(&self) -> &'static str;
    fn get(&self, k: &DedupKey) -> Option<u64>;
    /// Inserts unless present; `oldest` is the id a bounded table would
    /// evict (used by the unbounded maps only). True if inserted.
    fn insert_if_absent(&self, k: DedupKey, v: u64, done: bool, oldest: Option<DedupKey>) -> bool;
    /// Makes an in-progress entry terminal.
    fn finish(&self, k: DedupKey, v: u64);
}

struct Ours(DedupTable<V>);

impl Table for Ours {
    fn name(&self) -> &'static str {
        "askpool"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.get(k, NOW).map(|v| v.value)
    }
    fn insert_if_absent(&self, k: DedupKey, value: u64, done: bool, _: Option<DedupKey>) -> bool {
        self.0.apply(k, NOW, |cur| match cur {
            None => (Some(V { value, done }), true),
            Some(_) => (None, false),
        })
    }
    fn finish(&self, k: DedupKey, value: u64) {
        self.0
            .apply(k, NOW, |_| (Some(V { value, done: true }), ()))
    }
}

/// The previous implementation's shape: one mutex, a map and a FIFO.
struct MutexFifo(Mutex<(FxHashMap<DedupKey, V>, VecDeque<DedupKey>)>);

impl Table for MutexFifo {
    fn name(&self) -> &'static str {
        "mutex_fifo"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.lock().0.get(k).map(|v| v.value)
    }
    fn insert_if_absent(&self, k: DedupKey, value: u64, done: bool, _: Option<DedupKey>) -> bool {
        let mut g = self.0.lock();
        let (map, fifo) = &mut *g;
        if map.contains_key(&k) {
            return false;
        }
        map.insert(k, V { value, done });
        if done {
            fifo.push_back(k);
            while fifo.len() > CAP {
                let old = fifo.pop_front().unwrap();
                map.remove(&old);
            }
        }
        true
    }
    fn finish(&self, k: DedupKey, value: u64) {
        let mut g = self.0.lock();
        let (map, fifo) = &mut *g;
        map.insert(k, V { value, done: true });
        fifo.push_back(k);
        while fifo.len() > CAP {
            let old = fifo.pop_front().unwrap();
            map.remove(&old);
        }
    }
}

struct Dash(dashmap::DashMap<DedupKey, V, FxBuildHasher>);

impl Table for Dash {
    fn name(&self) -> &'static str {
        "dashmap"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.get(k).map(|v| v.value)
    }
    fn insert_if_absent(
        &self,
        k: DedupKey,
        value: u64,
        done: bool,
        oldest: Option<DedupKey>,
    ) -> bool {
        let inserted = match self.0.entry(k) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(e) => {
                e.insert(V { value, done });
                true
            }
        };
        if let (true, Some(old)) = (inserted, oldest) {
            self.0.remove(&old);
        }
        inserted
    }
    fn finish(&self, k: DedupKey, value: u64) {
        self.0.insert(k, V { value, done: true });
    }
}

struct Papaya(papaya::HashMap<DedupKey, V, FxBuildHasher>);

impl Table for Papaya {
    fn name(&self) -> &'static str {
        "papaya"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.pin().get(k).map(|v| v.value)
    }
    fn insert_if_absent(
        &self,
        k: DedupKey,
        value: u64,
        done: bool,
        oldest: Option<DedupKey>,
    ) -> bool {
        let m = self.0.pin();
        let inserted = m.try_insert(k, V { value, done }).is_ok();
        if let (true, Some(old)) = (inserted, oldest) {
            m.remove(&old);
        }
        inserted
    }
    fn finish(&self, k: DedupKey, value: u64) {
        self.0.pin().insert(k, V { value, done: true });
    }
}

type Quick = quick_cache::sync::Cache<
    DedupKey,
    u64,
    quick_cache::UnitWeighter,
    FxBuildHasher,
    quick_cache::sync::DefaultLifecycle<DedupKey, u64>,
>;

struct QuickCache(Quick);

impl Table for QuickCache {
    fn name(&self) -> &'static str {
        "quick_cache"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.get(k)
    }
    fn insert_if_absent(&self, k: DedupKey, value: u64, _: bool, _: Option<DedupKey>) -> bool {
        match self.0.get_value_or_guard(&k, None) {
            quick_cache::sync::GuardResult::Guard(g) => {
                let _ = g.insert(value);
                true
            }
            _ => false,
        }
    }
    fn finish(&self, k: DedupKey, value: u64) {
        self.0.insert(k, value);
    }
}

struct Moka(moka::sync::Cache<DedupKey, u64, FxBuildHasher>);

impl Table for Moka {
    fn name(&self) -> &'static str {
        "moka_ttl"
    }
    fn get(&self, k: &DedupKey) -> Option<u64> {
        self.0.get(k)
    }
    fn insert_if_absent(&self, k: DedupKey, value: u64, _: bool, _: Option<DedupKey>) -> bool {
        self.0.entry(k).or_insert(value).is_fresh()
    }
    fn finish(&self, k: DedupKey, value: u64) {
        self.0.insert(k, value);
    }
}

fn tables() -> Vec<Box<dyn Table>> {
    vec![
        Box::new(Ours(DedupTable::new(DedupConfig {
            max_terminal: CAP,
            terminal_ttl: Duration::from_secs(120),
        }))),
        Box::new(MutexFifo(Mutex::default())),
        Box::new(Dash(dashmap::DashMap::with_capacity_and_hasher(
            CAP,
            FxBuildHasher,
        ))),
        Box::new(Papaya(
            papaya::HashMap::builder()
                .capacity(CAP)
                .hasher(FxBuildHasher)
                .build(),
        )),
        Box::new(QuickCache(Quick::with(
            CAP,
            CAP as u64,
            quick_cache::UnitWeighter,
            FxBuildHasher,
            Default::default(),
        ))),
        Box::new(Moka(
            moka::sync::Cache::builder()
                .max_capacity(CAP as u64)
                .time_to_live(Duration::from_secs(120))
                .build_with_hasher(FxBuildHasher),
        )),
    ]
}

/// Fills a table with ids `0..CAP` (terminal); returns the next fresh id.
fn fill(t: &dyn Table) -> u64 {
    for n in 0..CAP as u64 {
        t.insert_if_absent(key(n), n, true, None);
    }
    CAP as u64
}

/// `count` indices in `0..n` drawn from Zipf(s) (inverse CDF).
fn zipf(n: usize, s: f64, count: usize, rng: &mut SmallRng) -> Vec<u32> {
    let mut cdf = Vec::with_capacity(n);
    let mut sum = 0.0;
    for i in 1..=n {
        sum += 1.0 / (i as f64).powf(s);
        cdf.push(sum);
    }
    (0..count)
        .map(|_| {
            let u = rng.random::<f64>() * sum;
            cdf.partition_point(|&c| c < u) as u32
        })
        .collect()
}

const SAMPLES: usize = 1 << 20;

fn lookups(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(1);
    let uniform: Vec<u32> = (0..SAMPLES)
        .map(|_| rng.random_range(0..CAP as u32))
        .collect();
    // Zipf ranks map to scattered ids.
    let ranks = zipf(CAP, 0.99, SAMPLES, &mut rng);
    let perm: Vec<u32> = {
        let mut p: Vec<u32> = (0..CAP as u32).collect();
        for i in (1..p.len()).rev() {
            p.swap(i, rng.random_range(0..=i));
        }
        p
    };
    let zipfian: Vec<u32> = ranks.iter().map(|&r| perm[r as usize]).collect();
    let keys: Vec<DedupKey> = (0..CAP as u64).map(key).collect();
    for (group, idx) in [("lookup_uniform", &uniform), ("lookup_zipf", &zipfian)] {
        let mut g = c.benchmark_group(group);
        for t in tables() {
            fill(&*t);
            let mut i = 0usize;
            g.bench_function(t.name(), |b| {
                b.iter(|| {
                    i = (i + 1) & (SAMPLES - 1);
                    black_box(t.get(&keys[idx[i] as usize]))
                })
            });
        }
        g.finish();
    }
}

fn inserts(c: &mut Criterion) {
    let mut g = c.benchmark_group("insert_at_capacity");
    for t in tables() {
        let mut next = fill(&*t);
        g.bench_function(t.name(), |b| {
            b.iter(|| {
                let oldest = key(next - CAP as u64);
                black_box(t.insert_if_absent(key(next), next, true, Some(oldest)));
                next += 1;
            })
        });
    }
    g.finish();
}

fn storms(c: &mut Criterion) {
    for threads in [1usize, 2] {
        let mut g = c.benchmark_group(format!("storm_{threads}t"));
        for t in tables() {
            let next = AtomicU64::new(fill(&*t));
            g.bench_function(t.name(), |b| {
                b.iter_custom(|iters| {
                    let base = next.fetch_add(iters, Ordering::Relaxed);
                    let barrier = Barrier::new(threads);
                    let t = &*t;
                    std::thread::scope(|s| {
                        let handles: Vec<_> = (0..threads)
                            .map(|_| {
                                s.spawn(|| {
                                    barrier.wait();
                                    let start = Instant::now();
                                    for n in base..base + iters {
                                        let oldest = key(n - CAP as u64);
                                        black_box(t.insert_if_absent(
                                            key(n),
                                            n,
                                            true,
                                            Some(oldest),
                                        ));
                                    }
                                    start.elapsed()
                                })
                            })
                            .collect();
                        handles
                            .into_iter()
                            .map(|h| h.join().unwrap())
                            .max()
                            .unwrap()
                    })
                })
            });
        }
        g.finish();
    }
}

fn mixed(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(2);
    // 0..90: lookup, 90..99: insert, 99: transition.
    let ops: Vec<(u8, u32)> = (0..SAMPLES)
        .map(|_| (rng.random_range(0..100u8), rng.random_range(0..CAP as u32)))
        .collect();
    let mut g = c.benchmark_group("mixed");
    for t in tables() {
        let mut next = fill(&*t);
        let mut i = 0usize;
        g.bench_function(t.name(), |b| {
            b.iter(|| {
                i = (i + 1) & (SAMPLES - 1);
                let (op, r) = ops[i];
                match op {
                    0..90 => {
                        black_box(t.get(&key(next - 1 - u64::from(r))));
                    }
                    90..99 => {
                        t.insert_if_absent(key(next), next, true, Some(key(next - CAP as u64)));
                        next += 1;
                    }
                    _ => {
                        t.insert_if_absent(key(next), next, false, Some(key(next - CAP as u64)));
                        t.finish(key(next), next);
                        next += 1;
                    }
                }
            })
        });
    }
    g.finish();
}

fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion")
}

/// Mean time per iteration (ns) of one benchmark, from criterion's output.
fn mean_ns(group: &str, name: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(name)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let at = text.find("\"mean\"")?;
    let rest = &text[at..];
    let at = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let rest = &rest[at..];
    let end = rest.find([',', '}'])?;
    rest[..end].trim().parse().ok()
}

fn report() {
    let groups = [
        "lookup_uniform",
        "lookup_zipf",
        "insert_at_capacity",
        "storm_1t",
        "storm_2t",
        "mixed",
    ];
    let names = [
        "askpool",
        "mutex_fifo",
        "dashmap",
        "papaya",
        "quick_cache",
        "moka_ttl",
    ];
    println!("\nmean ns/op (storm_2t: per op per thread), and askpool / baseline (<= 1.0: askpool as fast or faster)");
    print!("{:<20}", "workload");
    for n in names {
        print!("{n:>14}");
    }
    println!();
    for g in groups {
        print!("{g:<20}");
        for n in names {
            match mean_ns(g, n) {
                Some(ns) => print!("{ns:>14.1}"),
                None => print!("{:>14}", "-"),
            }
        }
        println!();
        print!("{:<20}", "  ratio");
        let ours = mean_ns(g, "askpool");
        for n in names {
            match (ours, mean_ns(g, n)) {
                (Some(a), Some(b)) => print!("{:>14.2}", a / b),
                _ => print!("{:>14}", "-"),
            }
        }
        println!();
    }
    print!("{:<20}", "2t/1t throughput");
    for n in names {
        match (mean_ns("storm_1t", n), mean_ns("storm_2t", n)) {
            // Two threads each do one op in the 2t time.
            (Some(one), Some(two)) => print!("{:>14.2}", 2.0 * one / two),
            _ => print!("{:>14}", "-"),
        }
    }
    println!();
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .output_directory(&criterion_dir())
        .configure_from_args();
    lookups(&mut c);
    inserts(&mut c);
    storms(&mut c);
    mixed(&mut c);
    c.final_summary();
    report();
}
