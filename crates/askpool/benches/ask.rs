//! Ask round trip: askpool against a raw tokio mpsc + oneshot baseline.
//!
//! Both sides do the same thing from the caller's point of view: hand a `u64`
//! to one worker task and await `u64 + 1` back.
//!
//! - `raw_mpsc_oneshot`: the worker owns an `mpsc::Receiver<(u64,
//!   oneshot::Sender<u64>)>`; a round trip is `send` + await the oneshot.
//! - `askpool_ask`: a `Node<u64, u64>` with a handler pool of concurrency 1;
//!   a round trip is `node.ask("p", i).await`.
//!
//! Each runs on a current_thread runtime and on a multi_thread runtime with
//! 2 workers. The timed loop runs inside one spawned task per sample
//! (`iter_custom`), so neither side pays a `block_on` per iteration and the
//! caller is a runtime task as in real use.
//!
//! Criterion runs benchmarks one after another, so a noisy shared machine can
//! skew the comparison. After criterion, an interleaved report runs raw and
//! askpool trials alternately and prints the median per-trial ratio
//! askpool/raw per runtime flavour; the same lines go to
//! `<target>/bench/ask_ratios.txt`.
//!
//! `cargo bench -p askpool --bench ask -- --test` runs everything once and
//! shrinks the ratio report to 2 trials of 1,000 round trips.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use askpool::{Node, NodeConfig, PoolName};
use criterion::{criterion_group, Criterion};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

type RawRequest = (u64, oneshot::Sender<u64>);

/// Channel capacity of the raw baseline (a round trip keeps one message in it).
const RAW_CAPACITY: usize = 1024;
/// Round trips per trial, trials per flavour in the interleaved report.
const RATIO_ROUND_TRIPS: u64 = 20_000;
const RATIO_TRIALS: usize = 9;
/// What `--test` runs instead.
const TEST_ROUND_TRIPS: u64 = 1_000;
const TEST_TRIALS: usize = 2;
/// The ratio the report compares against.
const TARGET_RATIO: f64 = 1.5;
/// Issue 4: stage tracking on costs at most 15 % over tracking off.
const TRACKING_TARGET: f64 = 1.15;

#[derive(Clone, Copy)]
enum Flavour {
    CurrentThread,
    MultiThread,
}

impl Flavour {
    const ALL: [Flavour; 2] = [Flavour::CurrentThread, Flavour::MultiThread];

    fn name(self) -> &'static str {
        match self {
            Flavour::CurrentThread => "current_thread",
            Flavour::MultiThread => "multi_thread",
        }
    }

    fn runtime(self) -> Runtime {
        let mut builder = match self {
            Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Flavour::MultiThread => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(2);
                b
            }
        };
        builder.enable_all().build().expect("tokio runtime")
    }
}

/// Both systems under test, set up on one runtime.
struct Fixture {
    rt: Runtime,
    raw: mpsc::Sender<RawRequest>,
    node: Node<u64, u64>,
    /// The same node without ACK stage tracking (issue 4's baseline).
    untracked: Node<u64, u64>,
}

impl Fixture {
    fn new(flavour: Flavour) -> Self {
        let rt = flavour.runtime();
        let (raw, node) = {
            // Both spawn their worker task onto `rt`.
            let _guard = rt.enter();
            let (tx, mut rx) = mpsc::channel::<RawRequest>(RAW_CAPACITY);
            rt.spawn(async move {
                while let Some((m, reply)) = rx.recv().await {
                    let _ = reply.send(m + 1);
                }
            });
            let node: Node<u64, u64> = Node::new();
            let untracked: Node<u64, u64> = Node::with_config(NodeConfig {
                track_stages: false,
                ..NodeConfig::default()
            });
            for n in [&node, &untracked] {
                n.pool("p")
                    .concurrency(1)
                    .handler(|m, _ctx| async move { Ok(m + 1) })
                    .expect("handler pool");
            }
            (tx, (node, untracked))
        };
        let (raw, (node, untracked)) = (raw, node);
        Self {
            rt,
            raw,
            node,
            untracked,
        }
    }

    /// `n` raw round trips in one task on the runtime; the time they took.
    fn run_raw(&self, n: u64) -> Duration {
        let tx = self.raw.clone();
        let task = self.rt.spawn(async move {
            let start = Instant::now();
            for i in 0..n {
                let (reply_tx, reply_rx) = oneshot::channel();
                tx.send((black_box(i), reply_tx))
                    .await
                    .expect("raw worker alive");
                let r = reply_rx.await.expect("raw worker replied");
                debug_assert_eq!(r, i + 1);
                black_box(r);
            }
            start.elapsed()
        });
        self.rt.block_on(task).expect("raw loop")
    }

