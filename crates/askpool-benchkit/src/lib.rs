//! The method every askpool benchmark shares, so one report can hold them
//! all (`cargo xtask bench`).
//!
//! - Candidates are interleaved within each trial (A B A B ..., the start
//!   rotating from trial to trial), so load that comes and goes on a shared
//!   machine hits both sides alike.
//! - A comparison is the median of the per-trial ratios, with the spread
//!   (min..max) beside it; at least [`MIN_TRIALS`] trials.
//! - Each suite writes `<target>/bench/results/<suite>.json` in the schema
//!   of [`SuiteResults`]; host-language suites (Python, Node, Kotlin) write
//!   the same schema, and xtask merges every file into the report.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Fewest trials a reported comparison may rest on.
pub const MIN_TRIALS: usize = 7;

/// How a benchmark binary was asked to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Under `cargo test` (no `--bench`): run everything once, tiny sizes,
    /// write no results.
    Smoke,
    /// `ASKPOOL_BENCH_QUICK=1`: the full method with smaller sizes.
    Quick,
    Full,
}

impl Mode {
    pub fn from_env() -> Self {
        let args: Vec<String> = std::env::args().collect();
        if !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test") {
            Mode::Smoke
        } else if std::env::var_os("ASKPOOL_BENCH_QUICK").is_some_and(|v| v == "1") {
            Mode::Quick
        } else {
            Mode::Full
        }
    }

    pub fn trials(self) -> usize {
        match self {
            Mode::Smoke => 2,
            Mode::Quick => MIN_TRIALS,
            Mode::Full => 9,
        }
    }

    /// Scales an iteration count: full size, a quarter when quick, a
    /// hundredth (at least 1) as a smoke test.
    pub fn scale(self, n: u64) -> u64 {
        match self {
            Mode::Smoke => (n / 100).max(1),
            Mode::Quick => (n / 4).max(1),
            Mode::Full => n,
        }
    }

    /// Whether criterion's own (sequential, slower) runs should happen too.
    pub fn criterion(self) -> bool {
        self == Mode::Full
    }
}

/// Runs `trials` trials; in each, every candidate once (the order rotating
/// per trial). Each candidate returns its time per operation (ns). Returns
/// the per-trial figures of each candidate.
pub fn interleave(trials: usize, candidates: &mut [&mut dyn FnMut() -> f64]) -> Vec<Vec<f64>> {
    let n = candidates.len();
    let mut out = vec![Vec::with_capacity(trials); n];
    for t in 0..trials {
        for k in 0..n {
            let i = (t + k) % n;
            let ns = (candidates[i])();
            out[i].push(ns);
        }
    }
    out
}

pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Which way a target points.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Cmp {
    #[serde(rename = "<=")]
    AtMost,
    #[serde(rename = ">=")]
    AtLeast,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    pub op: Cmp,
    pub value: f64,
    /// The issue that set it.
    pub issue: u32,
}

impl Target {
    pub fn at_most(value: f64, issue: u32) -> Self {
        Self {
            op: Cmp::AtMost,
            value,
            issue,
        }
    }
    pub fn at_least(value: f64, issue: u32) -> Self {
        Self {
            op: Cmp::AtLeast,
            value,
            issue,
        }
    }
    pub fn met_by(&self, ratio: f64) -> bool {
        match self.op {
            Cmp::AtMost => ratio <= self.value,
            Cmp::AtLeast => ratio >= self.value,
        }
    }
}

/// askpool against a baseline on one workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub workload: String,
    /// What was measured on the askpool side, and its median (ns per op).
    pub askpool: String,
    pub askpool_ns: f64,
    pub baseline: String,
    pub baseline_ns: f64,
    /// Median of the per-trial ratios askpool / baseline (time per op), or
    /// of throughput ratios where the target says so (`unit`).
    pub ratio: f64,
    pub min: f64,
    pub max: f64,
    pub trials: usize,
    /// `time` (ratio of ns per op: lower is better) or `throughput`.
    pub unit: String,
    pub target: Option<Target>,
    /// The floor this figure is compared with in the report.
    pub floor: Option<String>,
    /// Where the time goes, when a target is missed.
    pub note: Option<String>,
}

impl Comparison {
    /// A time comparison from per-trial ns/op of both sides (same trials).
    pub fn time(
        workload: impl Into<String>,
        askpool: impl Into<String>,
        ours: &[f64],
        baseline: impl Into<String>,
        theirs: &[f64],
    ) -> Self {
        let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
        Self {
            workload: workload.into(),
            askpool: askpool.into(),
            askpool_ns: median(ours),
            baseline: baseline.into(),
            baseline_ns: median(theirs),
            ratio: median(&ratios),
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            trials: ratios.len(),
            unit: "time".into(),
            target: None,
            floor: None,
            note: None,
        }
    }

