//! Seeds run twice on a paused clock: the invariants must hold and the two
//! trace hashes must match. A failing seed is shrunk to the fewest asks that
//! still fail, and comes back with the command that reproduces it.

use std::sync::Arc;

use crate::checker::Violation;
use crate::config::SimConfig;
use crate::report::Summary;
use crate::workload::{run_blocking, Live};

#[derive(Clone, Debug)]
pub struct SeedResult {
    pub seed: u64,
    pub asks: u64,
    pub trace_hash: u64,
    /// What the first of the two runs counted.
    pub summary: Summary,
    pub violations: Vec<Violation>,
    /// The command that reproduces a failure (the shrunk one if shrinking
    /// found a smaller failing run).
    pub repro: Option<String>,
}

impl SeedResult {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn once(cfg: &SimConfig) -> (Summary, Vec<Violation>) {
    let report = run_blocking(cfg.clone(), Arc::new(Live::default()));
    (report.summary, report.violations)
}

/// Runs `cfg` twice; a difference in trace hashes is itself a violation.
fn twice(cfg: &SimConfig) -> (Summary, Vec<Violation>) {
    let (summary, mut violations) = once(cfg);
    let (again, _) = once(cfg);
    let (first, second) = (summary.trace_hash, again.trace_hash);
    if first != second {
        violations.push(Violation {
            invariant: "a seed reproduces exactly",
            detail: format!("trace hashes {first:016x} and {second:016x}"),
        });
    }
    (summary, violations)
}

/// Checks one seed (`cfg.paused` must be set).
pub fn check_seed(cfg: &SimConfig) -> SeedResult {
    assert!(cfg.paused, "only a paused clock reproduces a seed");
    let (summary, violations) = twice(cfg);
    let repro = (!violations.is_empty()).then(|| {
        let mut asks = cfg.asks;
        // Halve while the seed still fails with fewer asks.
        while asks > 1 {
            let smaller = SimConfig {
                asks: asks / 2,
                ..cfg.clone()
            };
            if twice(&smaller).1.is_empty() {
                break;
            }
            asks /= 2;
        }
        let sabotage = cfg
            .sabotage
            .map(|s| format!(" --sabotage {s:?}"))
            .unwrap_or_default();
        format!(
            "cargo xtask sim --first-seed {} --seeds 1 --asks {asks}{sabotage}",
            cfg.seed
        )
    });
    SeedResult {
        seed: cfg.seed,
        asks: cfg.asks,
        trace_hash: summary.trace_hash,
        summary,
        violations,
        repro,
    }
}