    /// `n` asks in one task on the runtime; the time they took.
    fn run_ask(&self, n: u64) -> Duration {
        self.run_ask_on(&self.node, n)
    }

    fn run_ask_on(&self, node: &Node<u64, u64>, n: u64) -> Duration {
        let node = node.clone();
        let task = self.rt.spawn(async move {
            // The pool name is built once, as a long-lived caller would.
            let pool = PoolName::new("p");
            let start = Instant::now();
            for i in 0..n {
                let r = node.ask(&pool, black_box(i)).await.unwrap();
                debug_assert_eq!(r, i + 1);
                black_box(r);
            }
            start.elapsed()
        });
        self.rt.block_on(task).expect("ask loop")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Stop the pool's workers while the runtime still runs them.
        self.node.shutdown();
        self.untracked.shutdown();
    }
}

fn bench_round_trip(c: &mut Criterion) {
    for flavour in Flavour::ALL {
        let fixture = Fixture::new(flavour);
        let mut group = c.benchmark_group(format!("ask_round_trip/{}", flavour.name()));
        group.bench_function("raw_mpsc_oneshot", |b| {
            b.iter_custom(|iters| fixture.run_raw(iters))
        });
        group.bench_function("askpool_ask", |b| {
            b.iter_custom(|iters| fixture.run_ask(iters))
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench_round_trip
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// `<target>/bench`: `$CARGO_TARGET_DIR` (relative paths taken from the
/// workspace root), else the workspace's `target`.
fn report_dir() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let workspace = manifest.join("..").join("..");
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

/// Alternates raw and askpool trials on each flavour and reports the median
/// per-trial ratio askpool/raw: robust to load that comes and goes.
fn ratio_report() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    // `cargo bench` passes --bench; `cargo test` (and criterion's --test)
    // runs the binary as a smoke test: a small report is enough there.
    let test_mode = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    let (trials, round_trips) = if test_mode {
        (TEST_TRIALS, TEST_ROUND_TRIPS)
    } else {
        (RATIO_TRIALS, RATIO_ROUND_TRIPS)
    };

    let mut lines = Vec::new();
    for flavour in Flavour::ALL {
        let fixture = Fixture::new(flavour);
        // One untimed pass each: tasks spawned, allocator and tables warm.
        fixture.run_raw(round_trips);
        fixture.run_ask(round_trips);

        fixture.run_ask_on(&fixture.untracked, round_trips);

        let mut ratios = Vec::with_capacity(trials);
        let mut tracking = Vec::with_capacity(trials);
        let mut raw_ns = Vec::with_capacity(trials);
        let mut ask_ns = Vec::with_capacity(trials);
        for _ in 0..trials {
            let raw = fixture.run_raw(round_trips);
            let ask = fixture.run_ask(round_trips);
            let untracked = fixture.run_ask_on(&fixture.untracked, round_trips);
            ratios.push(ask.as_secs_f64() / raw.as_secs_f64());
            tracking.push(ask.as_secs_f64() / untracked.as_secs_f64());
            raw_ns.push(raw.as_nanos() as f64 / round_trips as f64);
            ask_ns.push(ask.as_nanos() as f64 / round_trips as f64);
        }
        for v in [&mut ratios, &mut tracking, &mut raw_ns, &mut ask_ns] {
            v.sort_by(f64::total_cmp);
        }
        let tracking_line = format!(
            "RATIO ask_round_trip/{} tracked/untracked median={:.2} min={:.2} max={:.2} \
             (target <= {TRACKING_TARGET}) trials={trials} round_trips={round_trips}",
            flavour.name(),
            median(&tracking),
            tracking[0],
            tracking[tracking.len() - 1],
        );
        let line = format!(
            "RATIO ask_round_trip/{} askpool/raw median={:.2} min={:.2} max={:.2} \
             (target <= {TARGET_RATIO}) raw_median={:.0}ns askpool_median={:.0}ns \
             trials={trials} round_trips={round_trips}",
            flavour.name(),
            median(&ratios),
            ratios[0],
            ratios[ratios.len() - 1],
            median(&raw_ns),
            median(&ask_ns),
        );
        println!("{line}");
        println!("{tracking_line}");
        lines.push(line);
        lines.push(tracking_line);
    }

    let dir = report_dir();
    let path = dir.join("ask_ratios.txt");
    let written =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, lines.join("\n") + "\n"));
    match written {
        Ok(()) => println!("ratios written to {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio_report();
}