    /// A throughput comparison (ratio = baseline time / askpool time per
    /// op, higher is better), e.g. two threads against one.
    pub fn throughput(
        workload: impl Into<String>,
        askpool: impl Into<String>,
        ours: &[f64],
        baseline: impl Into<String>,
        theirs: &[f64],
    ) -> Self {
        let mut c = Self::time(workload, askpool, ours, baseline, theirs);
        let ratios: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| b / a).collect();
        c.ratio = median(&ratios);
        c.min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        c.max = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        c.unit = "throughput".into();
        c
    }

    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }
    pub fn floor(mut self, floor: impl Into<String>) -> Self {
        self.floor = Some(floor.into());
        self
    }
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    pub fn passed(&self) -> Option<bool> {
        self.target.map(|t| t.met_by(self.ratio))
    }

    /// One line for a terminal.
    pub fn line(&self) -> String {
        let verdict = match (self.target, self.passed()) {
            (Some(t), Some(ok)) => format!(
                "target {} {} (issue {}): {}",
                match t.op {
                    Cmp::AtMost => "<=",
                    Cmp::AtLeast => ">=",
                },
                t.value,
                t.issue,
                if ok { "met" } else { "MISSED" }
            ),
            _ => "no target".into(),
        };
        format!(
            "{:<48} {:>8.2}x  ({:.2}..{:.2}, {} trials)  {} {:.0} ns vs {} {:.0} ns  {verdict}",
            self.workload,
            self.ratio,
            self.min,
            self.max,
            self.trials,
            self.askpool,
            self.askpool_ns,
            self.baseline,
            self.baseline_ns
        )
    }
}

/// A floor: the cost of a primitive everything else is built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Floor {
    pub name: String,
    pub ns: f64,
    pub min: f64,
    pub max: f64,
}

impl Floor {
    pub fn from_trials(name: impl Into<String>, ns: &[f64]) -> Self {
        Self {
            name: name.into(),
            ns: median(ns),
            min: ns.iter().copied().fold(f64::INFINITY, f64::min),
            max: ns.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// What one suite writes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SuiteResults {
    pub suite: String,
    pub quick: bool,
    pub comparisons: Vec<Comparison>,
    #[serde(default)]
    pub floors: Vec<Floor>,
    /// Free-form facts worth recording (versions, sizes, hasher...).
    #[serde(default)]
    pub facts: Vec<(String, String)>,
}

/// `<target>/bench`: `$CARGO_TARGET_DIR` if set (relative to the workspace
/// root), else the workspace's `target`.
pub fn bench_dir() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace.join(dir)
            }
        }
        _ => workspace.join("target"),
    };
    target.join("bench")
}

impl SuiteResults {
    pub fn new(suite: impl Into<String>, mode: Mode) -> Self {
        Self {
            suite: suite.into(),
            quick: mode == Mode::Quick,
            ..Self::default()
        }
    }

    /// Prints every line and, unless a smoke test, writes
    /// `<target>/bench/results/<suite>.json`.
    pub fn finish(&self, mode: Mode) {
        for f in &self.floors {
            println!(
                "FLOOR {:<40} {:>10.1} ns  ({:.1}..{:.1})",
                f.name, f.ns, f.min, f.max
            );
        }
        for c in &self.comparisons {
            println!("RATIO {}", c.line());
        }
        if mode == Mode::Smoke {
            return;
        }
        let dir = bench_dir().join("results");
        let path = dir.join(format!("{}.json", self.suite));
        let json = serde_json::to_string_pretty(self).expect("results serialize");
        match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, json)) {
            Ok(()) => println!("results written to {}", path.display()),
            Err(e) => eprintln!("could not write {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_rotates_the_order_and_keeps_trials_apart() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut a = || {
            order.borrow_mut().push('a');
            1.0
        };
        let mut b = || {
            order.borrow_mut().push('b');
            2.0
        };
        let out = interleave(3, &mut [&mut a, &mut b]);
        assert_eq!(out, vec![vec![1.0; 3], vec![2.0; 3]]);
        assert_eq!(order.into_inner(), vec!['a', 'b', 'b', 'a', 'a', 'b']);
    }

    #[test]
    fn a_comparison_is_the_median_of_per_trial_ratios() {
        // Trial 2 is slow for both sides: its ratio is still 2.
        let c = Comparison::time("w", "a", &[2.0, 20.0, 4.0], "b", &[1.0, 10.0, 1.0]);
        assert_eq!(c.ratio, 2.0);
        assert_eq!((c.min, c.max), (2.0, 4.0));
        let t = Comparison::throughput("w", "2t", &[1.0, 1.0, 1.0], "1t", &[1.6, 2.0, 1.5]);
        assert_eq!(t.ratio, 1.6);
        assert_eq!(
            t.clone().target(Target::at_least(1.6, 3)).passed(),
            Some(true)
        );
        assert_eq!(c.target(Target::at_most(1.5, 2)).passed(), Some(false));
    }

    #[test]
    fn results_round_trip_through_json() {
        let mut r = SuiteResults::new("s", Mode::Quick);
        r.comparisons
            .push(Comparison::time("w", "a", &[2.0], "b", &[1.0]).target(Target::at_most(1.0, 3)));
        r.floors.push(Floor::from_trials("cas", &[1.0, 2.0, 3.0]));
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"op\":\"<=\""));
        let back: SuiteResults = serde_json::from_str(&json).unwrap();
        assert_eq!(back.comparisons[0].ratio, 2.0);
        assert_eq!(back.floors[0].ns, 2.0);
        assert!(back.quick);
    }
}
