//! `askpool`: run the ask protocol under faults and see what it does.

mod promises;

use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use askpool_sim::{check_seed, FaultConfig, Live, RunReport, Sabotage, SimConfig};
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "askpool",
    version,
    about = "Reliable asks between callers and worker pools: fault simulation and checks",
    long_about = "Reliable asks between callers and worker pools.\n\n\
        `simulate` drives a workload through the real runtime over a network that \
        drops, duplicates, reorders and delays frames, clogs and partitions paths, \
        loses replies after execution and restarts pools; it checks every protocol \
        invariant and prints a summary. `check` runs seeds on a paused clock, twice \
        each, and prints a reproduction command for any seed that fails."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a faulty workload against the real runtime (real clock, all cores)
    /// and print a summary; exit status 1 if any invariant broke.
    Simulate(SimulateArgs),
    /// Run seeds on a paused clock, each twice: invariants must hold and both
    /// runs must give the same trace hash; exit status 1 if any seed fails.
    Check(CheckArgs),
    /// Inspect and settle durable promises in a SQLite store file.
    #[command(subcommand)]
    Promises(promises::PromisesCommand),
}

#[derive(Args)]
struct SimulateArgs {
    /// Asks to issue in total.
    #[arg(long, default_value_t = 100_000)]
    asks: u64,
    /// Probability that a frame is dropped.
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    drop: f64,
    /// Probability that a frame is duplicated.
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    dup: f64,
    /// Probability that a frame is held until the next one on its path
    /// overtakes it.
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    reorder: f64,
    /// Delay of every frame, uniform in this range of milliseconds
    /// (`A..B`, or `N` for a fixed delay; `0` for none).
    #[arg(long, default_value = "0..10", value_parser = ms_range)]
    delay_ms: Range<u64>,
    /// Probability that a handler's reply is lost after it executed.
    #[arg(long, default_value_t = 0.01, value_parser = probability)]
    lose_reply: f64,
    /// Mean milliseconds between clog / partition / restart events; 0 turns
    /// them off.
    #[arg(long, default_value_t = 500)]
    outage_every_ms: u64,
    /// How long a clog or partition lasts (milliseconds, `A..B`).
    #[arg(long, default_value = "50..300", value_parser = ms_range)]
    outage_ms: Range<u64>,
    /// Concurrent handlers per pool.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Worker pools (each its own node, restartable), at most 256.
    #[arg(long, default_value_t = 2)]
    pools: u32,
    /// Caller nodes, at most 256.
    #[arg(long, default_value_t = 4)]
    callers: u32,
    /// Distinct request ids per caller and pool (small, so ids are reused).
    #[arg(long, default_value_t = 2048)]
    ids_per_caller: u32,
    /// Asks outstanding at once.
    #[arg(long, default_value_t = 1024)]
    window: u32,
    /// Handler work time (milliseconds, `A..B`).
    #[arg(long, default_value = "0..5", value_parser = ms_range)]
    work_ms: Range<u64>,
    /// Ask timeout (milliseconds, `A..B`).
    #[arg(long, default_value = "500..3000", value_parser = ms_range)]
    timeout_ms: Range<u64>,
    /// Share of asks the caller cancels before their timeout.
    #[arg(long, default_value_t = 0.02, value_parser = probability)]
    cancel: f64,
    /// How much later than its timeout an ask may end before the run counts
    /// it as a deadline violation (milliseconds): scheduling delay on a busy
    /// machine, not protocol time.
    #[arg(long, default_value_t = 500)]
    deadline_slack_ms: u64,
    /// Seed of every random choice (the real clock still varies timing).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct CheckArgs {
    /// How many seeds.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// Asks per seed.
    #[arg(long, default_value_t = 5_000)]
    asks: u64,
    /// The first seed; the others follow it.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Threads running seeds (each seed runs on its own single-threaded,
    /// paused runtime). Default: the number of cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Break the protocol on purpose, to see the checker report it.
    #[arg(long, value_enum)]
    sabotage: Option<SabotageArg>,
    /// Print one JSON object per seed instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
#[value(rename_all = "PascalCase")]
enum SabotageArg {
    ForgeReplay,
    ForgetDedup,
    ForgeIds,
    SkipTombstones,
}

fn probability(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("`{s}` is not a probability (0 to 1)"))
    }
}

