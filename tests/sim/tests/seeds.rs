//! The fixed tier of `cargo xtask test`: 200 seeds x 5,000 asks, every
//! fault on, each seed run twice on a paused clock. Seeds run on two OS
//! threads (one runtime each): the machine has two cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use askpool_sim::{check_seed, SeedResult, SimConfig};

const SEEDS: u64 = 200;
const ASKS: u64 = 5_000;

#[test]
fn two_hundred_seeds_hold_every_invariant_and_reproduce() {
    let next = AtomicU64::new(1);
    let failures: Mutex<Vec<SeedResult>> = Mutex::new(Vec::new());
    let hashes: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed > SEEDS {
                    return;
                }
                let result = check_seed(&SimConfig::test_tier(seed, ASKS));
                hashes.lock().unwrap().push(result.trace_hash);
                if !result.passed() {
                    failures.lock().unwrap().push(result);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    for f in &failures {
        eprintln!("seed {} failed:", f.seed);
        for v in f.violations.iter().take(10) {
            eprintln!("  {v}");
        }
        eprintln!("  reproduce: {}", f.repro.as_deref().unwrap_or("?"));
    }
    assert!(
        failures.is_empty(),
        "{} of {SEEDS} seeds failed",
        failures.len()
    );
    // Different seeds make different runs (the seed reaches everything).
    let mut hashes = hashes.into_inner().unwrap();
    hashes.sort_unstable();
    hashes.dedup();
    assert_eq!(hashes.len() as u64, SEEDS, "two seeds gave the same trace");
}
