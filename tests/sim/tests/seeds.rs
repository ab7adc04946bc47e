//! The fixed tier of `cargo xtask test`: 200 seeds x 5,000 asks, every
//! fault on, each seed run twice on a paused clock. Seeds run on two OS
//! threads (one runtime each): the machine has two cores. Over all seeds,
//! every fault the tier switches on must have acted, and every situation a
//! check looks for must have occurred, or the checks proved nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use askpool_sim::{check_seed, unfired_faults, SeedResult, SimConfig, Summary};

const SEEDS: u64 = 200;
const ASKS: u64 = 5_000;

#[test]
fn two_hundred_seeds_hold_every_invariant_and_reproduce() {
    let next = AtomicU64::new(1);
    let failures: Mutex<Vec<SeedResult>> = Mutex::new(Vec::new());
    let hashes: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let total: Mutex<Summary> = Mutex::new(Summary::default());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed > SEEDS {
                    return;
                }
                let result = check_seed(&SimConfig::test_tier(seed, ASKS));
                hashes.lock().unwrap().push(result.trace_hash);
                total.lock().unwrap().add(&result.summary);
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

    // Each fault the tier switches on acted, and the checks had material.
    let total = total.into_inner().unwrap();
    eprintln!("totals over {SEEDS} seeds: {total:?}");
    let faults = SimConfig::test_tier(1, ASKS).faults;
    assert_eq!(
        unfired_faults(&faults, &total),
        Vec::<&str>::new(),
        "{total:?}"
    );
    assert!(
        total.tombstones > 0,
        "no cancel ever came before its request"
    );
    assert!(
        total.late_outcomes > 0,
        "no late outcome was ever reconciled"
    );
    assert!(total.replies_ids_checked > 0, "no reply's ids were checked");
    assert!(total.timed_out > 0 && total.dlq_size > 0, "{total:?}");
}
