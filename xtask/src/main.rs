//! `cargo xtask <command>`: the project's build, test, bench and demo entry
//! points, runnable on a fresh machine with nothing but a Rust toolchain.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use clap::{Parser, Subcommand};

mod bench;
mod bench_build;
mod bench_host;
mod bench_notes;
mod kotlin;
mod node;
mod python;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "askpool build, test, bench and demo tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build every Rust crate of the workspace.
    Build,
    /// fmt check, clippy -D warnings, and every test of the workspace.
    Test {
        /// Also run the slow tiers: larger loom bounds, the 10-million-entry
        /// memory test, a million-ask simulation, Miri where a nightly
        /// toolchain has it.
        #[arg(long)]
        slow: bool,
    },
    /// Run the demo: `askpool simulate` with moderate faults, the
    /// dead-letter / metrics walkthrough, then durable asks surviving a
    /// caller restart on a SQLite file (`target/demo/promises.db`).
    Demo,
    /// Run the deterministic fault simulation over many seeds (release
    /// build, paused clock, each seed twice).
    Sim {
        /// How many seeds.
        #[arg(long, default_value_t = 200)]
        seeds: u64,
        /// Asks per seed.
        #[arg(long, default_value_t = 5_000)]
        asks: u64,
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        first_seed: u64,
        /// Break the protocol on purpose (ForgeReplay, ForgetDedup, ForgeIds,
        /// SkipTombstones) to see the checker catch it.
        #[arg(long)]
        sabotage: Option<String>,
    },
    /// Run every benchmark suite (or one) and write target/bench/report.md
    /// and report.json: ratios to baselines measured in the same run, floors,
    /// targets met or missed. A run of every suite also regenerates the
    /// README's performance section.
    Bench {
        /// One suite only: floors, dedup, ask, ... (default: all).
        suite: Option<String>,
        /// Smaller sizes (still >= 7 interleaved trials): under 5 minutes.
        #[arg(long)]
        quick: bool,
        /// Measure nothing: rewrite report.md (and the README's section,
        /// if the last run was of every suite) from the last run's
        /// report.json with the bench notes as they are now.
        #[arg(long, conflicts_with_all = ["suite", "quick"])]
        notes_only: bool,
    },
    /// Build the Python wheel (target/wheels) and install it into .venv.
    Python,
    /// The Kotlin binding: build the uniffi cdylib, generate its Kotlin,
    /// run the JUnit tests with Maven.
    Kotlin {
        /// Asks of the leak check (default 100,000).
        #[arg(long)]
        leak_asks: Option<u64>,
    },
    /// What CI runs: the full test command.
    Ci,
    /// Install the Node package's tools (`npm ci`) and build its addon.
    Node,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _lock = match lock_checkout() {
        Ok(lock) => lock,
        Err(message) => {
            eprintln!("xtask: {message}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Task::Build => cargo(&["build", "--workspace", "--all-targets"]),
        Task::Test { slow } => test(slow),
        Task::Demo => demo(),
        Task::Sim {
            seeds,
            asks,
            first_seed,
            sabotage,
        } => sim(seeds, asks, first_seed, sabotage.as_deref()),
        Task::Bench {
            notes_only: true, ..
        } => bench::renote(),
        Task::Bench { suite, quick, .. } => bench::run(suite.as_deref(), quick),
        Task::Python => python::build().map(|_| ()),
        Task::Kotlin { leak_asks } => kotlin::test(leak_asks),
        Task::Ci => test(false),
        Task::Node => node::build(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Two tasks at once in one checkout would rebuild and reinstall the same
/// venv, node_modules and wheels under each other (a half-written venv
/// fails the other's tests in ways that say nothing about the code): the
/// second waits for the first, and says so. The lock is the OS's, released
/// when the process ends however it ends.
fn lock_checkout() -> Result<std::fs::File, String> {
    let dir = root().join("target");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join("xtask.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!("xtask: another cargo xtask runs in this checkout; waiting for it to end");
            file.lock()
                .map_err(|e| format!("locking {}: {e}", path.display()))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("locking {}: {e}", path.display()))
        }
    }
    Ok(file)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn run(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    exec(Path::new(program), args, &root(), envs)
}

/// Runs `program` in `dir` with `envs` added, echoing the command and its
/// status and time; an error unless it exits successfully.
/// Whether `program args` starts and exits with success (output discarded).
pub(crate) fn succeeds(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(crate) fn exec(
    program: &Path,
    args: &[&str],
    dir: &Path,
    envs: &[(&str, &str)],
) -> Result<(), String> {
    let shown = format!("{} {}", program.display(), args.join(" "));
    eprintln!("\n==> {shown}");
    let started = Instant::now();
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(dir)
        .status()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    eprintln!("<== {shown}: {status} in {:.1?}", started.elapsed());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_with_env(args, &[])
}

fn cargo_with_env(args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(&cargo, args, envs)
}

fn test(slow: bool) -> Result<(), String> {
    let started = Instant::now();
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // --all-targets runs unit, integration and example tests, and runs each
    // criterion bench once in its test mode; doc tests need their own pass.
    cargo(&["test", "--workspace", "--all-targets"])?;
    cargo(&["test", "--workspace", "--doc"])?;
    loom(slow)?;
    python::test()?;
    node::test()?;
    kotlin::test(None)?;
    if slow {
        // The long tiers: 10 million entries through the capped dedup
        // table, and anything else marked #[ignore] as slow.
        cargo(&["test", "--workspace", "--release", "--", "--ignored"])?;
        // One seed of a million asks through every fault.
        sim(1, 1_000_000, 1, None)?;
        miri()?;
    }
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if skipped.is_empty() {
        eprintln!("\nxtask test: all green in {:.1?}", started.elapsed());
    } else {
        eprintln!(
            "\nxtask test: green in {:.1?}, with {} part(s) skipped:",
            started.elapsed(),
            skipped.len()
        );
        for part in skipped.iter() {
            eprintln!("  - skipped {part}");
        }
    }
    Ok(())
}

/// Parts of a run skipped for want of something on this machine, named
/// again in its last lines, where a green run is read.
static SKIPPED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Skips `part` of this run, saying why now and again at its end.
pub(crate) fn skipped(part: String) {
    eprintln!("\nxtask: skipping {part}");
    SKIPPED.lock().unwrap_or_else(|e| e.into_inner()).push(part);
}

/// The loom models of the dedup table. crossbeam's loom support needs its
/// own cfg too; a separate target dir keeps these flags from invalidating
/// the normal build.
fn loom(slow: bool) -> Result<(), String> {
    let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = root().join("target/loom");
    let target = target.to_string_lossy();
    let mut envs = vec![
        ("RUSTFLAGS", "--cfg loom --cfg crossbeam_loom"),
        ("CARGO_TARGET_DIR", target.as_ref()),
    ];
    if slow {
        envs.push(("ASKPOOL_LOOM_SLOW", "1"));
    }
    run(
        &cargo_bin,
        &["test", "-p", "askpool-dedup", "--test", "loom", "--release"],
        &envs,
    )
}

/// Miri over the dedup table's unsafe code, where a nightly toolchain with
/// miri is installed (`rustup toolchain install nightly --component miri`).
/// Tree Borrows: crossbeam-epoch itself trips Stacked Borrows upstream.
fn miri() -> Result<(), String> {
    let has_miri = Command::new("cargo")
        .args(["+nightly", "miri", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_miri {
        skipped("miri: no nightly toolchain with miri here".into());
        return Ok(());
    }
    let target = root().join("target/miri");
    let target = target.to_string_lossy();
    let envs = [
        ("MIRIFLAGS", "-Zmiri-tree-borrows -Zmiri-ignore-leaks"),
        ("CARGO_TARGET_DIR", target.as_ref()),
    ];
    for test in [&["--lib"][..], &["--test", "exactly_once"][..]] {
        let mut args = vec!["+nightly", "miri", "test", "-p", "askpool-dedup"];
        args.extend_from_slice(test);
        run("cargo", &args, &envs)?;
    }
    Ok(())
}

/// Runs the `askpool` binary (release build) with `args`.
fn askpool_cli(args: &[&str]) -> Result<(), String> {
    let mut all = vec!["run", "--release", "--quiet", "-p", "askpool-cli", "--"];
    all.extend_from_slice(args);
    cargo(&all)
}

fn demo() -> Result<(), String> {
    askpool_cli(&[
        "simulate",
        "--asks",
        "50000",
        "--drop",
        "0.05",
        "--dup",
        "0.05",
        "--reorder",
        "0.05",
        "--delay-ms",
        "0..20",
        "--workers",
        "4",
        "--seed",
        "42",
    ])?;
    cargo(&[
        "run",
        "--release",
        "--quiet",
        "-p",
        "askpool-tests",
        "--example",
        "demo",
    ])?;
    // Durable asks on the embedded store, a SQLite file that outlives the
    // caller, then that file as the CLI shows it.
    let db = root().join("target/demo/promises.db");
    let db = db.to_string_lossy();
    cargo(&[
        "run",
        "--release",
        "--quiet",
        "-p",
        "askpool-promises",
        "--example",
        "restart",
        "--",
        db.as_ref(),
    ])?;
    askpool_cli(&["promises", "list", "--db", db.as_ref()])
}

fn sim(seeds: u64, asks: u64, first_seed: u64, sabotage: Option<&str>) -> Result<(), String> {
    let (seeds, asks, first_seed) = (seeds.to_string(), asks.to_string(), first_seed.to_string());
    let mut args = vec![
        "check",
        "--seeds",
        &seeds,
        "--asks",
        &asks,
        "--first-seed",
        &first_seed,
    ];
    if let Some(s) = sabotage {
        args.extend(["--sabotage", s]);
    }
    askpool_cli(&args)
}
