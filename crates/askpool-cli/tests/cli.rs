//! The `askpool` binary as an operator meets it: help, bad flags, a real
//! simulation with a JSON summary, and a failing check's exit status.

use std::process::{Command, Output};

fn askpool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_askpool"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_describes_every_subcommand_and_flag() {
    let out = askpool(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in ["simulate", "check"] {
        assert!(help.contains(word), "{help}");
    }
    let out = askpool(&["simulate", "--help"]);
    let help = text(&out.stdout);
    for flag in [
        "--asks",
        "--drop",
        "--dup",
        "--reorder",
        "--delay-ms",
        "--workers",
        "--seed",
        "--json",
        "--lose-reply",
        "--outage-every-ms",
        "--deadline-slack-ms",
    ] {
        assert!(help.contains(flag), "simulate --help lacks {flag}:\n{help}");
    }
    let out = askpool(&["check", "--help"]);
    let help = text(&out.stdout);
    for flag in ["--seeds", "--asks", "--first-seed", "--sabotage"] {
        assert!(help.contains(flag), "check --help lacks {flag}:\n{help}");
    }
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    for (args, says) in [
        (&["simulate", "--drop", "1.5"][..], "not a probability"),
        (&["simulate", "--delay-ms", "50..10"][..], "runs backwards"),
        (
            &["simulate", "--delay-ms", "soon"][..],
            "not a whole number",
        ),
        (&["simulate", "--asks", "0"][..], "asks must be at least 1"),
        (
            &["simulate", "--pools", "4000000000"][..],
            "pools must be at most 256",
        ),
        (
            &["simulate", "--callers", "257"][..],
            "callers must be at most 256",
        ),
        (&["simulate", "--bogus"][..], "unexpected argument"),
        (&["frobnicate"][..], "unrecognized subcommand"),
    ] {
        let out = askpool(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn simulate_runs_the_real_runtime_and_reports_json() {
    let out = askpool(&[
        "simulate",
        "--asks",
        "3000",
        "--drop",
        "0.1",
        "--dup",
        "0.1",
        "--reorder",
        "0.1",
        "--delay-ms",
        "0..5",
        "--timeout-ms",
        "300..1000",
        "--workers",
        "4",
        "--seed",
        "42",
        // The real clock on a loaded CI machine can starve a debug build for
        // a second; deadlines are checked exactly by the paused-clock tiers.
        "--deadline-slack-ms",
        "10000",
        "--json",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let s = &report["summary"];
    assert_eq!(s["asks"], 3000);
    let ended: u64 = ["fulfilled", "failed", "timed_out", "cancelled"]
        .iter()
        .map(|k| s[k].as_u64().unwrap())
        .sum();
    assert_eq!(ended, 3000, "{s}");
    assert!(s["frames_dropped"].as_u64().unwrap() > 0);
    assert!(s["frames_duplicated"].as_u64().unwrap() > 0);
    assert!(s["retries"].as_u64().unwrap() > 0);
    assert!(s["latency_us"]["p99"].as_u64().unwrap() >= s["latency_us"]["p50"].as_u64().unwrap());
    assert_eq!(report["violations"].as_array().unwrap().len(), 0);
}

#[test]
fn a_broken_protocol_fails_the_check_with_a_reproduction() {
    let out = askpool(&[
        "check",
        "--seeds",
        "1",
        "--asks",
        "3000",
        "--first-seed",
        "5",
        "--sabotage",
        "ForgetDedup",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("0 passed, 1 failed"), "{stdout}");
    assert!(
        stdout.contains("reproduce: cargo xtask sim --first-seed 5 --seeds 1 --asks"),
        "{stdout}"
    );
}

/// Numbers clap accepts but the run cannot use: each must be a usage error
/// (status 2, a reason), never a panic with a backtrace.
#[test]
fn out_of_range_numbers_are_usage_errors_not_panics() {
    for (args, says) in [
        // The last seed would be past u64::MAX.
        (
            &[
                "check",
                "--first-seed",
                "18446744073709551615",
                "--seeds",
                "2",
                "--asks",
                "10",
            ][..],
            "first-seed",
        ),
        // More workers than a pool may have.
        (
            &["simulate", "--asks", "10", "--workers", "100000"][..],
            "workers",
        ),
        // Durations the run would overflow adding to, or wait on forever.
        (
            &[
                "simulate",
                "--asks",
                "10",
                "--timeout-ms",
                "18446744073709551615",
            ][..],
            "timeout-ms",
        ),
        (
            &[
                "simulate",
                "--asks",
                "10",
                "--delay-ms",
                "18446744073709551615",
            ][..],
            "delay-ms",
        ),
        (
            &[
                "simulate",
                "--asks",
                "10",
                "--outage-every-ms",
                "18446744073709551615",
            ][..],
            "outage-every-ms",
        ),
    ] {
        let out = askpool(args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
