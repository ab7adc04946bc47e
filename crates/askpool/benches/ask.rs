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
//! skew the comparison. The figures that count come from the interleaved
//! report after it (`askpool-benchkit`: trials alternate raw, askpool and
//! untracked askpool; median of per-trial ratios), written to
//! `<target>/bench/results/ask.json` (and `ack.json`: tracked against
//! untracked asks, issue 4) for `cargo xtask bench`.
//! `ASKPOOL_BENCH_QUICK=1` skips criterion and shrinks the trials; under
//! `cargo test` everything runs once at a tiny size.

use std::hint::black_box;
use std::time::{Duration, Instant};

use askpool::{Node, NodeConfig, PoolName};
use askpool_benchkit::{interleave, Comparison, Mode, SuiteResults, Target};
use criterion::{criterion_group, Criterion};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

type RawRequest = (u64, oneshot::Sender<u64>);

/// Channel capacity of the raw baseline (a round trip keeps one message in it).
const RAW_CAPACITY: usize = 1024;
/// Round trips per trial in the interleaved report (full mode).
const RATIO_ROUND_TRIPS: u64 = 20_000;
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

/// Alternates raw, askpool and askpool-untracked trials on each flavour
/// (`askpool-benchkit`'s method) and writes the comparisons.
fn ratio_report(mode: Mode) {
    let trials = mode.trials();
    let round_trips = mode.scale(RATIO_ROUND_TRIPS);
    let mut results = SuiteResults::new("ask", mode);
    // Issue 4's ACK-tracking cost is its own suite in the report, measured
    // in the same trials.
    let mut ack = SuiteResults::new("ack", mode);
    for flavour in Flavour::ALL {
        let fixture = Fixture::new(flavour);
        let per_op = |d: Duration| d.as_nanos() as f64 / round_trips as f64;
        // One untimed pass each: tasks spawned, allocator and tables warm.
        fixture.run_raw(round_trips);
        fixture.run_ask(round_trips);
        fixture.run_ask_on(&fixture.untracked, round_trips);
        let mut raw = || per_op(fixture.run_raw(round_trips));
        let mut ask = || per_op(fixture.run_ask(round_trips));
        let mut untracked = || per_op(fixture.run_ask_on(&fixture.untracked, round_trips));
        let t = interleave(trials, &mut [&mut raw, &mut ask, &mut untracked]);
        let floor = format!("tokio mpsc+oneshot round trip ({})", flavour.name());
        results.comparisons.push(
            Comparison::time(
                format!("ask round trip, {}", flavour.name()),
                "node.ask().await",
                &t[1],
                "raw tokio mpsc+oneshot",
                &t[0],
            )
            .target(Target::at_most(TARGET_RATIO, 2))
            .floor(floor.clone())
            .note(
                "every ask does two dedup-table transitions, a pending-map entry, a deadline \
                 timer, three frames back (Ack, Read, Reply), breaker and expiry bookkeeping; \
                 the 100,000-entry reply cache misses the CPU caches on each new key",
            ),
        );
        ack.comparisons.push(
            Comparison::time(
                format!("ACK stage tracking on vs off, {}", flavour.name()),
                "tracked ask",
                &t[1],
                "untracked ask",
                &t[2],
            )
            .target(Target::at_most(TRACKING_TARGET, 4))
            .floor(floor),
        );
    }
    for r in [&mut results, &mut ack] {
        r.facts
            .push(("round trips per trial".into(), round_trips.to_string()));
        r.finish(mode);
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mode = Mode::from_env();
    if mode.criterion() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    ratio_report(mode);
}
