//! Floors: what the primitives everything is built from cost on this
//! machine, in this run. The report prints them first and shows each
//! askpool figure as a multiple of its nearest floor.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use askpool_benchkit::{interleave, Floor, Mode, SuiteResults};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

fn per_op(start: Instant, n: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / n as f64
}

fn cas(n: u64) -> f64 {
    let a = AtomicU64::new(0);
    let start = Instant::now();
    for i in 0..n {
        let _ = black_box(&a).compare_exchange(i, i + 1, Ordering::AcqRel, Ordering::Acquire);
    }
    per_op(start, n)
}

fn epoch_pin(n: u64) -> f64 {
    // A registered thread, as in the dedup table's real use.
    drop(crossbeam_epoch::pin());
    let start = Instant::now();
    for _ in 0..n {
        black_box(crossbeam_epoch::pin());
    }
    per_op(start, n)
}

fn box_alloc(n: u64) -> f64 {
    let start = Instant::now();
    for i in 0..n {
        black_box(Box::new(black_box(i)));
    }
    per_op(start, n)
}

type Raw = mpsc::Sender<(u64, oneshot::Sender<u64>)>;

fn raw_runtime(rt: &Runtime) -> Raw {
    let _guard = rt.enter();
    let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(1024);
    rt.spawn(async move {
        while let Some((m, reply)) = rx.recv().await {
            let _ = reply.send(m + 1);
        }
    });
    tx
}

fn raw_round_trips(rt: &Runtime, tx: &Raw, n: u64) -> f64 {
    let tx = tx.clone();
    let task = rt.spawn(async move {
        let start = Instant::now();
        for i in 0..n {
            let (reply_tx, reply_rx) = oneshot::channel();
            tx.send((black_box(i), reply_tx))
                .await
                .expect("worker alive");
            black_box(reply_rx.await.expect("worker replied"));
        }
        per_op(start, n)
    });
    rt.block_on(task).expect("raw loop")
}

/// Two OS threads passing a token back and forth.
struct PingPong {
    to: std_mpsc::SyncSender<u64>,
    from: std_mpsc::Receiver<u64>,
}

impl PingPong {
    fn new() -> Self {
        let (to, their_rx) = std_mpsc::sync_channel::<u64>(0);
        let (their_tx, from) = std_mpsc::sync_channel::<u64>(0);
        std::thread::spawn(move || {
            while let Ok(x) = their_rx.recv() {
                if their_tx.send(x + 1).is_err() {
                    return;
                }
            }
        });
        Self { to, from }
    }

    fn round_trips(&self, n: u64) -> f64 {
        let start = Instant::now();
        for i in 0..n {
            self.to.send(i).expect("peer alive");
            black_box(self.from.recv().expect("peer answered"));
        }
        per_op(start, n)
    }
}

fn main() {
    let mode = Mode::from_env();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let raw_current = raw_runtime(&current);
    let raw_multi = raw_runtime(&multi);
    let ping = PingPong::new();

    let tiny = mode.scale(2_000_000);
    let trips = mode.scale(40_000);
    let threads = mode.scale(20_000);
    let mut c1 = || cas(tiny);
    let mut c2 = || epoch_pin(tiny);
    let mut c3 = || box_alloc(tiny);
    let mut c4 = || raw_round_trips(&current, &raw_current, trips);
    let mut c5 = || raw_round_trips(&multi, &raw_multi, trips);
    let mut c6 = || ping.round_trips(threads);
    // One untimed pass: threads started, allocator warm.
    for c in [
        &mut c1 as &mut dyn FnMut() -> f64,
        &mut c2,
        &mut c3,
        &mut c4,
        &mut c5,
        &mut c6,
    ] {
        c();
    }
    let names = [
        "atomic CAS (uncontended)",
        "crossbeam_epoch::pin",
        "Box alloc + free",
        "tokio mpsc+oneshot round trip (current_thread)",
        "tokio mpsc+oneshot round trip (multi_thread)",
        "OS-thread ping-pong round trip",
    ];
    let trials = interleave(
        mode.trials(),
        &mut [&mut c1, &mut c2, &mut c3, &mut c4, &mut c5, &mut c6],
    );
    let mut results = SuiteResults::new("floors", mode);
    for (name, ns) in names.iter().zip(&trials) {
        results.floors.push(Floor::from_trials(*name, ns));
    }
    results.finish(mode);
}