fn ms_range(s: &str) -> Result<Range<u64>, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{t}` is not a whole number of milliseconds"))
    };
    match s.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                Err(format!("`{s}`: the range runs backwards"))
            } else {
                Ok(a..b)
            }
        }
        None => {
            let n = num(s)?;
            Ok(n..n)
        }
    }
}

fn main() -> ExitCode {
    // Output piped into `head` or a pager that quits ends the process
    // quietly, as any Unix tool does, instead of a panic on the next print
    // (Rust ignores SIGPIPE, so every print would fail with EPIPE).
    #[cfg(unix)]
    // SAFETY: restoring a signal's default action, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Check(args) => check(args),
        Command::Promises(command) => promises::run(command),
    }
}

fn simulate(a: SimulateArgs) -> ExitCode {
    let cfg = SimConfig {
        seed: a.seed,
        asks: a.asks,
        callers: a.callers,
        ids_per_caller: a.ids_per_caller,
        pools: a.pools,
        workers: a.workers,
        window: a.window,
        work_ms: a.work_ms,
        timeout_ms: a.timeout_ms,
        cancel: a.cancel,
        mismatch: 0.02,
        handler_error: 0.02,
        watch_stages: 0.1,
        await_later: 0.1,
        faults: FaultConfig {
            drop: a.drop,
            duplicate: a.dup,
            reorder: a.reorder,
            delay_ms: a.delay_ms,
            lose_reply: a.lose_reply,
            event_every_ms: a.outage_every_ms,
            clog_weight: 2,
            partition_weight: 1,
            restart_weight: 1,
            outage_ms: a.outage_ms,
        },
        paused: false,
        deadline_slack: Duration::from_millis(a.deadline_slack_ms),
        sabotage: None,
    };
    if let Err(e) = cfg.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let live = Arc::new(Live::default());
    let bar = progress_bar(a.asks, a.quiet || a.json);
    let ticker = {
        let bar = bar.clone();
        let live = Arc::clone(&live);
        std::thread::spawn(move || loop {
            let ended = live.ended.load(Ordering::Relaxed);
            bar.set_position(ended);
            bar.set_message(format!(
                "ok {}  failed {}  timed out {}  cancelled {}  in flight {}",
                live.fulfilled.load(Ordering::Relaxed),
                live.failed.load(Ordering::Relaxed),
                live.timed_out.load(Ordering::Relaxed),
                live.cancelled.load(Ordering::Relaxed),
                live.issued.load(Ordering::Relaxed) - ended,
            ));
            if bar.is_finished() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        })
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(askpool_sim::run(cfg, live));
    bar.finish_and_clear();
    let _ = ticker.join();
    print_report(&report, a.json);
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn progress_bar(len: u64, hidden: bool) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if hidden {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:30}] {human_pos}/{human_len} {per_sec:>12}  {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

fn print_report(report: &RunReport, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("a report serializes")
        );
    } else {
        print!("{}", report.table());
    }
}

fn check(a: CheckArgs) -> ExitCode {
    if a.seeds == 0 || a.asks == 0 {
        eprintln!("error: --seeds and --asks must be at least 1");
        return ExitCode::from(2);
    }
    // Seeds are numbered up from the first: the last must be a u64 too.
    if a.first_seed.checked_add(a.seeds - 1).is_none() {
        eprintln!(
            "error: --first-seed {} with --seeds {} runs past the last seed, {}",
            a.first_seed,
            a.seeds,
            u64::MAX
        );
        return ExitCode::from(2);
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let sabotage = a.sabotage.map(|s| match s {
        SabotageArg::ForgeReplay => Sabotage::ForgeReplay,
        SabotageArg::ForgetDedup => Sabotage::ForgetDedup,
        SabotageArg::ForgeIds => Sabotage::ForgeIds,
        SabotageArg::SkipTombstones => Sabotage::SkipTombstones,
    });
    let bar = progress_bar(a.seeds, a.json);
    let next = std::sync::atomic::AtomicU64::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.min(a.seeds as usize) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.seeds {
                    return;
                }
                let cfg = SimConfig {
                    sabotage,
                    ..SimConfig::test_tier(a.first_seed + i, a.asks)
                };
                let result = check_seed(&cfg);
                if !result.passed() {
                    bar.println(format!(
                        "seed {} FAILED: {}\n  reproduce: {}",
                        result.seed,
                        result.violations[0],
                        result.repro.as_deref().unwrap_or("?")
                    ));
                }
                bar.inc(1);
                results.lock().expect("not poisoned").push(result);
            });
        }
    });
    bar.finish_and_clear();
    let mut results = results.into_inner().expect("not poisoned");
    results.sort_by_key(|r| r.seed);
    let failed: Vec<_> = results.iter().filter(|r| !r.passed()).collect();
    if a.json {
        for r in &results {
            let line = serde_json::json!({
                "seed": r.seed,
                "asks": r.asks,
                "passed": r.passed(),
                "trace_hash": format!("{:016x}", r.trace_hash),
                "violations": r.violations,
                "repro": r.repro,
            });
            println!("{line}");
        }
    } else {
        println!(
            "{} seeds x {} asks: {} passed, {} failed",
            results.len(),
            a.asks,
            results.len() - failed.len(),
            failed.len()
        );
        for r in &failed {
            println!("seed {}:", r.seed);
            for v in r.violations.iter().take(10) {
                println!("  {v}");
            }
            println!("  reproduce: {}", r.repro.as_deref().unwrap_or("?"));
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
